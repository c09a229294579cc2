"""A search's table (`Rows`): frozen rows, each moved on by a new row in its old one's place."""

import dataclasses

import pytest

from tracker.search.result import Row, Rows


def test_a_row_is_frozen():
    row = Row("int8_dynamic", "Int8Dynamic", "quantization")

    with pytest.raises(dataclasses.FrozenInstanceError):
        row.status = "timed"  # type: ignore[misc]


def test_an_update_puts_the_new_row_in_the_old_ones_place_and_keeps_the_order():
    rows = Rows()
    first = rows.add(Row("a", "A", "quantization"))
    rows.add(Row("b", "B", "transform"))

    moved = rows.update("a", stage="speed_screen", screen_speedup=1.5)

    assert [r.name for r in rows] == ["a", "b"] and rows["a"] is moved
    assert (moved.stage, moved.screen_speedup) == ("speed_screen", 1.5)
    assert (first.stage, first.screen_speedup) == ("applicability", None)  # the old row is as it was


def test_a_reason_added_follows_the_one_it_had():
    rows = Rows()
    rows.add(Row("a", "A", "quantization"))
    rows.add(Row("b", "B", "quantization", reason="accuracy check failed (margin -0.100)"))

    rows.add_reason("a", "not timed: the budget ran out", status="skipped")
    rows.add_reason("b", "speed screen: slower than the leader")

    assert [(r.status, r.reason) for r in rows] == [
        ("skipped", "not timed: the budget ran out"),
        ("screened", "accuracy check failed (margin -0.100); speed screen: slower than the leader")]


def test_an_entry_that_does_not_apply_is_listed_but_is_no_candidate():
    rows = Rows()
    rows.refuse("attention_fused", "attention_fused", "no attention")
    rows.add(Row("int8_dynamic", "Int8Dynamic", "quantization"))

    assert [(r.name, r.kind, r.reason) for r in rows] == [("attention_fused", "", "does not apply: no attention"),
                                                         ("int8_dynamic", "quantization", "")]
    assert "attention_fused" not in rows and "int8_dynamic" in rows and len(rows) == 2


def test_the_rows_iterated_are_those_of_the_moment():
    rows = Rows()
    rows.add(Row("a", "A", "quantization"))
    rows.add(Row("b", "B", "quantization"))

    seen = []
    for row in rows:  # a stage that moves a row on as it goes sees each once, as it was when it began
        rows.update(row.name, status="skipped")
        seen.append(row.status)

    assert seen == ["screened", "screened"] and [r.status for r in rows] == ["skipped", "skipped"]
