"""The wire between a cluster's driver and its nodes, without a cluster: a model's files out (its external data
too), a measured attempt's record and files back in the outbox's format, unchanged."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.conftest import FAST_SPEEDUP
from tracker.base.errors import RecordError
from tracker.cluster.wire import MODEL_FILE, ModelFiles, pack_record, unpack_record
from tracker.measure.attempt import Attempt, MeasureConfig
from tracker.measure.timing.latency import TimingConfig
from tracker.pipeline import AttemptSetup, measure_record

FAST = MeasureConfig(profile_runs=3, timing=TimingConfig(min_runs=3, min_seconds=0.0), speedup=FAST_SPEEDUP)


def test_a_model_with_external_data_travels_as_its_files(tmp_path, model):
    source = tmp_path / "source" / "big.onnx"
    source.parent.mkdir()
    onnx.save_model(model, str(source), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="big.onnx.data", size_threshold=0)

    files = ModelFiles.of(source)
    written = files.write(tmp_path / "node")

    assert set(files.files) == {"big.onnx", "big.onnx.data"} and written == tmp_path / "node" / "big.onnx"
    assert (tmp_path / "node" / "big.onnx.data").read_bytes() == (source.parent / "big.onnx.data").read_bytes()
    assert onnx.load(str(written)) == onnx.load(str(source))


def test_a_model_in_memory_travels_serialized(tmp_path, model):
    written = ModelFiles.of(model).write(tmp_path)

    assert written.name == MODEL_FILE and onnx.load(str(written)) == model


def test_a_measured_record_comes_back_with_every_value_and_file(tmp_path, model, feeds):
    setup = AttemptSetup(config=FAST, study="wire", tags={"tracker.node": "n1"})
    baseline = measure_record(Attempt(name="baseline", model=model), feeds, setup, baselines={},
                              workdir=tmp_path / "baseline").result
    measured = measure_record(Attempt(name="again", model=model), feeds, setup, baselines={"onnxruntime": baseline},
                              workdir=tmp_path / "again")
    sent = measured.record

    back = unpack_record(pack_record(sent), tmp_path / "driver")

    assert (back.attempt, back.study, back.runtime, back.status) == ("again", "wire", "onnxruntime", "FINISHED")
    assert back.params == sent.params and back.tags == sent.tags and back.tags["tracker.node"] == "n1"
    assert back.metrics.keys() == sent.metrics.keys() and "latency.speedup" in back.metrics
    assert all(back.metrics[k] == v or (np.isnan(v) and np.isnan(back.metrics[k])) for k, v in sent.metrics.items())
    assert back.tables == sent.tables and back.feeds == sent.feeds
    assert back.model_path is not None and onnx.load(back.model_path) == model
    assert back.artifact_dir is not None and back.artifact_dir.startswith(str(tmp_path / "driver"))
    assert _tree(back.artifact_dir) == _tree(sent.artifact_dir) and len(_tree(back.artifact_dir)) > 3
    assert [Path(p).name for p in back.files] == [Path(p).name for p in sent.files] and back.files
    assert all(Path(p).read_bytes() == Path(q).read_bytes() for p, q in zip(back.files, sent.files))


def test_a_packed_record_naming_a_file_outside_its_folder_is_refused(tmp_path, model, feeds):
    record = measure_record(Attempt(name="baseline", model=model), feeds, AttemptSetup(config=FAST), baselines={},
                            workdir=tmp_path / "baseline").record
    packed = tmp_path / "packed.tar"
    packed.write_bytes(pack_record(record))
    spoiled = tmp_path / "spoiled.tar"
    with tarfile.open(packed) as source, tarfile.open(spoiled, "w") as target:
        for member in source.getmembers():
            data = source.extractfile(member) if member.isfile() else None
            if member.name.endswith("record.json"):
                text = data.read().replace(b'"model_path": "model/', b'"model_path": "../../model/')
                member.size = len(text)
                data = io.BytesIO(text)
            target.addfile(member, data)

    with pytest.raises(RecordError, match="leaves the record's folder"):
        unpack_record(spoiled.read_bytes(), tmp_path / "driver")


def _tree(folder: str) -> list[tuple[str, bytes]]:
    """Every file under `folder`: its path there and its bytes."""
    return sorted((str(p.relative_to(folder)), p.read_bytes()) for p in Path(folder).rglob("*") if p.is_file())


def _tar_of(members: dict[str, bytes], *, symlink: tuple[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo(symlink[0])
            info.type, info.linkname = tarfile.SYMTYPE, symlink[1]
            tar.addfile(info)
    return buffer.getvalue()


SPOILED = {
    "not an archive": (b"\x00garbage" * 100, "is not a readable archive (ReadError"),
    "cut short": (_tar_of({"record.json": b"{}" * 4000})[:3000], "is not a readable archive"),
    "a link out": (_tar_of({}, symlink=("record.json", "/etc/passwd")), "is not a readable archive"),
    "nested too deep": (_tar_of({"record.json": b"[" * 200_000 + b"]" * 200_000}), "nested too deeply"),
    "no record": (_tar_of({"other.txt": b"x"}), "cannot be read"),
}


@pytest.mark.parametrize("spoiled", list(SPOILED))
def test_a_damaged_record_from_a_node_raises_only_record_error(tmp_path, spoiled):
    data, message = SPOILED[spoiled]
    with pytest.raises(RecordError, match=re.escape(message)):
        unpack_record(data, tmp_path / "driver")
