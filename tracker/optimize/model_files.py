"""The model files entries read and write: the output path beside a source, one protobuf file or external data
when too large for one, copies, and the state of a source's files that an entry must leave unchanged.
"""

from __future__ import annotations

from pathlib import Path

import onnx

# Protobuf cannot serialize a message of 2 GiB or more: only then must weights go to an external file.
_PROTOBUF_LIMIT_BYTES = 2**31 - 1


def files_state(source: Path) -> tuple:
    """Size and modification time of a model file and of the files beside it that it may point at: what an
    entry must leave as it found them."""
    source = Path(source)
    beside = sorted(p for p in source.parent.glob(f"{source.name}*") if p.is_file())
    return tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in beside)


def prepare_output(source: Path, target_dir: Path, name: str) -> Path:
    """Checks `source` exists and returns `target_dir/<name>.onnx` (creating the folder).

    Raises:
        ValueError: `source` is not a file, or the output would overwrite it.
    """
    source = Path(source)
    if not source.is_file():
        raise ValueError(f"source model must be an existing .onnx file, got {source}")
    target_dir = Path(target_dir)
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}.onnx"
    if target.resolve() == source.resolve():
        raise ValueError(f"the output of {name!r} would overwrite its source {source}: pick another target_dir")
    return target


def needs_external_data(model: onnx.ModelProto) -> bool:
    """True when `model` is too large for one protobuf file."""
    return model.ByteSize() >= _PROTOBUF_LIMIT_BYTES


def save_proto(model: onnx.ModelProto, path: Path) -> None:
    """Saves `model` as one file, or with its weights in `<path>.data` when it is too large for one."""
    if needs_external_data(model):
        onnx.save_model(model, str(path), save_as_external_data=True, location=f"{path.name}.data")
    else:
        onnx.save_model(model, str(path))


def copy_model(source: Path, target: Path) -> None:
    """Writes an unchanged copy of `source` (external data included) to `target`."""
    save_proto(onnx.load_model(str(source), load_external_data=True), target)
