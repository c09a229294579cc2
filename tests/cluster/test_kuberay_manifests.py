"""deploy/kuberay/ is checked here before a team applies it: against the schemas its objects are read with, and
against the rules that make a cluster's timings trustworthy (docs/cluster.md).

Kubernetes' own objects (the Job, the claim, and the RayCluster's pod templates) are checked against the
`kubernetes` client's models. The client's deserializer ignores keys it does not know, so every key is walked
through the models' `attribute_map` and `openapi_types`: a misspelt field (`resurces`) or a value of the wrong
kind fails, and deserializing (`ApiClient.deserialize`) catches a missing required field. Quantities are
strings in those models, so write them as strings ("4", "16Gi").

The RayCluster's own fields are not in the client. They are checked against `KUBERAY` below, copied from
KubeRay v1.5.1's ray-operator/apis/ray/v1/raycluster_types.go (the first release with the groups' `resources` and
`labels` fields); the fields this project does not set (autoscaler, fault tolerance, auth) are not walked into.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client import ApiClient

ROOT = Path(__file__).resolve().parents[2]
KUBERAY_DIR = ROOT / "deploy" / "kuberay"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
TEAM_STORE_URI = "http://mlflow.mlflow.svc.cluster.local:5000"  # the team server's Service (docs/operations.md)
SLOT = "tracker_slot"
NODE_TYPE_LABEL = "tracker_node_type"

# kind: (apiVersion, the schema it is read with)
KINDS = {
    "RayCluster": ("ray.io/v1", "RayCluster"),
    "Job": ("batch/v1", "V1Job"),
    "PersistentVolumeClaim": ("v1", "V1PersistentVolumeClaim"),
}
# KubeRay's types, by their JSON names; "object" is a field taken as it is.
KUBERAY: dict[str, dict[str, str]] = {
    "RayCluster": {"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta", "spec": "RayClusterSpec"},
    "RayClusterSpec": {
        "authOptions": "object", "suspend": "bool", "managedBy": "str", "autoscalerOptions": "object",
        "headServiceAnnotations": "dict[str, str]", "enableInTreeAutoscaling": "bool",
        "gcsFaultToleranceOptions": "object", "headGroupSpec": "HeadGroupSpec", "rayVersion": "str",
        "workerGroupSpecs": "list[WorkerGroupSpec]"},
    "HeadGroupSpec": {
        "template": "V1PodTemplateSpec", "headService": "V1Service", "enableIngress": "bool",
        "resources": "dict[str, str]", "labels": "dict[str, str]", "rayStartParams": "dict[str, str]",
        "serviceType": "str"},
    "WorkerGroupSpec": {
        "suspend": "bool", "groupName": "str", "replicas": "int", "minReplicas": "int", "maxReplicas": "int",
        "idleTimeoutSeconds": "int", "resources": "dict[str, str]", "labels": "dict[str, str]",
        "rayStartParams": "dict[str, str]", "template": "V1PodTemplateSpec", "scaleStrategy": "object",
        "numOfHosts": "int"},
}
KUBERAY_REQUIRED = {"RayClusterSpec": {"headGroupSpec"}, "HeadGroupSpec": {"template"},
                    "WorkerGroupSpec": {"groupName", "template"}}
PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,), "int": (int,), "float": (int, float), "bool": (bool,), "datetime": (str,),
    "object": (str, int, float, bool, dict, list)}


def schema_errors(value: Any, kind: str, path: str) -> list[str]:
    """What in `value` the schema `kind` does not allow, one line per fault naming where: a key that is no field
    of its model, a value of another kind, a missing required KubeRay field.

    `kind` is a `kubernetes.client` model ("V1PodSpec"), a KubeRay type of `KUBERAY`, a primitive, or
    "list[...]" / "dict[str, ...]" of those, as the client's `openapi_types` write them.
    """
    if inner := re.fullmatch(r"list\[(.+)\]", kind):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r}"]
        return [e for i, item in enumerate(value) for e in schema_errors(item, inner[1], f"{path}[{i}]")]
    if inner := re.fullmatch(r"dict\[str, (.+)\]", kind):
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping, got {value!r}"]
        return [e for key, item in value.items() for e in schema_errors(item, inner[1], f"{path}.{key}")]
    if kind in PRIMITIVES:
        fits = isinstance(value, PRIMITIVES[kind]) and not (isinstance(value, bool) and kind in ("int", "float"))
        return [] if fits else [f"{path}: expected {kind}, got {value!r}"]
    if not isinstance(value, dict):
        return [f"{path}: expected a {kind} mapping, got {value!r}"]
    if kind in KUBERAY:
        fields = KUBERAY[kind]
        errors = [f"{path}.{key}: required by {kind}" for key in sorted(KUBERAY_REQUIRED.get(kind, set()) - set(value))]
    else:
        model = getattr(kubernetes.client, kind)
        fields = {json_name: model.openapi_types[attr] for attr, json_name in model.attribute_map.items()}
        errors = []
    for key, item in value.items():
        if key not in fields:
            errors.append(f"{path}.{key}: no such field in {kind}")
        else:
            errors += schema_errors(item, fields[key], f"{path}.{key}")
    return errors


class _Response:
    """What `ApiClient.deserialize` reads: a body of JSON."""

    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body)


def deserialize(body: Any, model: str) -> Any:
    with ApiClient() as api:
        return api.deserialize(_Response(body), model)


def read(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((KUBERAY_DIR / name).read_text()) if doc is not None]


def manifests() -> dict[str, list[dict]]:
    """Every manifest of deploy/kuberay/ by file name, the kustomization left out."""
    return {path.name: read(path.name) for path in sorted(KUBERAY_DIR.glob("*.yaml"))
            if path.name != "kustomization.yaml"}


def objects() -> list[tuple[str, dict]]:
    return [(f"{name}:{doc['kind']}", doc) for name, docs in manifests().items() for doc in docs]


def raycluster() -> dict:
    (cluster,) = [doc for _, doc in objects() if doc["kind"] == "RayCluster"]
    return cluster


def workers() -> list[dict]:
    return raycluster()["spec"]["workerGroupSpecs"]


def pod_templates(doc: dict) -> list[tuple[str, dict]]:
    """The pod templates an object holds, by where they are."""
    if doc["kind"] == "RayCluster":
        spec = doc["spec"]
        return [("head", spec["headGroupSpec"]["template"])] + [
            (f"worker group {group['groupName']}", group["template"]) for group in spec.get("workerGroupSpecs", [])]
    if doc["kind"] == "Job":
        return [("job", doc["spec"]["template"])]
    return []


def containers(template: dict) -> list[dict]:
    spec = template["spec"]
    return spec.get("initContainers", []) + spec["containers"]


def ray_resources(group: dict) -> dict[str, float]:
    """The Ray resources a group's nodes offer beyond what KubeRay reads from the pod: rayStartParams' `resources`
    JSON (written '"{...}"' in KubeRay's quoting), overridden by the group's `resources` field, as KubeRay does."""
    text = group.get("rayStartParams", {}).get("resources", "{}").strip("'\"").replace('\\"', '"')
    offered = {name: float(amount) for name, amount in json.loads(text).items()}
    return offered | {name: float(amount) for name, amount in group.get("resources", {}).items()}


def qos_errors(template: dict) -> list[str]:
    """Why a pod would not be Guaranteed QoS with whole CPUs (the static CPU manager's exclusive cores): each
    container's (init containers' too) cpu and memory requests equal to its limits (requests left out default to
    the limits), and the CPUs of the containers that run Ray whole."""
    errors = []
    for container in containers(template):
        resources = container.get("resources", {})
        requests, limits = resources.get("requests", {}), resources.get("limits", {})
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                errors.append(f"{container['name']}: {name} requests {requests.get(name)} != limits {limits.get(name)}")
    for container in template["spec"]["containers"]:
        cpu = container.get("resources", {}).get("limits", {}).get("cpu")
        if not re.fullmatch(r"[1-9][0-9]*", str(cpu)):
            errors.append(f"{container['name']}: cpu {cpu!r} is not a whole number of CPUs")
    return errors


def inline_secret_errors(template: dict) -> list[str]:
    """Credentials written into a pod template rather than taken from a Secret: an env var named like one with a
    `value`, or a tracking URI holding `user:password@`."""
    errors = []
    for container in containers(template):
        for env in container.get("env", []):
            name, value = env["name"], env.get("value")
            if value is not None and re.search(r"PASSWORD|USERNAME|TOKEN|SECRET|CREDENTIAL|KEY", name):
                errors.append(f"{container['name']}: {name} is written inline")
            if value is not None and re.match(r"[a-z+]+://[^/@]*@", value):
                errors.append(f"{container['name']}: {name} holds credentials in its URI")
    return errors


@pytest.mark.parametrize(("where", "doc"), objects(), ids=[where for where, _ in objects()])
def test_every_object_matches_its_api_schema(where, doc):
    api_version, schema = KINDS[doc["kind"]]
    assert doc["apiVersion"] == api_version
    assert schema_errors(doc, schema, where) == []
    if schema.startswith("V1"):
        deserialize(doc, schema)
    for _, template in pod_templates(doc):
        assert deserialize(template, "V1PodTemplateSpec").spec.containers


@pytest.mark.parametrize(("edit", "fault"), [
    (lambda c: c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].update(
        resurces=c["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0].pop("resources")),
     "workerGroupSpecs[0].template.spec.containers[0].resurces: no such field in V1Container"),
    (lambda c: c["spec"]["workerGroupSpecs"][1]["template"]["spec"].update(nodeSelectr={"a": "b"}),
     "workerGroupSpecs[1].template.spec.nodeSelectr: no such field in V1PodSpec"),
    (lambda c: c["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"][1]["valueFrom"].update(
        secretKeyRf={}), "env[1].valueFrom.secretKeyRf: no such field in V1EnvVarSource"),
    (lambda c: c["spec"]["workerGroupSpecs"][0].update(rayStartParam={}),
     "workerGroupSpecs[0].rayStartParam: no such field in WorkerGroupSpec"),
    (lambda c: c["spec"].update(workerGroupSpec=c["spec"].pop("workerGroupSpecs")),
     "spec.workerGroupSpec: no such field in RayClusterSpec"),
    (lambda c: c["spec"]["workerGroupSpecs"][0]["rayStartParams"].update({"num-cpus": 4}),
     "rayStartParams.num-cpus: expected str, got 4"),
    (lambda c: c["spec"]["workerGroupSpecs"][0]["template"]["spec"].update(containers={"name": "x"}),
     "template.spec.containers: expected a list"),
    (lambda c: c["spec"]["workerGroupSpecs"][0].pop("groupName"), "groupName: required by WorkerGroupSpec"),
], ids=["resurces", "nodeSelectr", "secretKeyRf", "rayStartParam", "workerGroupSpec", "an int param",
        "containers not a list", "no groupName"])
def test_a_misspelt_or_misshapen_field_fails_the_schema_check(edit, fault):
    broken = copy.deepcopy(raycluster())
    edit(broken)
    errors = schema_errors(broken, "RayCluster", "raycluster")
    assert len(errors) == 1 and fault in errors[0], errors


def test_the_clients_deserializer_alone_would_let_a_misspelt_field_through():
    template = copy.deepcopy(workers()[0]["template"])
    container = template["spec"]["containers"][0]
    container["resurces"] = container.pop("resources")
    assert deserialize(template, "V1PodTemplateSpec").spec.containers[0].resources is None
    assert schema_errors(template, "V1PodTemplateSpec", "template") != []


def test_the_kustomization_applies_the_cluster_and_the_claim_and_the_study_job_is_created_apart():
    (kustomization,) = read("kustomization.yaml")
    assert set(kustomization) <= {"apiVersion", "kind", "resources", "namespace", "labels", "images"}
    assert kustomization["resources"] == ["raycluster.yaml", "data-claim.yaml"]
    assert set(manifests()) == {"raycluster.yaml", "data-claim.yaml", "study-job.yaml"}


def test_worker_pods_are_guaranteed_qos_with_whole_cpus():
    for group in workers():
        assert qos_errors(group["template"]) == [], group["groupName"]


@pytest.mark.parametrize(("resources", "fault"), [
    ({"requests": {"cpu": "2", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}, "cpu requests 2 != limits 4"),
    ({"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}}, "memory requests 8Gi"),
    ({"requests": {"cpu": "3500m", "memory": "16Gi"}, "limits": {"cpu": "3500m", "memory": "16Gi"}}, "not a whole"),
    ({"requests": {"cpu": "4", "memory": "16Gi"}}, "cpu requests 4 != limits None"),
], ids=["cpu below limit", "memory below limit", "fractional cpu", "no limits"])
def test_a_pod_that_is_not_guaranteed_with_whole_cpus_is_caught(resources, fault):
    template = copy.deepcopy(workers()[0]["template"])
    template["spec"]["containers"][0]["resources"] = resources
    assert any(fault in error for error in qos_errors(template)), qos_errors(template)


def test_an_init_container_below_its_limits_takes_the_pod_out_of_guaranteed_qos():
    template = copy.deepcopy(workers()[0]["template"])
    template["spec"]["initContainers"] = [{"name": "setup", "resources": {
        "requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}}]
    assert qos_errors(template) == ["setup: cpu requests 100m != limits 200m"]


def test_each_worker_pod_offers_one_tracker_slot_and_the_head_none():
    cluster = raycluster()
    assert [ray_resources(group).get(SLOT) for group in workers()] == [1.0] * len(workers())
    assert all(group["template"]["spec"].get("containers") and group.get("numOfHosts", 1) == 1 for group in workers())
    head = cluster["spec"]["headGroupSpec"]
    assert SLOT not in ray_resources(head) and head["resources"]["CPU"] == "0"


def test_a_slot_given_in_kuberays_older_ray_start_params_syntax_is_read_too():
    group = {"rayStartParams": {"resources": '"{\\"tracker_slot\\": 2}"'}}
    assert ray_resources(group) == {SLOT: 2.0}
    assert ray_resources(group | {"resources": {SLOT: "1"}}) == {SLOT: 1.0}


def test_each_hardware_type_has_its_worker_group_node_selector_and_node_type_label():
    groups = workers()
    types = [group["labels"][NODE_TYPE_LABEL] for group in groups]
    assert len(groups) >= 2 and len(set(types)) == len(types)
    selectors = [group["template"]["spec"]["nodeSelector"] for group in groups]
    assert all(selectors) and len({json.dumps(s, sort_keys=True) for s in selectors}) == len(groups)


def test_no_two_measuring_pods_share_a_machine():
    name = raycluster()["metadata"]["name"]
    for group in workers():
        (term,) = group["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"] == {"ray.io/cluster": name, "ray.io/node-type": "worker"}


def test_the_store_is_the_team_server_and_no_credential_is_inline():
    drivers = 0
    for where, doc in objects():
        assert doc["kind"] != "Secret", f"{where}: a Secret's values do not belong in the repository"
        for place, template in pod_templates(doc):
            assert inline_secret_errors(template) == [], f"{where} {place}"
            env = {e["name"]: e for c in template["spec"]["containers"] for e in c.get("env", [])}
            if place.startswith("worker"):  # workers never talk to the store
                assert not [name for name in env if name.startswith("MLFLOW_")], f"{where} {place}"
                continue
            drivers += 1
            assert env["MLFLOW_TRACKING_URI"]["value"] == TEAM_STORE_URI
            for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
                assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "tracker-mlflow"
    assert drivers == 2  # the head and the study Job


@pytest.mark.parametrize(("env", "fault"), [
    ({"name": "MLFLOW_TRACKING_PASSWORD", "value": "hunter2"}, "MLFLOW_TRACKING_PASSWORD is written inline"),
    ({"name": "MLFLOW_TRACKING_URI", "value": "http://u:pw@mlflow:5000"}, "holds credentials in its URI"),
], ids=["password", "uri"])
def test_an_inline_credential_is_caught(env, fault):
    template = copy.deepcopy(raycluster()["spec"]["headGroupSpec"]["template"])
    template["spec"]["containers"][0]["env"].append(env)
    assert [fault in error for error in inline_secret_errors(template)] == [True]


def test_every_pod_runs_the_one_image_the_dockerfile_builds_with_the_clusters_ray():
    images = {c["image"] for _, doc in objects() for _, t in pod_templates(doc) for c in containers(t)}
    dockerfile = DOCKERFILE.read_text()
    (built,) = re.findall(r"docker build -f deploy/Dockerfile -t (\S+) \.", dockerfile)
    assert images == {built}
    assert f"'ray[default]=={raycluster()['spec']['rayVersion']}'" in dockerfile
