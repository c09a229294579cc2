"""The model registry, written: an attempt's logged model made a new version of a registered model, with its tags,
and an alias moved to it. Which version gets which alias is the study's to decide (`tracker.study.register`); reading
a version back is `tracker.store.registry`'s."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

import mlflow
from mlflow.exceptions import MlflowException

from tracker.base.keys import TAG_MODEL_ID
from tracker.base.redaction import redact_uri
from tracker.base.termination import defers_sigterm

_ALREADY_EXISTS = "RESOURCE_ALREADY_EXISTS"
_NOT_FOUND = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND")
# Registry URIs whose store keeps no registry here: a file store (a `file:` URI, or a bare path).
_NO_REGISTRY_SCHEMES = ("", "file")


def check_registry() -> None:
    """Checks that the current tracking store holds a model registry (a database, or a tracking server).

    Raises:
        ValueError: it is a file store: one line saying what to use instead.
    """
    uri = mlflow.get_registry_uri()
    scheme = urlparse(uri).scheme
    if scheme in _NO_REGISTRY_SCHEMES or (len(scheme) == 1 and uri[1:3] == ":\\"):  # a Windows path's drive
        raise ValueError(f"the tracking store {redact_uri(uri)} is a file store, which has no model registry to "
                         "register in: use a database (sqlite:///path/mlflow.db, postgresql://...) or a tracking "
                         "server (http://...)")


def model_id_of(run_id: str) -> str | None:
    """The logged model of the attempt run `run_id` (its `tracker.model_id` tag), or None (its model was a plain file,
    or not logged)."""
    return mlflow.MlflowClient().get_run(run_id).data.tags.get(TAG_MODEL_ID) or None


def version_with_alias(name: str, alias: str) -> str | None:
    """The version of the registered model `name` that `alias` points at, or None (no such model, or no such alias)."""
    client = mlflow.MlflowClient()
    try:
        return str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException as e:
        if e.error_code not in _NOT_FOUND:
            raise
        return None


@defers_sigterm
def register_version(name: str, *, model_id: str, run_id: str, tags: Mapping[str, str]) -> str:
    """Makes the logged model `model_id` (logged by the run `run_id`) a new version of the registered model `name`
    (created on its first version), with `tags`; returns the version's number, as text."""
    client = mlflow.MlflowClient()
    try:
        client.create_registered_model(name)
    except MlflowException as e:
        if e.error_code != _ALREADY_EXISTS:
            raise
    source = client.get_logged_model(model_id).artifact_location
    version = client.create_model_version(name, source=source, run_id=run_id, tags=dict(tags), model_id=model_id)
    return str(version.version)


@defers_sigterm
def set_alias(name: str, alias: str, version: str) -> None:
    """Points `alias` of the registered model `name` at `version` (from whichever version held it)."""
    mlflow.MlflowClient().set_registered_model_alias(name, alias, version)


@defers_sigterm
def tag_version(name: str, version: str, tags: Mapping[str, str]) -> None:
    """Sets `tags` on `version` of the registered model `name`."""
    client = mlflow.MlflowClient()
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
