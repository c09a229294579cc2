"""Loading and checking ONNX model files, with errors that say what is wrong with the file."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from tracker.errors import ModelError


def load_model(path: str | Path, *, load_external_data: bool = True, check: bool = True) -> onnx.ModelProto:
    """Loads an ONNX file and runs the ONNX checker on it.

    Raises:
        ModelError: the file is missing, is not an ONNX protobuf, or fails the checker.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist or is not a file")
    try:
        model = onnx.load(str(path), load_external_data=load_external_data)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        raise ModelError(f"{str(path)!r} is not a readable ONNX model (expected an ONNX protobuf): {e}") from e
    if len(model.graph.node) == 0 and not model.graph.output:
        # protobuf parses many foreign files into an empty message instead of failing
        raise ModelError(f"{str(path)!r} is not an ONNX model: it has no graph nodes and no outputs")
    if check:
        check_model(model if load_external_data else path, source=str(path))
    return model


def check_model(model: onnx.ModelProto | str | Path, *, source: str = "model") -> None:
    """Runs `onnx.checker.check_model`, raising `ModelError` naming the model on failure."""
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model)
    except onnx.checker.ValidationError as e:
        raise ModelError(f"{source} fails the ONNX checker: {e}") from e


def model_bytes(model: onnx.ModelProto) -> int:
    """Serialized size of an in-memory model (its external data excluded)."""
    return int(model.ByteSize())


_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def ort_can_load(model: onnx.ModelProto) -> bool:
    """False for a custom-domain op without a model-local function: ONNX Runtime cannot load it."""
    local = {(f.domain, f.name) for f in model.functions}
    return all(n.domain in _STANDARD_DOMAINS or (n.domain, n.op_type) in local for n in model.graph.node)
