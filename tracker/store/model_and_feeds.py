"""An attempt's model and feeds in the forms MLflow logs them: the onnx flavor with its tensor signature, the
model as a plain file when the flavor is refused, and the feeds as a dataset that describes them.

Which form a run gets, and what is left out when MLflow refuses one, is `tracker.store.write.log_record`'s.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import mlflow
import numpy as np
import onnx
from mlflow.data.dataset import Dataset
from mlflow.data.meta_dataset import MetaDataset
from mlflow.entities import Dataset as DatasetEntity
from mlflow.entities import DatasetInput, InputTag
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from tracker.base.keys import (
    TAG_ATTEMPT,
    TAG_MODEL_FORMAT,
    TAG_STATUS,
    TAG_STUDY,
    TAG_VERDICT,
    feeds_dataset_name,
    logged_model_name,
)
from tracker.base.model_io import load_model
from tracker.measure import schema
from tracker.run.record import AttemptRecord

# The figures that compare attempts, linked to each attempt's logged model (MLflow 3's `model_id`) so that the
# experiment's Models tab shows and sorts them: latency, the calibrated speed-up and its interval, the accuracy check,
# size and nodes; with the generation scenario, the decode and prefill speed-ups and the generation check.
MODEL_METRICS = frozenset((schema.P50_MS, schema.DIFF_PASSED, schema.COSINE_MIN, schema.TOP1, schema.PPL_INCREASE,
                           schema.SIZE_BYTES, schema.NODE_COUNT, schema.GEN_DIFF_PASSED))
# Each scenario's speed-up and its interval (`schema.Scope.prefix`): `latency.speedup`, `gen.decode.past512.speedup`.
# What an MLflow dataset entity holds of a dataset's `to_dict()`.
_DATASET_FIELDS = ("name", "digest", "source_type", "source", "schema", "profile")
_SPEEDUP = re.compile(r"(latency|gen\.decode\.past\d+|gen\.prefill\.s\d+)\.speedup(_ci_low|_ci_high)?")
# The attempt run's tags a logged model carries too (the verdict names the run's outcome in the Models tab).
MODEL_TAGS = (TAG_VERDICT, TAG_STATUS)


def model_figures(metrics: Mapping[str, float]) -> dict[str, float]:
    """Of an attempt's metrics, those linked to its logged model (`MODEL_METRICS`, and each phase's speed-up)."""
    return {k: v for k, v in metrics.items() if k in MODEL_METRICS or _SPEEDUP.fullmatch(k)}


def log_onnx_flavor(model: onnx.ModelProto, record: AttemptRecord, signature, run_id: str) -> str:
    """Logs `model` with the onnx flavor as the record's logged model on the run `run_id`, with `signature` (None:
    without one), tagged with the attempt's study, name, verdict and status (`MODEL_TAGS`). Returns the logged model's
    id."""
    # No input_example: it would make MLflow load and run the model once more.
    tags = {TAG_ATTEMPT: record.attempt, **({TAG_STUDY: record.study} if record.study else {}),
            **{k: str(record.tags[k]) for k in MODEL_TAGS if k in record.tags}}
    # Made here, in the run's experiment (MLflow would put a model logged by run id, with no active run, in its default
    # one), with the run's params as MLflow's own `log_model` copies them.
    run = mlflow.MlflowClient().get_run(run_id)
    made = mlflow.initialize_logged_model(name=logged_model_name(record.study, record.attempt), source_run_id=run_id,
                                          tags=tags, params=run.data.params, experiment_id=run.info.experiment_id)
    info = mlflow.onnx.log_model(
        onnx_model=model,
        model_id=made.model_id,
        signature=signature,
        pip_requirements=_pip_requirements(),
        onnx_execution_providers=["CPUExecutionProvider"],
        run_id=run_id,
    )
    return info.model_id


def log_plain_model(path: Path, run_id: str, *, why: str) -> None:
    """The onnx flavor's pyfunc would fail on an op ORT does not know: the model as a file, always
    `model/model.onnx` (with its weights in it) whatever the attempt's file was called."""
    with tempfile.TemporaryDirectory(prefix="tracker-model-") as tmp:
        plain = Path(tmp) / "model.onnx"
        onnx.save_model(load_model(path, check=False), str(plain))
        mlflow.MlflowClient().log_artifact(run_id, str(plain), "model")
    mlflow.MlflowClient().set_tag(run_id, TAG_MODEL_FORMAT, f"plain artifact ({why})")


def log_feeds_input(run_id: str, dataset: Dataset) -> None:
    """`dataset` as the run `run_id`'s input, in the "inference" context (what `mlflow.log_input` logs on the
    active run)."""
    fields = {k: v for k, v in dataset.to_dict().items() if k in _DATASET_FIELDS}
    mlflow.MlflowClient().log_inputs(run_id, [DatasetInput(DatasetEntity(**fields),
                                                           [InputTag(MLFLOW_DATASET_CONTEXT, "inference")])])


class _FeedsDataset(MetaDataset):
    """An MLflow dataset that holds a description only (`MetaDataset`), with a profile the UI shows."""

    def __init__(self, source, *, name: str, digest: str, schema, profile: dict[str, object]) -> None:
        self._profile = profile
        super().__init__(source, name=name, digest=digest, schema=schema)

    @property
    def profile(self) -> dict[str, object]:
        return self._profile

    def to_dict(self) -> dict[str, str]:
        return {**super().to_dict(), "profile": json.dumps(self._profile)}


def feeds_dataset(record: AttemptRecord) -> _FeedsDataset:
    """The record's feeds as an MLflow dataset: names, dtypes and shapes as a tensor schema and a profile,
    and the digest of their values; the arrays themselves stay out of the store."""
    from mlflow.data.code_dataset_source import CodeDatasetSource
    from mlflow.types import Schema, TensorSpec

    feeds = record.feeds
    if feeds is None:
        raise ValueError(f"attempt {record.attempt}: the record has no feeds to log as a dataset")
    # numpy's fixed-width strings have no TensorSpec type; ONNX Runtime takes strings as objects anyway
    schema = Schema([TensorSpec(np.dtype(object if np.dtype(s.dtype).kind in "OSU" else s.dtype), tuple(s.shape),
                                s.name) for s in feeds.inputs])
    # The UI lists a profile's entries as "key: value": one line per input, then the totals.
    profile = {**{s.name: s.describe() for s in feeds.inputs}, "total inputs": len(feeds.inputs),
               "total nbytes": feeds.nbytes}
    # The same source whether the run is logged live or uploaded later: the study (or lone attempt) it ran in.
    source = CodeDatasetSource({TAG_STUDY: record.study} if record.study else {TAG_ATTEMPT: record.attempt})
    return _FeedsDataset(source, name=feeds_dataset_name(record.study, record.attempt), digest=feeds.digest,
                         schema=schema, profile=profile)


def tensor_signature(model: onnx.ModelProto):
    """(the model's tensor signature, symbolic dims as -1; None) or (None, why it has none): MLflow's signature
    describes tensors only, so a model with no inputs, or with a sequence or map (a skl2onnx classifier's
    ZipMap), is logged without one."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec
    from onnx import helper

    initializers = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initializers]
    if not inputs:
        return None, "the model has no inputs, and an MLflow signature needs at least one"
    for side, values in (("input", inputs), ("output", model.graph.output)):
        for v in values:
            kind = v.type.WhichOneof("value")
            if kind != "tensor_type" or v.type.tensor_type.elem_type == onnx.TensorProto.UNDEFINED:
                return None, (f"{side} {v.name!r} is a {_value_kind(v.type)}, not a tensor; an MLflow signature "
                              "describes tensors only")

    def specs(values) -> Schema:
        out: list[ColSpec | TensorSpec] = []
        for v in values:
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            out.append(TensorSpec(helper.tensor_dtype_to_np_dtype(t.elem_type), dims, v.name))
        return Schema(out)

    return ModelSignature(inputs=specs(inputs), outputs=specs(model.graph.output)), None


def _value_kind(value_type: onnx.TypeProto) -> str:
    """'sequence of map', 'map', 'optional', ... of an ONNX value type."""
    kind = value_type.WhichOneof("value")
    if kind == "sequence_type":
        return f"sequence of {_value_kind(value_type.sequence_type.elem_type)}"
    if kind == "optional_type":
        return f"optional {_value_kind(value_type.optional_type.elem_type)}"
    return {"map_type": "map", "tensor_type": "tensor", "sparse_tensor_type": "sparse tensor"}.get(kind, "value of "
                                                                                                    "unknown type")


def _pip_requirements() -> list[str]:
    from importlib import metadata

    return [f"{p}=={metadata.version(p)}" for p in ("onnx", "onnxruntime")]
