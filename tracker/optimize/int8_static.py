"""int8 static quantization (QDQ): weights and activations in int8, activation ranges calibrated on the
study's feeds (`onnxruntime.quantization.quantize_static`, MinMax or Percentile)."""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from tracker.optimize.base import Candidate, Context, Entry, count_ops, float_weights, prepare_output

logger = logging.getLogger(__name__)

# The ops that carry weights: quantizing only these keeps activations-only ops (Add, Softmax,
# LayerNormalization, Gather of an embedding...) in float, where int8 costs accuracy and saves little.
WEIGHTED_OPS = ("MatMul", "Gemm", "Conv")
CALIBRATIONS = ("minmax", "percentile")
# A batch of more rows is calibrated in this many chunks of rows: one ORT run per chunk, not per row.
MAX_CALIBRATION_SAMPLES = 32
# From this size on, a model's weights must lie in an external data file (protobuf's 2 GiB limit).
LARGE_MODEL_BYTES = 2**31 - 1


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
    if not arrays or not free or len(rows) != 1 or None in rows or next(iter(rows)) < 2:
        return [arrays], "calibrated on the feeds as one sample (their batch cannot be split into rows)"
    (n_rows,) = rows
    chunks = min(n_rows, max_samples)
    samples = [dict(zip(arrays, parts)) for parts in zip(*(np.array_split(a, chunks) for a in arrays.values()))]
    return samples, f"calibrated on {chunks} samples: the feeds' batch of {n_rows} rows split along axis 0"


def quantized_nodes(model: onnx.ModelProto) -> int:
    """How many MatMul, Gemm or Conv nodes take an input from a DequantizeLinear: the quantized ops of a QDQ graph."""
    dequantized = {out for node in model.graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    return sum(
        1 for node in model.graph.node if node.op_type in WEIGHTED_OPS and any(i in dequantized for i in node.input)
    )


def model_bytes(path: Path) -> int:
    """The size of a model: its file plus the external data it points to."""
    model = onnx.load_model(str(path), load_external_data=False)
    external = 0
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            external += int(entries.get("length", 0))
    return Path(path).stat().st_size + external


def pre_process(source: Path, target: Path, *, shape_inference: bool, large: bool) -> None:
    """`quant_pre_process` of `source` into `target`: ORT's basic graph optimizations (constant folding),
    then ONNX shape inference when `shape_inference`.

    Why: the folding makes weights the quantizer can see out of constant subgraphs (the dynamo GPT-2
    export ties lm_head to the embedding through a Transpose; folded, it is an int8 constant quantized once
    instead of an activation quantized every run) and fuses Conv+BatchNormalization, so the merged weight
    is quantized once. Symbolic shape inference is skipped: when it cannot infer every shape it writes
    `sym_shape_infer_temp.onnx` into the working directory and raises, and ONNX shape inference types every
    standard op these graphs have. A `large` model (2 GiB or more) keeps its weights in `<target>.data`.
    """
    from onnxruntime.quantization.shape_inference import quant_pre_process

    # A source whose weights lie in a side file must be written the same way: ORT's optimized copy would
    # otherwise point at the source's data file name from the temporary folder, where it is not, and
    # quant_pre_process would log the failure and go on without optimizing.
    external = large or any(t.data_location == onnx.TensorProto.EXTERNAL
                            for t in onnx.load_model(str(source), load_external_data=False).graph.initializer)
    quant_pre_process(
        source,
        target,
        skip_symbolic_shape=True,
        skip_onnx_shape=not shape_inference,
        save_as_external_data=external,
        all_tensors_to_one_file=True,
        external_data_location=f"{target.name}.data" if external else None,
    )


def _make(calibration: str):
    name = f"int8_static_{calibration}"

    def make(source: Path, target_dir: Path, context: Context) -> Candidate:
        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            QuantFormat,
            QuantType,
            quantize_static,
        )

        if context.feeds is None:
            raise ValueError(f"{name} calibrates on the study's inputs: Context.feeds is None")
        target = prepare_output(source, target_dir, name)
        large = model_bytes(source) >= LARGE_MODEL_BYTES

        class Reader(CalibrationDataReader):
            def __init__(self, samples: list[dict[str, np.ndarray]]) -> None:
                self._samples = iter(samples)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self._samples, None)

        # The pre-processed model is an intermediate: it lives and dies in a folder under target_dir.
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f"{name}.") as work:
            prepared = Path(work) / "pre_processed.onnx"
            pre_process(source, prepared, shape_inference=True, large=large)
            graph = onnx.load_model(str(prepared), load_external_data=False)
            samples, how = calibration_samples(graph, context.feeds)
            printed = io.StringIO()
            # quantize_static prints its Percentile progress to stdout; it goes to the log instead.
            with contextlib.redirect_stdout(printed):
                quantize_static(
                    prepared,
                    target,
                    Reader(samples),
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(WEIGHTED_OPS),
                    per_channel=True,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method={"minmax": CalibrationMethod.MinMax,
                                      "percentile": CalibrationMethod.Percentile}[calibration],
                    calibration_providers=["CPUExecutionProvider"],
                    use_external_data_format=large,
                )
            if printed.getvalue().strip():
                logger.debug("%s: quantize_static printed: %s", name, printed.getvalue().strip())

        result = onnx.load_model(str(target), load_external_data=False)
        quantized = quantized_nodes(result)
        qdq = count_ops(result, ("QuantizeLinear", "DequantizeLinear"))
        notes = [
            how,
            "pre-processed with ORT's basic graph optimizations and ONNX shape inference (quant_pre_process)",
            f"{quantized} MatMul/Gemm/Conv nodes quantized to int8 (per-channel weights, per-tensor activations): "
            f"{qdq['QuantizeLinear']} QuantizeLinear, {qdq['DequantizeLinear']} DequantizeLinear",
        ]
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
                "quantization.format": "QDQ",
                "quantization.calibration": calibration,
                "quantization.calibration_samples": str(len(samples)),
                "quantization.per_channel": "true",
                "quantization.op_types": ",".join(WEIGHTED_OPS),
                "quantization.quantized_nodes": str(quantized),
            },
        )

    make.__name__ = name
    make.__doc__ = f"int8 QDQ quantization of the MatMul, Gemm and Conv nodes, activation ranges by {calibration}."
    return make


MINMAX = Entry("int8_static_minmax", "quantization",
               "int8 QDQ of MatMul/Gemm/Conv, activation ranges calibrated on the feeds (MinMax)",
               _make("minmax"), has_weights_and_feeds)
PERCENTILE = Entry("int8_static_percentile", "quantization",
                   "int8 QDQ of MatMul/Gemm/Conv, activation ranges calibrated on the feeds (Percentile 99.999)",
                   _make("percentile"), has_weights_and_feeds)
