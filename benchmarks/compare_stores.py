"""Compares what two MLflow tracking stores hold, run by run: what a change of the code changed in what a job logs.

    python benchmarks/compare_stores.py sqlite:////abs/old.db sqlite:////abs/new.db

Runs are matched by experiment name, parent run's name (nested runs) and run name. Where a key repeats on a side,
the k-th run of that key by start time is matched with the k-th on the other side (shown `#k`). Per matched run it
prints what differs: the status; params, tags and metrics missing, added or with another value; artifact paths
missing or added (the listing, not the contents); and the same for the run's logged models (MLflow 3's, by name).
Then the runs found on one side only. Metric values are compared only where COMPARED_METRICS names them (the others are
timings). What IGNORED_VALUES and IGNORED_KEYS name is printed first and left out. Exit 0 when nothing else differs,
1 otherwise.
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections import defaultdict
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run

# A fact is "kind:key" (kinds: status, param, metric, tag, artifact; a logged model's are "model NAME param" and so on,
# so that a pattern "*tag:x" holds for both).
# Metric values compared: what a run made and checked, the same each time for one input (the others are timings).
COMPARED_METRICS = ("*metric:graph.*", "*metric:fusion.*", "*metric:diff.*", "*metric:quality.*", "*metric:study.*",
                    "*metric:model.size_bytes")
# Values never compared: ids, the process, the checkout and the machine, and what follows the timings.
IGNORED_VALUES = (
    "*tag:mlflow.parentRunId", "*tag:tracker.model_id",  # run and model ids
    "*tag:tracker.host", "*tag:tracker.pid", "*tag:tracker.pid_started_s", "*tag:mlflow.user",  # the process
    "*tag:mlflow.source.name", "*tag:mlflow.source.git.commit", "*tag:mlflow.source.git.repoURL",  # the checkout
    "*param:lm.source", "*param:lm.gguf.file",  # where the installed model file lies
    "*param:machine.gemm",  # "..., best of N": N is how many products fit in the time given
    "*tag:tracker.verdict", "*tag:tracker.best_attempt",  # decided by the timings
)
# Keys left out altogether, as whether they are there at all follows the timings or the checkout:
IGNORED_KEYS = (
    "*tag:tracker.disturbed",  # another process took the CPU during a phase
    "*tag:tracker.best",  # on the study's fastest attempt
    "*metric:roofline.[A-Z]*",  # per op type for the 8 slowest op types only (roofline.matmuls.* and the rest stay)
    "*tag:mlflow.source.git.branch",  # set by MLflow only when the checkout is on a branch, not at a bare commit
)


def all_runs(client: MlflowClient) -> list[Run]:
    """Every run of every active experiment, page by page."""
    ids = [e.experiment_id for e in client.search_experiments()]
    runs: list[Run] = []
    token = None
    while True:
        page = client.search_runs(ids, max_results=1000, page_token=token)
        runs += page
        token = page.token
        if not token:
            return runs


def keyed_runs(client: MlflowClient) -> dict[str, Run]:
    """The runs by 'experiment / parent > run', '#k' added where the key repeats (k-th by start time)."""
    runs = sorted(all_runs(client), key=lambda r: r.info.start_time or 0)
    names = {r.info.run_id: r.info.run_name for r in runs}
    experiments = {e.experiment_id: e.name for e in client.search_experiments()}
    groups: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        parent = names.get(run.data.tags.get("mlflow.parentRunId", ""), "")
        path = f"{parent} > {run.info.run_name}" if parent else run.info.run_name
        groups[f"{experiments[run.info.experiment_id]} / {path}"].append(run)
    return {f"{key} #{k}" if len(group) > 1 else key: run
            for key, group in groups.items() for k, run in enumerate(group, 1)}


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    """The run's artifact files, recursively."""
    paths: list[str] = []
    for item in client.list_artifacts(run_id, path):
        paths += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return paths


def facts(client: MlflowClient, run: Run) -> dict[str, str | None]:
    """What a run and its logged models hold, as 'kind:key' -> value (None where only the key is compared)."""
    found: dict[str, str | None] = {"status:": run.info.status}
    found |= {f"param:{k}": v for k, v in run.data.params.items()}
    found |= {f"metric:{k}": str(v) for k, v in run.data.metrics.items()}
    found |= {f"tag:{k}": v for k, v in run.data.tags.items()}
    found |= {f"artifact:{p}": None for p in artifact_paths(client, run.info.run_id)}
    models = client.search_logged_models([run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'")
    for model in models:
        found |= {f"model {model.name} param:{k}": v for k, v in model.params.items()}
        found |= {f"model {model.name} metric:{m.key}": str(m.value) for m in model.metrics or []}
        found |= {f"model {model.name} tag:{k}": v for k, v in model.tags.items()}
    return {fact: compared(fact, value) for fact, value in found.items() if not matches(fact, IGNORED_KEYS)}


def compared(fact: str, value: str | None) -> str | None:
    """The value to compare; None where only the key is (IGNORED_VALUES, and metrics outside COMPARED_METRICS)."""
    if matches(fact, IGNORED_VALUES) or ("metric:" in fact and not matches(fact, COMPARED_METRICS)):
        return None
    return value


def matches(fact: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(fact, p) for p in patterns)


def differences(old: dict[str, str | None], new: dict[str, str | None]) -> list[str]:
    """One line per fact missing from `new`, added in it, or with another value."""
    lines = [f"  missing {k}" for k in sorted(old.keys() - new.keys())]
    lines += [f"  added   {k}" for k in sorted(new.keys() - old.keys())]
    lines += [f"  changed {k}: {old[k]!r} -> {new[k]!r}" for k in sorted(old.keys() & new.keys()) if old[k] != new[k]]
    return lines


def compare(old_uri: str, new_uri: str) -> int:
    """Prints the differences between the two stores; 1 when there are any, else 0."""
    old_client, new_client = MlflowClient(old_uri), MlflowClient(new_uri)
    old, new = keyed_runs(old_client), keyed_runs(new_client)
    print(f"old: {old_uri} ({len(old)} runs)\nnew: {new_uri} ({len(new)} runs)")
    print(f"metric values compared: {', '.join(COMPARED_METRICS)}\nvalues ignored: {', '.join(IGNORED_VALUES)}\n"
          f"keys ignored: {', '.join(IGNORED_KEYS)}")
    differing = 0
    for key in sorted(old.keys() & new.keys()):
        lines = differences(facts(old_client, old[key]), facts(new_client, new[key]))
        differing += bool(lines)
        print(f"{'differs' if lines else 'same   '} {key}", *lines, sep="\n")
    one_side = [f"old only: {k}" for k in sorted(old.keys() - new.keys())]
    one_side += [f"new only: {k}" for k in sorted(new.keys() - old.keys())]
    if one_side:
        print(*one_side, sep="\n")
    print(f"{len(old.keys() & new.keys())} runs matched, {differing} differ, {len(one_side)} on one side only")
    return 1 if differing or one_side else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old_uri", help="tracking URI of the store before the change (sqlite:////abs/old.db)")
    parser.add_argument("new_uri", help="tracking URI of the store after it")
    args = parser.parse_args(argv)
    for uri in (args.old_uri, args.new_uri):  # MLflow would make an empty store of a mistyped path
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            parser.error(f"no sqlite store at {uri}")
    return compare(args.old_uri, args.new_uri)


if __name__ == "__main__":
    sys.exit(main())
