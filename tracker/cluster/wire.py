"""What travels between the driver and a node, as bytes through Ray's object store: an attempt's model files out,
its record back in the outbox's format (`tracker.run.record`: `record.json` and the files it names, in one tar); a
search candidate's model files out, its screen's figures back."""

from __future__ import annotations

import io
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from tracker.base.errors import RecordError
from tracker.base.model_io import load_model
from tracker.base.terminal import one_line
from tracker.measure.attempt import Attempt
from tracker.measure.runtimes.ort_runtime import SessionConfig
from tracker.measure.timing.speedup import SpeedupConfig
from tracker.optimize import Candidate
from tracker.run.loading import load_record
from tracker.run.record import AttemptRecord, save_record

MODEL_FILE = "model.onnx"  # the name of a model that travels from memory


@dataclass(frozen=True)
class ModelFiles:
    """A model as the bytes of its files: the model file, and its external data files by their location."""

    name: str
    files: dict[str, bytes] = field(repr=False)

    @classmethod
    def of(cls, model: onnx.ModelProto | Path) -> ModelFiles:
        """The files of a model in memory (serialized, under `MODEL_FILE`) or on disk (with its external data)."""
        if isinstance(model, onnx.ModelProto):
            return cls(MODEL_FILE, {MODEL_FILE: model.SerializeToString()})
        graph = load_model(model, load_external_data=False, check=False)
        locations = {e.value for t in graph.graph.initializer for e in t.external_data if e.key == "location"}
        files = {name: (model.parent / name).read_bytes() for name in sorted(locations)}
        return cls(model.name, {model.name: model.read_bytes(), **files})

    @property
    def size_bytes(self) -> int:
        return sum(len(data) for data in self.files.values())

    def write(self, folder: Path) -> Path:
        """Writes the files into `folder` (made if missing); returns the model file's path."""
        for name, data in self.files.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return folder / self.name


@dataclass(frozen=True)
class Job:
    """One measurement of an attempt on one node: the attempt (its model travels beside it as `ModelFiles`: here
    `attempt.model` is only the model file's name), the tags of its run, and whether it is the node's baseline of
    its runtime (every later attempt of the runtime on that node is judged against it)."""

    seq: int
    attempt: Attempt
    tags: dict[str, str]
    baseline: bool


@dataclass(frozen=True)
class ScreenJob:
    """A search's speed screen of one candidate on one node, against that node's baseline (`NodeMeasurer.screen`):
    the candidate (its model travels beside it: here `candidate.path` is only the model file's name), the session
    settings, the screen's length and the bar it must beat (racing)."""

    seq: int
    candidate: Candidate
    session: SessionConfig
    config: SpeedupConfig
    must_beat: float | None


@dataclass(frozen=True)
class Returned:
    """What a node sends back: the packed record (`pack_record`) and the seconds per measuring step."""

    record: bytes = field(repr=False)
    steps: dict[str, float]


def pack_record(record: AttemptRecord) -> bytes:
    """A record and the files it names, as the outbox keeps them (`save_record`), in one uncompressed tar (the
    models' weights do not compress)."""
    with tempfile.TemporaryDirectory(prefix="tracker-pack-") as tmp:
        folder = save_record(record, Path(tmp))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(folder, arcname=".")
        return buffer.getvalue()


def unpack_record(data: bytes, folder: Path) -> AttemptRecord:
    """The record `pack_record` packed, unpacked into `folder` (new or empty), its paths made absolute.

    Raises:
        RecordError: the archive cannot be unpacked (a damaged or refused member), or the record is malformed or names
            a file outside `folder` (`load_record`'s checks): nothing else.
    """
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(folder, filter="data")  # no links out, no absolute paths, no devices
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as e:
        raise RecordError(f"the record a node returned is not a readable archive ({type(e).__name__}: "
                          f"{one_line(str(e), 200)})") from None
    return load_record(folder)

