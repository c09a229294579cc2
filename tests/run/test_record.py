"""`record.json`, the file an outbox keeps per attempt: what earlier versions wrote still loads, and a record with
a wrong type or an unknown field is refused with the field named."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from tracker.base.errors import RecordError
from tracker.run.loading import load_record
from tracker.run.record import RECORD_FILE, AttemptRecord, save_record

# Written by `save_record` when `AttemptRecord` was a dataclass checked by hand (commit 10f83bf): every field
# set, a NaN metric, feeds, a table, a file and a model.
WRITTEN_BEFORE = Path(__file__).parents[1] / "fixtures" / "outbox_record" / "linreg-0123456789abcdef" / "fused"


@pytest.fixture
def kept(tmp_path) -> Path:
    """A copy of the fixture record's folder, free to spoil."""
    return Path(shutil.copytree(WRITTEN_BEFORE, tmp_path / "fused"))


def _rewrite(folder: Path, change) -> None:
    data = json.loads((folder / RECORD_FILE).read_text())
    change(data)
    (folder / RECORD_FILE).write_text(json.dumps(data))


def test_a_record_written_before_the_struct_loads_with_every_value(kept):
    record = load_record(kept)

    assert isinstance(record, AttemptRecord)
    assert (record.attempt, record.study, record.runtime, record.status) == ("fused", "linreg", "onnxruntime",
                                                                             "FAILED")
    assert record.params == {"opt_level": "99"} and record.tags == {"tracker.kind": "attempt"}
    assert record.metrics["latency.p50_ms"] == 0.25 and math.isnan(record.metrics["diff.max_abs"])
    assert record.metrics["ops.count"] == 1.0 and isinstance(record.metrics["ops.count"], float)
    assert record.feeds.digest == "8b61950c" and record.feeds.inputs[0].describe() == "float32 [1, 2]"
    assert record.artifact_dir == str(kept / "artifacts") and record.tables == ["ops"]
    assert record.files == {str(kept / "files" / "0" / "profile.json"): "profile"}
    assert record.model_path == str(kept / "model" / "model.onnx") and record.model_flavor is False
    assert (record.error, record.parent_run_id, record.experiment_id, record.run_id) == (
        "RuntimeError: boom", "0123456789abcdef", "1", None)
    assert record.start_time_ms == 1764547200000


def test_saving_a_loaded_record_writes_the_same_file_as_before(kept, tmp_path):
    folder = save_record(load_record(kept), tmp_path / "outbox")

    assert (folder / RECORD_FILE).read_text() == (WRITTEN_BEFORE / RECORD_FILE).read_text()
    assert not list(folder.glob(".*.partial")), "written whole, then renamed into place"


# A spoiled record, and what the one error must say: the field (msgspec's path) and what was expected.
WRONG_TYPES = {
    "flag as text": (lambda d: d.update(model_flavor="yes"), "Expected `bool`, got `str` - at `$.model_flavor`"),
    "metric as text": (lambda d: d["metrics"].update(fast="yes"), "Expected `float`, got `str` - at `$.metrics[...]`"),
    "time as a fraction": (lambda d: d.update(start_time_ms=1.5),
                           "Expected `int | null`, got `float` - at `$.start_time_ms`"),
    "param as a number": (lambda d: d["params"].update(opt_level=99), "Expected `str`, got `int` - at `$.params[...]`"),
    "tables as text": (lambda d: d.update(tables="ops"), "Expected `array`, got `str` - at `$.tables`"),
    "digest as a number": (lambda d: d["feeds"].update(digest=5), "Expected `str`, got `int` - at `$.feeds.digest`"),
    "shape as text": (lambda d: d["feeds"]["inputs"][0].update(shape="1x2"),
                      "Expected `array`, got `str` - at `$.feeds.inputs[0].shape`"),
    "no attempt": (lambda d: d.pop("attempt"), "Object missing required field `attempt`"),
    "feeds as text": (lambda d: d.update(feeds="X float32"), "Expected `object | null`, got `str` - at `$.feeds`"),
}

UNKNOWN_FIELDS = {
    "in the record": (lambda d: d.update(colour="blue"), "Object contains unknown field `colour` - at `$` "
                                                         "(known fields: 'attempt', 'study', 'runtime', "),
    "in the feeds": (lambda d: d["feeds"].update(source="disk"), "Object contains unknown field `source` - at "
                                                                 "`$.feeds` (known fields: 'digest', 'inputs')"),
    "in an input": (lambda d: d["feeds"]["inputs"][0].update(layout="NCHW"),
                    "Object contains unknown field `layout` - at `$.feeds.inputs[0]` (known fields: 'name', "),
    "a misspelt field": (lambda d: d.update(model_flavour=False), "unknown field `model_flavour`"),
}


@pytest.mark.parametrize("change, expected", [*WRONG_TYPES.values(), *UNKNOWN_FIELDS.values()],
                         ids=[*WRONG_TYPES, *UNKNOWN_FIELDS])
def test_a_record_with_a_wrong_type_or_an_unknown_field_is_refused_naming_the_field(kept, change, expected):
    _rewrite(kept, change)

    with pytest.raises(RecordError) as refused:
        load_record(kept)
    assert str(refused.value).startswith(f"record {kept / RECORD_FILE}: ")
    assert expected in str(refused.value)


def test_a_record_that_is_not_an_object_is_refused(kept):
    (kept / RECORD_FILE).write_text("[1, 2]")

    with pytest.raises(RecordError, match="Expected `object`, got `array`"):
        load_record(kept)


def test_a_record_keeps_its_own_empty_collections():
    first, second = AttemptRecord("a", None, "onnxruntime"), AttemptRecord("b", None, "onnxruntime")
    first.metrics["latency.p50_ms"] = 1.0
    first.tables.append("ops")

    assert second.metrics == {} and second.tables == []
