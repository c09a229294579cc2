"""Tests of tracker.measure.inputs.feed_files: what a feeds file may hold is checked from its headers before any data is
read (names, dtypes, shapes, memory), and unicode arrays feed string inputs without unpickling."""

from __future__ import annotations

import pathlib
import zipfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from probe_common import npy_header  # benchmarks/probe_common.py (pytest pythonpath)

from tests.models import make_linear_model, string_model
from tracker.base.errors import FeedError
from tracker.measure.inputs.feed_files import load_feeds

HUGE = (10**12, 8)  # float32: 29.1 TiB


@pytest.fixture(scope="module")
def linear() -> onnx.ModelProto:
    """Y = X @ A + B, X: float32 [N, 8]."""
    return make_linear_model(n_features=8)


def write_npz(path: pathlib.Path, members: dict[str, bytes | np.ndarray]) -> None:
    """A .npz as numpy.savez writes it, with members given as arrays or as raw .npy bytes."""
    import io

    with zipfile.ZipFile(path, "w") as archive:
        for name, content in members.items():
            if isinstance(content, np.ndarray):
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, content)
                content = buffer.getvalue()
            archive.writestr(f"{name}.npy", content)


def _error(path, model, **kwargs) -> str:
    with pytest.raises(FeedError) as info:
        load_feeds(path, model, **kwargs)
    return str(info.value)


# Memory: the headers decide, before anything is read.

def test_a_npy_whose_header_declares_more_than_memory_is_refused_before_reading(linear, tmp_path):
    path = tmp_path / "x.npy"
    path.write_bytes(npy_header(HUGE))  # 128 bytes that claim 29 TiB
    message = _error(path, linear)
    assert message.startswith(f"feeds file {str(path)!r}: feeds of these sizes would take 29.1 TiB")
    assert "X: float32[1000000000000, 8]" in message and "a quarter of the memory available now" in message
    assert "nothing was read" in message


def test_an_npz_input_whose_header_declares_more_than_the_limit_is_refused(linear, tmp_path):
    path = tmp_path / "feeds.npz"
    write_npz(path, {"X": npy_header(HUGE)})
    assert "would take 29.1 TiB" in _error(path, linear)
    np.savez(path, X=np.ones((4, 8), np.float32))  # 128 bytes
    message = _error(path, linear, max_bytes=100)
    assert "would take 128 B (X: float32[4, 8] = 128 B), more than the limit of 100 B" in message


@pytest.mark.parametrize("unused", [
    pytest.param(npy_header(HUGE), id="declares-29-TiB"),
    pytest.param(npy_header((2, 8), body=b"garbage"), id="corrupt-data"),
    pytest.param(b"not even a .npy header", id="not-npy"),
])
def test_a_member_that_is_not_an_input_is_named_and_never_read(linear, tmp_path, unused):
    path = tmp_path / "feeds.npz"
    write_npz(path, {"X": np.ones((2, 8), np.float32), "unused": unused})
    message = _error(path, linear)
    assert message.startswith(f"feeds file {str(path)!r}: feeds do not match the model: unknown inputs ['unused']")
    assert "(model expects X: float32['N', 8])" in message


def test_a_dtype_or_shape_mismatch_is_found_from_the_header_before_the_data(linear, tmp_path):
    path = tmp_path / "feeds.npz"
    write_npz(path, {"X": npy_header((3, 9), "<f8")})  # no data at all: reading it would fail differently
    message = _error(path, linear)
    assert "'X' has dtype float64, expected float32" in message and "'X' has size 9 on axis 1, expected 8" in message


def test_a_header_that_lies_about_its_data_is_a_read_error_naming_the_array(linear, tmp_path):
    path = tmp_path / "feeds.npz"
    write_npz(path, {"X": npy_header((2, 8), body=b"short")})
    assert "cannot read array 'X' of feeds file" in _error(path, linear)


def test_compressed_and_plain_archives_give_the_same_feeds(linear, tmp_path):
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    np.savez(tmp_path / "plain.npz", X=x)
    np.savez_compressed(tmp_path / "small.npz", X=x)
    for name in ("plain.npz", "small.npz"):
        np.testing.assert_array_equal(load_feeds(tmp_path / name, linear)["X"], x)


# Strings.

@pytest.mark.parametrize("save", [
    pytest.param(lambda path, x: np.savez(path, color=x), id="npz"),
    pytest.param(lambda path, x: np.save(path, x), id="npy"),
    pytest.param(lambda path, x: np.savez_compressed(path, color=x), id="compressed-npz"),
])
def test_unicode_arrays_feed_string_inputs_as_object_arrays_of_str(tmp_path, save):
    path = tmp_path / "feeds.npz"
    save(path, np.array(["red", "blue", "pink"]))
    if path.with_suffix(".npz.npy").exists():
        path.with_suffix(".npz.npy").rename(path)
    feeds = load_feeds(path, string_model())
    assert feeds["color"].dtype == object and list(feeds["color"]) == ["red", "blue", "pink"]
    assert all(type(v) is str for v in feeds["color"])
    session = ort.InferenceSession(string_model().SerializeToString(), providers=["CPUExecutionProvider"])
    ids, french = session.run(None, feeds)
    assert ids.tolist() == [0, 2, -1] and french.tolist() == ["rouge", "bleu", "?"]


def test_bytes_for_a_string_input_are_refused_saying_what_strings_are(tmp_path):
    np.savez(tmp_path / "feeds.npz", color=np.array([b"red"]))
    message = _error(tmp_path / "feeds.npz", string_model())
    assert "'color' has dtype |S3, expected object (strings:" in message
    assert "(model expects color: string['N'])" in message


def test_a_string_array_is_counted_with_the_python_strings_it_becomes(tmp_path):
    np.savez(tmp_path / "feeds.npz", color=np.array(["red", "blue"]))  # <U4: 2 x 16 bytes, and 2 str objects
    message = _error(tmp_path / "feeds.npz", string_model(), max_bytes=100)
    assert "color: <U4[2] = 160 B" in message
