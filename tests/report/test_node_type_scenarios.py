"""Each scenario's best attempt per node type, from rows of two node types whose metrics are written by hand:
the tags the study run gets, the scenarios and generation tables, and `tracker compare`'s scenario lines."""

from __future__ import annotations

from tracker.base.keys import TAG_NODE_TYPE, TAG_VERDICT
from tracker.base.vocabulary import Phase
from tracker.compare import Comparison, format_table
from tracker.measure import schema
from tracker.measure.schema import Scope
from tracker.measure.timing.speedup import Speedup
from tracker.report.rows import AttemptRow, attempt_rows, best_by_node_type, row_from_content
from tracker.report.scenarios import generation_table, node_type_bests, scenario_tags, scenarios_table

DECODE = Scope(Phase.DECODE, 32)


def row(name: str, node_type: str, verdict: str, forward: float, decode: float | None) -> AttemptRow:
    """An attempt on `node_type` with its forward and decode speed-ups (None: the baseline, not timed against
    itself), each with a +-0.05 interval."""
    metrics = {schema.GEN_DIFF_PASSED: 1.0, DECODE.prefix + "p50_ms": 5.0, DECODE.prefix + "roofline.memory_bound": 1.0,
               **schema.speedup_metrics(Speedup(forward, forward - 0.05, forward + 0.05, 0.95, 8, rounds=4, mde=0.03))}
    if decode is not None:
        metrics |= schema.speedup_metrics(Speedup(decode, decode - 0.05, decode + 0.05, 0.95, 8, rounds=4, mde=0.03),
                                          DECODE)
    return row_from_content(name, metrics=metrics, tags={TAG_VERDICT: verdict, TAG_NODE_TYPE: node_type})


# On m5, `a` is the best in both scenarios; on c7, `b`. Over all rows, `a`'s 2.0x decode is the largest.
ROWS = [
    row("baseline", "m5", "baseline", 1.0, None),
    row("baseline", "c7", "baseline", 1.0, None),
    row("a", "m5", "better", 1.5, 2.0),
    row("a", "c7", "better", 1.1, 0.9),
    row("b", "m5", "better", 1.2, 1.1),
    row("b", "c7", "better", 1.4, 1.6),
]


def test_each_node_type_has_its_own_best_in_each_scenario():
    assert node_type_bests(ROWS) == {"m5": {"forward": "a", "decode": "a"}, "c7": {"forward": "b", "decode": "b"}}
    assert best_by_node_type(ROWS) == {"m5": "a", "c7": "b"}


def test_the_study_run_gets_a_tag_per_scenario_and_node_type_beside_the_overall_ones():
    assert scenario_tags(ROWS) == {
        "tracker.best_attempt.decode": "a",
        "tracker.best_attempt.node_type.m5": "a", "tracker.best_attempt.decode.node_type.m5": "a",
        "tracker.best_attempt.node_type.c7": "b", "tracker.best_attempt.decode.node_type.c7": "b",
    }


def test_the_scenario_tables_have_one_part_per_node_type():
    scenarios = scenarios_table(ROWS)
    assert scenarios[["node_type", "scenario", "best"]].values.tolist() == [
        ["m5", "forward", "a"], ["m5", "decode", "a"], ["c7", "forward", "b"], ["c7", "decode", "b"]]
    assert scenarios["speedup"].tolist() == [1.5, 2.0, 1.4, 1.6]
    generation = generation_table(ROWS)
    assert generation[["node_type", "attempt", "speedup"]].values.tolist() == [
        ["m5", "baseline", 1.0], ["m5", "a", 2.0], ["m5", "b", 1.1],
        ["c7", "baseline", 1.0], ["c7", "a", 0.9], ["c7", "b", 1.6]]


def test_compare_says_each_node_types_best_in_each_scenario():
    rows = attempt_rows(ROWS)
    text = format_table(Comparison("Study s", rows, best="a", best_by_node_type=best_by_node_type(rows)))
    lines = text.splitlines()
    assert lines[0] == "Study s: 6 attempts, best per node type: m5: a; c7: b"
    assert "decode on m5 (one token after a past of 32): best a 2.000x [1.950, 2.050], bound by memory" in lines
    assert "decode on c7 (one token after a past of 32): best b 1.600x [1.550, 1.650], bound by memory" in lines


def test_rows_of_one_node_type_keep_the_tags_and_tables_of_a_local_study():
    one = [r for r in ROWS if r.node_type == "m5"]
    local = [row_from_content(r.attempt, metrics={}, tags={}) for r in one]  # only the shape matters here
    assert scenario_tags(one) == {"tracker.best_attempt.decode": "a"}
    assert list(scenarios_table(one).columns) == list(scenarios_table(local).columns)
    assert "node_type" not in generation_table(one).columns
