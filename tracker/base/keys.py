"""The tracker's MLflow vocabulary: the tags it sets and their values, and MLflow-safe metric keys and file
names derived from arbitrary op and node names.

Pure: no MLflow import. `tracker.store` writes these names, `tracker compare` reads them back.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

TAG_STUDY = "tracker.study"
TAG_ATTEMPT = "tracker.attempt"
TAG_RUNTIME = "tracker.runtime"
TAG_STATUS = "tracker.status"
TAG_ERROR = "tracker.error"
TAG_DIFF = "tracker.diff"
TAG_ROLE = "tracker.role"
TAG_BEST = "tracker.best_attempt"
NO_BEST = "none passed"  # the value of TAG_BEST when no attempt qualifies
TAG_VERDICT = "tracker.verdict"
TAG_MODEL_ID = "tracker.model_id"  # an attempt run's logged model (MLflow 3), whose metrics are its figures
TAG_BEST_MODEL = "tracker.best"  # "true" on the logged model of a study's best attempt
TAG_PIPELINE = "tracker.pipeline"  # a chain's steps, e.g. "attention_fused+int8_dynamic"
TAG_PARENT_ATTEMPT = "tracker.parent_attempt"  # the attempt a chain extends (every step but its last)
TAG_SEARCH_STAGE = "tracker.search.stage"  # the search stage an attempt run was measured in
TAG_SEARCH_STATUS = "tracker.search.status"  # a candidate run's end: screened, skipped, failed
TAG_SEARCH_REASON = "tracker.search.reason"  # why a candidate run went no further
# The failing quantization a sensitivity fallback rescued: its kept-in-fp32 nodes cost that one its accuracy.
TAG_FALLBACK_OF = "tracker.search.fallback_of"
TAG_DISTURBED = "tracker.disturbed"  # measuring steps other processes disturbed, e.g. "latency,profiling"
TAG_WEIGHTS = "tracker.weights"  # where a GPT-2 study's weights came from (random, not pretrained)
TAG_MODEL_FORMAT = "tracker.model_format"  # set when the model is a plain artifact, not the onnx flavor
TAG_UPLOADED_FROM = "tracker.uploaded_from"  # the outbox folder an uploaded attempt run came from
TAG_UPLOADED_LATER = "tracker.uploaded_later"  # a study run `tracker upload` finished
TAG_NOT_LOGGED = "tracker.not_logged"  # parts of a run MLflow refused for their content, and why
TAG_SUPERSEDED_BY = "tracker.superseded_by"  # a run replaced by its upload: `tracker compare` skips it
# The process that writes a run (`base.files.this_process`), so that a run its killed process left RUNNING is found
# (`tracker.store.abandoned`) and ended KILLED, with why in `tracker.killed`.
TAG_HOST = "tracker.host"
TAG_PID = "tracker.pid"
TAG_PID_STARTED = "tracker.pid_started_s"
TAG_KILLED = "tracker.killed"
# Where an attempt was measured on a cluster (`tracker.cluster`): the Ray node's id, and the node's hardware type
# (its `tracker_node_type` label, else its CPU model). A local study sets neither; rows group by the node type.
TAG_NODE = "tracker.node"
TAG_NODE_TYPE = "tracker.node_type"

# Values of the `tracker.role` tag.
ROLE_STUDY = "study"  # a study's parent run
ROLE_ATTEMPT = "attempt"  # one attempt, nested under its study
ROLE_CANDIDATE = "candidate"  # a search's candidate timed on the screen only (the attempts are measured in full)
# a node's own baseline on a cluster, timed again on every node that measures (the first one of a node type is that
# type's baseline row; the others are kept out of the attempts table, like candidate runs)
ROLE_NODE_BASELINE = "node_baseline"

# The values of `tracker.status` and `tracker.verdict` are `Status` and `Verdict` (`tracker.base.vocabulary`).

# The accuracy check's verdict among a run's metrics (1 passed, 0 failed): written by every check
# (`tracker.measure.accuracy`), read back by the schema (`tracker.measure.schema`).
METRIC_DIFF_PASSED = "diff.passed"

MAX_KEY_LENGTH = 250
_DISALLOWED = re.compile(r"[^A-Za-z0-9_\-. :/]")
_REPEATS = re.compile(r"/{2,}|\.{2,}")
# A lone "." path segment ("a/./b", "x/.", "."): MLflow rejects keys that posixpath.normpath changes.
_DOT_SEGMENT = re.compile(r"(?<![^/])\.(?![^/])")


# MLflow's (mlflow.utils.validation.MAX_EXPERIMENT_NAME_LENGTH): a longer name fails when the first run starts.
MAX_EXPERIMENT_NAME_LENGTH = 500


# A registered model's versions (`Study(register=...)`): its aliases, and the tags each version gets.
ALIAS_CANDIDATE = "candidate"  # always the latest version a study registered
ALIAS_CHAMPION = "champion"  # moved only to a version measured better than the champion, passing its check
TAG_STUDY_RUN = "tracker.study_run"  # the study run that registered the version
TAG_SPEEDUP = "tracker.speedup"  # its speed-up over its study's baseline, with the interval
TAG_ACCURACY = "tracker.accuracy"  # its accuracy check in its study
TAG_MACHINE = "tracker.machine"  # where it was measured: host, CPU, cores
TAG_CHAMPION_KEPT = "tracker.champion_kept"  # why the champion stayed where it was
TAG_AGAINST_CHAMPION = "tracker.against_champion"  # how it measured against the champion it replaced
TAG_REGISTERED = "tracker.registered"  # on the study run: the version it registered, and where the champion is
# What MLflow refuses in a registered model's name, and "@" besides: `models:/NAME@ALIAS` could not name it.
_BAD_MODEL_NAME_CHARACTERS = ("/", ":", "@")


def check_registered_model_name(name: str) -> None:
    """Refuses, before any work, a registered model name MLflow would refuse (or that `models:/NAME@ALIAS` cannot
    name).

    Raises:
        ValueError: the name is not a string, is empty, holds "/", ":" or "@", or is "." or "..".
    """
    if not isinstance(name, str):
        raise ValueError(f"registered model name must be a string, got {type(name).__name__} {name!r}")
    bad = [c for c in _BAD_MODEL_NAME_CHARACTERS if c in name]
    if not name.strip() or bad or name.strip() in (".", "..") or name != name.strip():
        why = (f"it holds {' '.join(repr(c) for c in bad)}" if bad
               else "it is empty" if not name.strip() else "it is a path segment" if name.strip() in (".", "..")
               else "it starts or ends with a space")
        raise ValueError(f"registered model name {name!r} is refused: {why}; a name is text without '/', ':' or '@' "
                         "(models:/NAME@ALIAS names a version)")


def check_experiment_name(name: str) -> None:
    """Refuses, before any work, an experiment name MLflow would refuse when the first run starts.

    Raises:
        ValueError: the name is not a string or is longer than `MAX_EXPERIMENT_NAME_LENGTH`.
    """
    if not isinstance(name, str):
        raise ValueError(f"experiment name must be a string, got {type(name).__name__} {name!r}")
    if len(name) > MAX_EXPERIMENT_NAME_LENGTH:
        raise ValueError(f"experiment name must be at most {MAX_EXPERIMENT_NAME_LENGTH} characters (MLflow's "
                         f"limit), got {len(name)}: {name[:40]!r}...")


def sanitize_key(name: str) -> str:
    """Maps any text to a key MLflow accepts (letters, digits, `_ - . space : /`, no `//`, `..`).

    Names that had to change get a short hash of the original, so two names that only differ in
    characters MLflow rejects (`a+b`, `a=b`) do not collide.
    """
    clean = _REPEATS.sub("_", _DISALLOWED.sub("_", name)).strip("/ ")
    clean = _DOT_SEGMENT.sub("_", clean)
    if not clean:
        clean = "_"
    if clean != name:
        clean = f"{clean}_{_short_hash(name)}"
    if len(clean) > MAX_KEY_LENGTH:
        clean = f"{clean[: MAX_KEY_LENGTH - 9]}_{_short_hash(name)}"
    return clean


def metric_keys(prefix: str, names: Iterable[str], suffix: str) -> dict[str, str]:
    """`{name: f"{prefix}.{sanitized name}.{suffix}"}` for each name, all within MLflow's limits."""
    room = MAX_KEY_LENGTH - len(prefix) - len(suffix) - 2
    keys = {}
    for name in names:
        part = sanitize_key(name)
        if len(part) > room:
            part = f"{part[: room - 9]}_{_short_hash(name)}"
        keys[name] = f"{prefix}.{part}.{suffix}"
    return keys


def logged_model_name(study: str | None, attempt: str) -> str:
    """The name of an attempt's MLflow logged model: `<study>-<attempt>`, or `<attempt>` outside a study.

    Not `<study>.<attempt>`: MLflow 3.17 refuses a logged model name holding `.`, `/`, `:`, `%` or quotes,
    so a dot inside a study or attempt name becomes `_` (and the `+` of a chain `_then_`). The model's tags
    `tracker.study` and `tracker.attempt` carry the exact names.
    """
    return "-".join(part.replace(".", "_").replace("+", "_then_") for part in (study, attempt) if part)


def feeds_dataset_name(study: str | None, attempt: str) -> str:
    """The name of the MLflow dataset an attempt's feeds are logged as: `<study>.feeds` (`<attempt>.feeds`
    outside a study). Every attempt of a study runs on the same feeds: one dataset, one name."""
    return f"{study or attempt}.feeds"


def _short_hash(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:8]
