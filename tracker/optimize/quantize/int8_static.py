"""int8 static quantization (QDQ or QOperator): weights and activations in int8, activation ranges calibrated on
the study's feeds (`onnxruntime.quantization.quantize_static`, MinMax, Entropy or Percentile)."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from tracker.base.vocabulary import Kind
from tracker.optimize.base import Candidate, Context, count_ops, float_weights
from tracker.optimize.entry import Entry, knob
from tracker.optimize.model_files import prepare_output
from tracker.optimize.quantize.lm_head import lm_head_params
from tracker.optimize.quantize.prepare import LARGE_MODEL_BYTES, model_bytes, prepared

logger = logging.getLogger(__name__)

# The ops that carry weights: quantizing only these keeps activations-only ops (Add, Softmax,
# LayerNormalization, Gather of an embedding...) in float, where int8 costs accuracy and saves little.
WEIGHTED_OPS = ("MatMul", "Gemm", "Conv")
CALIBRATIONS = ("minmax", "entropy", "percentile")
_CALIBRATION_NAMES = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile 99.999"}
# QOperator and QDQ both take these; the first is every weighted op.
OP_TYPES = ("MatMul,Gemm,Conv", "MatMul,Gemm", "MatMul", "Conv")
# A batch of more rows is calibrated in this many chunks of rows: one ORT run per chunk, not per row.
MAX_CALIBRATION_SAMPLES = 32


def has_weights_and_feeds(model: onnx.ModelProto, context: Context) -> str | None:
    """Models with a MatMul, Gemm or Conv float32 weight, in a study with feeds to calibrate on."""
    if not float_weights(model, WEIGHTED_OPS):
        return "no MatMul, Gemm or Conv with a float32 weight initializer"
    if context.feeds is None:
        return "static quantization calibrates on the study's inputs, and none were given (Context.feeds is None)"
    return None


def calibration_samples(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, max_samples: int = MAX_CALIBRATION_SAMPLES
) -> tuple[list[dict[str, np.ndarray]], str]:
    """The feeds as calibration samples, and a note saying how they were made.

    A batch is split along its first axis into up to `max_samples` chunks of rows when every input has a
    free (symbolic or unknown) first dim and every feed has the same number of rows, more than one:
    Percentile's histograms then see each row's values, and the calibration runs on inputs shaped like
    those a batch of one gives. Otherwise the feeds are one sample, as given.
    """
    if max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {max_samples}")
    arrays = {name: np.asarray(value) for name, value in feeds.items()}
    first_dims = {}
    for value_info in model.graph.input:
        dims = value_info.type.tensor_type.shape.dim
        if value_info.name in arrays:
            first_dims[value_info.name] = dims[0] if dims else None
    rows = {a.shape[0] if a.ndim else None for a in arrays.values()}
    free = all(dim is not None and not dim.HasField("dim_value") for dim in first_dims.values())
    n_rows = next(iter(rows)) if len(rows) == 1 else None
    if not arrays or not free or n_rows is None or n_rows < 2:
        return [arrays], "calibrated on the feeds as one sample (their batch cannot be split into rows)"
    chunks = min(n_rows, max_samples)
    samples = [dict(zip(arrays, parts)) for parts in zip(*(np.array_split(a, chunks) for a in arrays.values()))]
    return samples, f"calibrated on {chunks} samples: the feeds' batch of {n_rows} rows split along axis 0"


def quantized_nodes(model: onnx.ModelProto) -> int:
    """How many MatMul, Gemm or Conv nodes take an input from a DequantizeLinear: the quantized ops of a QDQ graph."""
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    return sum(
        1 for node in model.graph.node if node.op_type in WEIGHTED_OPS and any(i in dequantized for i in node.input)
    )


@dataclass(frozen=True)
class Int8Static(Entry):
    """int8 weights and activations, activation ranges calibrated on the study's feeds (`quantize_static`), on
    the source pre-processed once (`quant_pre_process` with shape inference).

    Knobs: `calibration` (MinMax, Entropy, Percentile 99.999), `per_channel`, `format` (QDQ pairs that ORT
    fuses, or QOperator ops such as QLinearConv), `activation_type` / `weight_type` (S8S8, U8S8...),
    `reduce_range`, `symmetric` (activations), `op_types`, and `exclude` (nodes left in fp32).
    """

    name: str = "int8_static_minmax"
    calibration: str = knob("minmax", CALIBRATIONS, short="cal")
    per_channel: bool = knob(True, (False, True), short="pc")
    format: str = knob("QDQ", ("QDQ", "QOperator"), short="fmt")
    activation_type: str = knob("QInt8", ("QInt8", "QUInt8"), short="a")
    weight_type: str = knob("QInt8", ("QInt8", "QUInt8"), search=("QInt8",), short="w")
    reduce_range: bool = knob(False, (False, True), search=(False,), short="rr")
    symmetric: bool = knob(False, (False, True), search=(False,), short="sym")
    op_types: str = knob("MatMul,Gemm,Conv", OP_TYPES, search=("MatMul,Gemm,Conv",), short="ops")
    exclude: tuple[str, ...] = knob((), None, search=((),), short="fp32", key="nodes_to_exclude")

    kind = Kind.QUANTIZATION
    inserts_ops = True

    @property
    def summary(self) -> str:
        return (f"int8 {self.format} of {self.op_types}, activation ranges calibrated on the feeds "
                f"({_CALIBRATION_NAMES[self.calibration]})")

    def __post_init__(self) -> None:
        self.check_knobs()

    def requires(self, model: onnx.ModelProto, context: Context) -> str | None:
        return has_weights_and_feeds(model, context)

    def pre_processing(self, source: Path, context: Context) -> str:
        """How the source is prepared (`prepare.HOWS`): `quant_pre_process` with ONNX shape inference."""
        return "quant_pre_process_shapes"

    @property
    def weight_ops(self) -> tuple[str, ...]:
        """The op types it quantizes (what `exclude` may name)."""
        return tuple(self.op_types.split(","))

    def make(self, source: Path, target_dir: Path, context: Context) -> Candidate:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        if context.feeds is None:
            raise ValueError(f"{self.name} calibrates on the study's inputs: Context.feeds is None")
        target = prepare_output(source, target_dir, self.name)
        large = model_bytes(source) >= LARGE_MODEL_BYTES

        class Reader(CalibrationDataReader):
            def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
                self._samples = iter(samples)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._samples, None)

        with prepared(source, target.parent, context, how=self.pre_processing(source, context),
                      entry=self.name) as ready:
            graph = onnx.load_model(str(ready.path), load_external_data=False)
            samples, how = calibration_samples(graph, context.feeds)
            printed = io.StringIO()
            # quantize_static prints its Percentile progress to stdout; it goes to the log instead.
            with contextlib.redirect_stdout(printed):
                quantize_static(
                    ready.path,
                    target,
                    Reader(samples),
                    quant_format=getattr(QuantFormat, self.format),
                    op_types_to_quantize=list(self.weight_ops),
                    per_channel=self.per_channel,
                    reduce_range=self.reduce_range,
                    activation_type=getattr(QuantType, self.activation_type),
                    weight_type=getattr(QuantType, self.weight_type),
                    nodes_to_exclude=list(self.exclude),
                    calibrate_method={"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                                      "percentile": CalibrationMethod.Percentile}[self.calibration],
                    calibration_providers=["CPUExecutionProvider"],
                    use_external_data_format=large,
                    extra_options={"ActivationSymmetric": self.symmetric},
                )
            if printed.getvalue().strip():
                logger.debug("%s: quantize_static printed: %s", self.name, printed.getvalue().strip())

        result = onnx.load_model(str(target), load_external_data=False)
        quantized = quantized_nodes(result)
        qdq = count_ops(result, ("QuantizeLinear", "DequantizeLinear"))
        notes = [
            how,
            "pre-processed with ORT's basic graph optimizations and ONNX shape inference (quant_pre_process)",
            f"{quantized} MatMul/Gemm/Conv nodes quantized to int8 "
            f"({'per-channel' if self.per_channel else 'per-tensor'} "
            f"weights, per-tensor activations): {qdq['QuantizeLinear']} QuantizeLinear, "
            f"{qdq['DequantizeLinear']} DequantizeLinear",
        ]
        if self.exclude:
            notes.append(f"{len(self.exclude)} node(s) kept in fp32: {', '.join(self.exclude)}")
        if quantized == 0:
            notes.append("nothing was quantized: the model runs as float, with ORT's basic optimizations")
        return Candidate(
            path=target,
            applied=quantized > 0,
            fusions={},
            fully_optimized=None,
            precision="int8",
            notes=tuple(notes),
            params={
                "quantization.method": "static",
                "quantization.calibration_samples": str(len(samples)),
                "quantization.quantized_nodes": str(quantized),
                **lm_head_params(result),
            },
        )


MINMAX = Int8Static()
PERCENTILE = Int8Static(name="int8_static_percentile", calibration="percentile")
