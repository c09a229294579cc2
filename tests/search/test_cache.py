"""The search cache, on real sessions and a real sqlite store: a second search of the same model
reuses every check and screen and says so; one weight changed is a miss; a corrupted entry is ignored with a warning;
a folder that cannot be written leaves the search without a cache; `--fresh` needs `--search`; `tracker cache clear`
empties it."""

from __future__ import annotations

import logging
import re
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tests.conftest import FAST_SPEEDUP, isolate_mlflow, seed_sqlite_store
from tests.search.conftest import SENSITIVE, make_sensitive_mlp
from tracker.api import Study
from tracker.cli import main
from tracker.measure.accuracy.task_diff import task_tolerances
from tracker.measure.attempt import MeasureConfig
from tracker.measure.timing.latency import TimingConfig
from tracker.optimize.entry import Entry
from tracker.search import SearchConfig

pytestmark = pytest.mark.slow

FAST = MeasureConfig(profile_runs=3, skip_runs=1, timing=TimingConfig(warmup_runs=1, min_runs=3, min_seconds=0.0),
                     speedup=FAST_SPEEDUP)
SPACE = {"int8_dynamic": {"per_channel": (False, True), "reduce_range": (False,), "weight_type": ("QInt8",),
                          "op_types": ("all",)}}


def _search(store, path: Path, feeds, cache: Path, name: str, *, fresh: bool = False):
    config = SearchConfig(entries=("int8_dynamic", "ort_threads_1"), knobs=SPACE, max_full=1, max_fallbacks=0, max_chains=0,
                          cache_dir=cache, fresh=fresh)
    with Study(name, feeds=feeds, config=FAST, experiment="cached", log_models=False) as study:
        return study.search(path, tolerance=task_tolerances("regression"), config=config)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """The search tests' MLP without its planted weight (its int8 variants pass the regression check), and a cache
    a first search of it filled: (model file, feeds, that cache, the first search's result)."""
    folder = tmp_path_factory.mktemp("cached-mlp")
    model = make_sensitive_mlp()
    w2 = next(t for t in model.graph.initializer if t.name == "W2")
    clean = numpy_helper.to_array(w2).copy()
    clean[0, 0] = 0.1
    w2.CopyFrom(numpy_helper.from_array(clean, "W2"))
    path = folder / "mlp.onnx"
    onnx.save_model(model, str(path))
    feeds = {"X": np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)}
    with pytest.MonkeyPatch.context() as patch:
        uri = seed_sqlite_store(folder / "mlflow.db", tmp_path_factory)
        isolate_mlflow(patch)  # the URI the study exports may not outlive this fixture
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        patch.setenv("TRACKER_OUTBOX", str(folder / "outbox"))
        first = _search(None, path, feeds, folder / "cache", "first")
    return path, feeds, folder / "cache", first


def _copy(cache: Path, tmp_path: Path) -> Path:
    """A test's own copy of the filled cache."""
    shutil.copytree(cache, tmp_path / "cache")
    return tmp_path / "cache"


def _reused(text: str) -> list[str]:
    return re.findall(r"search: (\S+) from the cache", text)


def test_a_second_search_reuses_each_check_and_screen_and_says_so(store, mlp, tmp_path, caplog):
    path, feeds, filled, first = mlp
    checked = sorted(r.name for r in first.rows if r.passed is not None)
    caplog.set_level(logging.INFO, logger="tracker")

    second = _search(store, path, feeds, _copy(filled, tmp_path), "second")

    assert sorted(_reused(caplog.text)) == checked and "ort_threads_1" in checked
    assert not list((tmp_path / "cache").rglob("mlp.onnx")), "a session entry's model is the source: not copied"
    assert f"search cache {tmp_path / 'cache'}: reused {len(checked)} candidate(s)" in caplog.text
    assert ", screen" in caplog.text, "the screens' figures are reused too"
    by_name = {r.name: r for r in first.rows}
    for row in second.rows:
        if row.name in checked and row.screen_speedup is not None and row.stage == "speed_screen":
            assert row.passed == by_name[row.name].passed
    assert {r.status for r in second.rows} >= {"timed"}, "the leader is measured in full again"


def test_the_leader_is_measured_as_the_search_made_it_and_from_the_cache_made_never(store, mlp, tmp_path,
                                                                                      monkeypatch):
    path, feeds, _, _ = mlp
    made: Counter[str] = Counter()
    make = Entry.__call__

    def counted(self, *args, **kwargs):
        made[self.name] += 1
        return make(self, *args, **kwargs)

    monkeypatch.setattr(Entry, "__call__", counted)

    first = _search(store, path, feeds, tmp_path / "cache", "made-once")
    leaders = [r.name for r in first.rows if r.status == "timed"]
    assert leaders and all(made[name] == 1 for name in leaders), (leaders, made)
    best_low = max((r.screen_ci_low, r.name) for r in first.rows if r.passed and r.screen_ci_low is not None)
    if best_low[0] > 1.0:  # a leader beats the baseline on the screen
        assert first.leaders[-1][1] == best_low[1] and first.first_led(best_low[1]) <= first.seconds, first.leaders
    else:
        assert not first.leaders, first.leaders
    assert [s for s, _ in first.leaders] == sorted(s for s, _ in first.leaders)
    made.clear()
    second = _search(store, path, feeds, tmp_path / "cache", "made-never")

    assert [r.name for r in second.rows if r.status == "timed"] == leaders and not made, made
    run = next(r for r in store.search_runs([store.get_experiment_by_name("cached").experiment_id])
               if r.info.run_name == leaders[0] and r.data.tags.get("tracker.role") == "attempt")
    assert run.data.metrics["optimize.seconds"] > 0, "the leader's run logs what making it took, the first time"


def test_the_sensitivity_fallback_is_kept_and_a_second_search_reuses_it(store, sensitive_mlp, tmp_path, caplog):
    path, feeds = sensitive_mlp
    config = SearchConfig(entries=("int8_dynamic",), per_entry=1, max_chains=0, cache_dir=tmp_path / "cache")
    caplog.set_level(logging.INFO, logger="tracker")
    with Study("fallback-first", feeds=feeds, config=FAST, experiment="cached", log_models=False) as study:
        first = study.search(path, tolerance=task_tolerances("regression"), config=config)
    assert "sensitivity of int8_dynamic: block" in caplog.text
    caplog.clear()

    with Study("fallback-again", feeds=feeds, config=FAST, experiment="cached", log_models=False) as study:
        second = study.search(path, tolerance=task_tolerances("regression"), config=config)

    assert "sensitivity of int8_dynamic: block" not in caplog.text, "the leave-one-out runs are not made again"
    assert "int8_dynamic (check, screen, sensitivity)" in caplog.text
    assert [s.kept for s in second.sensitivities] == [s.kept for s in first.sensitivities] == [(SENSITIVE,)]
    assert second.sensitivities[0].rows == first.sensitivities[0].rows  # the report's table, as measured
    assert any(r.name == "int8_dynamic.fp32-1" and r.status == "timed" for r in second.rows)


def test_one_weight_changed_is_a_miss(store, mlp, tmp_path, caplog):
    path, feeds, filled, _ = mlp
    cache = _copy(filled, tmp_path)
    model = onnx.load(str(path))
    weight = numpy_helper.to_array(model.graph.initializer[0]).copy()
    weight[1, 1] += 0.5
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(weight, model.graph.initializer[0].name))
    changed = tmp_path / "changed.onnx"
    onnx.save(model, str(changed))
    caplog.set_level(logging.INFO, logger="tracker")

    _search(store, changed, feeds, cache, "changed")

    assert _reused(caplog.text) == [] and "nothing reused" in caplog.text


def test_a_corrupted_entry_is_ignored_with_a_warning_and_measured_again(store, mlp, tmp_path, caplog):
    path, feeds, filled, _ = mlp
    cache = _copy(filled, tmp_path)
    entries = sorted(cache.glob("*/entry.json"))
    assert len(entries) >= 2
    entries[0].write_text('{"format": 1, "entry": "int8_dynamic", "pass')  # cut off mid-write
    caplog.set_level(logging.INFO, logger="tracker")

    _search(store, path, feeds, cache, "again")

    assert len(_reused(caplog.text)) == len(entries) - 1
    warning = next(r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage())
    assert f"in {entries[0].parent} cannot be read (JSONDecodeError" in warning and "measured again" in warning


def test_a_cache_folder_that_cannot_be_written_leaves_the_search_without_it(store, mlp, tmp_path, caplog):
    path, feeds, _, _ = mlp
    (tmp_path / "a-file").write_text("not a folder")
    caplog.set_level(logging.WARNING, logger="tracker")

    result = _search(store, path, feeds, tmp_path / "a-file" / "cache", "uncached")

    assert any(r.status == "timed" for r in result.rows)
    lines = [r.getMessage() for r in caplog.records if "search cache" in r.getMessage()]
    assert len(lines) == 1 and "cannot be written" in lines[0] and "searching without the cache" in lines[0]


def test_fresh_without_search_is_one_line_and_exit_2(tmp_path, capsys):
    onnx.save_model(make_sensitive_mlp(width=64), str(tmp_path / "mlp.onnx"))

    code = main(["optimize", str(tmp_path / "mlp.onnx"), "--fresh", "--dry-run"])

    err = capsys.readouterr().err
    assert code == 2 and err.strip() == "error: --fresh makes a search ignore its cache: add --search"


def test_cache_clear_empties_the_folder(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    for key in ("a", "b"):
        (cache / key / "model").mkdir(parents=True)
        (cache / key / "model" / "m.onnx").write_bytes(b"0" * 1000)
    monkeypatch.setenv("TRACKER_CACHE", str(cache))

    assert main(["cache", "clear"]) == 0

    assert capsys.readouterr().out.strip() == f"removed 2 search cache entries (0.0 MB) from {cache}"
    assert not list(cache.iterdir())
