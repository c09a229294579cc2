"""Loading and checking ONNX model files, with errors that say what is wrong with the file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import onnx
import onnx.parser
from google.protobuf import json_format
from google.protobuf import text_format as text_format_module
from google.protobuf.message import DecodeError
from onnx.external_data_helper import (
    ExternalDataInfo,
    _get_all_tensors,  # every tensor: initializers, attributes, subgraphs and functions
    load_external_data_for_model,
    uses_external_data,
)

from tracker.base.errors import ModelError, UnsupportedOpError


def load_model(path: str | Path, *, load_external_data: bool = True, check: bool = True) -> onnx.ModelProto:
    """Loads an ONNX file and runs the ONNX checker on it.

    The file is read by its content, not its name: an ONNX protobuf loads whatever its extension
    (`model.json` too). Only a file that is not a protobuf model is read in the text format onnx
    ties to its extension (ONNX JSON for `.json`, textproto for `.textproto`, ...).

    Raises:
        ModelError: the file is missing, is not an ONNX model, names an external data file that is
            missing, or fails the checker.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"model file {str(path)!r} does not exist or is not a file")
    model = _parse(path)
    # Checked first for every caller: the checker and ORT read these files by path later on.
    check_external_data(model, path)
    if load_external_data:
        try:
            load_external_data_for_model(model, str(path.parent))
        except (onnx.checker.ValidationError, OSError, ValueError) as e:
            raise ModelError(f"cannot read the external data of {str(path)!r}: {e}") from e
    if check:
        check_model(model if load_external_data else path, source=str(path))
    return model


def check_external_data(model: onnx.ModelProto, path: str | Path) -> None:
    """Checks, without reading them, that the external data files of `model` (saved at `path`) hold its tensors.

    Raises:
        ModelError: naming each file that is missing, and each tensor whose bytes would lie past the end of its
            file (a file cut short, or another model's), or whose record is malformed.
    """
    folder = Path(path).parent
    missing: dict[str, list[str]] = {}
    past_end = []
    for tensor in _get_all_tensors(model):
        if not uses_external_data(tensor):
            continue
        try:
            info = ExternalDataInfo(tensor)
        except ValueError as e:  # an offset or length that is not an integer >= 0
            raise ModelError(f"{str(path)!r} records malformed external data for tensor {tensor.name!r}: {e}") from e
        file = folder / info.location
        if not file.is_file():
            missing.setdefault(str(file), []).append(tensor.name)
            continue
        size, offset = file.stat().st_size, info.offset or 0
        if offset + (info.length or 0) > size:
            length = "" if info.length is None else f", length {info.length}"
            past_end.append(f"tensor {tensor.name!r} past the end of {str(file)!r} (offset {offset}{length}, a file "
                            f"of {size} bytes)")
    if missing:
        files = "; ".join(f"{file!r} (tensors {', '.join(names)})" for file, names in missing.items())
        raise ModelError(
            f"{str(path)!r} keeps weights in external data that is missing: {files}; expected each file "
            "next to the model, under the name the model records (keep the files together when copying)"
        )
    if past_end:
        shown = "; ".join(past_end[:3]) + (f"; and {len(past_end) - 3} more" if len(past_end) > 3 else "")
        raise ModelError(f"{str(path)!r} keeps {shown}; expected the data files saved with the model, whole (a file "
                         "cut short, or another model's, does not hold its tensors)")


def _parse(path: Path) -> onnx.ModelProto:
    """The model in `path` without its external data: an ONNX protobuf, else the extension's text format."""
    try:
        model = onnx.load_model(str(path), format="protobuf", load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, OSError) as e:
        problem = f"expected an ONNX protobuf: {e}"
        model = None
    else:
        # protobuf parses many foreign files into an empty message instead of failing
        problem = "it has no graph nodes and no outputs"
    if model is not None and _has_graph(model):
        return model
    text_format = onnx.serialization.registry.get_format_from_file_extension(path.suffix.lower())
    if text_format in (None, "protobuf"):
        raise ModelError(f"{str(path)!r} is not a readable ONNX model ({problem})")
    try:
        model = onnx.load_model(str(path), format=text_format, load_external_data=False)
    except (json_format.ParseError, text_format_module.ParseError, onnx.parser.ParseError, ValueError) as e:
        # the text parser's first line names the problem; the rest lists every field of ModelProto
        detail = (str(e).strip() or type(e).__name__).splitlines()[0]
        raise ModelError(
            f"{str(path)!r} is not a readable ONNX model: it is neither an ONNX protobuf nor ONNX "
            f"{text_format} (the text format of {path.suffix} files): {detail}"
        ) from e
    if not _has_graph(model):
        raise ModelError(f"{str(path)!r} is not an ONNX model: it has no graph nodes and no outputs")
    return model


def _has_graph(model: onnx.ModelProto) -> bool:
    return bool(len(model.graph.node) or model.graph.output)


# ONNX Runtime's own ops that it registers in ONNX's domain (ORT's optimizers write them there), which the checker does
# not know: RMSNorm of the LLaMA family after a fusion or ORT's basic optimizations.
ORT_ONNX_DOMAIN_OPS = ("SimplifiedLayerNormalization",)
_MS_DOMAIN = "com.microsoft"


def check_model(model: onnx.ModelProto | str | Path, *, source: str = "model") -> None:
    """Runs `onnx.checker.check_model`, raising `ModelError` naming the model on failure. ORT's ops in ONNX's domain
    (`ORT_ONNX_DOMAIN_OPS`) are checked as the contrib ops they are: wired, their schema left to ONNX Runtime."""
    try:
        onnx.checker.check_model(str(model) if isinstance(model, Path) else model)
    except onnx.checker.ValidationError as e:
        if not any(f"No Op registered for {op} " in str(e) for op in ORT_ONNX_DOMAIN_OPS):
            raise ModelError(f"{source} fails the ONNX checker: {e}") from e
        contrib = _ort_domain_ops_as_contrib(model)
        if isinstance(model, onnx.ModelProto):
            check_model(contrib, source=source)
            return
        # The checker finds external data relative to the model's file: the copy is checked from beside it (its
        # graph only, the weights where they are); where that folder is read-only, without the external weights.
        try:
            with tempfile.NamedTemporaryFile(dir=Path(model).parent, prefix=".check-", suffix=".onnx") as beside:
                onnx.save_model(contrib, beside.name)
                check_model(Path(beside.name), source=source)
        except OSError:
            check_model(_external_weights_as_inputs(contrib), source=source)


def _ort_domain_ops_as_contrib(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """A copy of `model` (its weights not loaded) whose `ORT_ONNX_DOMAIN_OPS` nodes are in ORT's contrib domain."""
    copy = onnx.ModelProto()
    if isinstance(model, onnx.ModelProto):
        copy.CopyFrom(model)
    else:
        copy = onnx.load_model(str(model), load_external_data=False)
    for node in copy.graph.node:
        if node.op_type in ORT_ONNX_DOMAIN_OPS and node.domain in ("", "ai.onnx"):
            node.domain = _MS_DOMAIN
    if not any(o.domain == _MS_DOMAIN for o in copy.opset_import):
        copy.opset_import.append(onnx.helper.make_opsetid(_MS_DOMAIN, 1))
    return copy


def _external_weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` (changed in place) with each initializer whose data is external made a graph input of its type and
    shape: the graph is checked without reading its weights."""
    external = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    for tensor in external:
        model.graph.initializer.remove(tensor)
        model.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    return model


def model_bytes(model: onnx.ModelProto) -> int:
    """Serialized size of an in-memory model (its external data excluded)."""
    return int(model.ByteSize())


_STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def ort_can_load(model: onnx.ModelProto) -> bool:
    """False for a custom-domain op without a model-local function: ONNX Runtime cannot load it."""
    return not _ort_unknown_ops(model)


def check_ort_ops(model: onnx.ModelProto, *, source: str = "model") -> None:
    """Raises `UnsupportedOpError` naming each op ONNX Runtime cannot load (see `ort_can_load`)."""
    unknown = _ort_unknown_ops(model)
    if unknown:
        ops = ", ".join(f"op {op!r} of domain {domain!r}" for domain, op in unknown)
        raise UnsupportedOpError(
            f"ONNX Runtime cannot load {source}: it has no kernel for {ops}; it runs the ops of domains "
            f"{', '.join(repr(d) for d in _STANDARD_DOMAINS)} ('' is ai.onnx) and the model's local functions"
        )


def _ort_unknown_ops(model: onnx.ModelProto) -> list[tuple[str, str]]:
    local = {(f.domain, f.name) for f in model.functions}
    keys = dict.fromkeys((n.domain, n.op_type) for n in model.graph.node)
    return [key for key in keys if key[0] not in _STANDARD_DOMAINS and key not in local]


def load_graph(path: str | Path) -> onnx.ModelProto:
    """The model at `path` without its weights' values (names, types and shapes stay): what an entry's
    `requires` looks at, cheap to keep for a model of any size."""
    model = load_model(path, load_external_data=False, check=False)
    for tensor in model.graph.initializer:
        for values in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            tensor.ClearField(values)
    return model


def save_model(model: onnx.ModelProto, folder: Path) -> Path:
    """Saves a model held in memory as `folder/source.onnx` (the folder made if needed); returns its path."""
    path = folder / "source.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path
