"""The top-level `tracker` namespace (`tracker/__init__.py`): every public name imports on first use, and it holds what
the docs' examples take from it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tracker
from tracker.measure.accuracy.task_diff import task_tolerances

ROOT = Path(__file__).resolve().parents[2]
PYTHON_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def examples_names() -> set[str]:
    """The names the Python examples of README.md and docs/*.md take from `tracker`: `from tracker import A, B` and
    `tracker.A` (not a submodule's `tracker.optimize.REGISTRY`)."""
    names: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in PYTHON_BLOCK.findall(page.read_text(encoding="utf-8")):
            for imported in re.findall(r"^from tracker import (.+)$", block, flags=re.M):
                names.update(n.strip() for n in imported.strip("()").split(","))
            names.update(re.findall(r"\btracker\.(\w+)(?![\w.])", block))
    return names


@pytest.mark.parametrize("name", tracker.__all__)
def test_every_public_name_imports(name):
    assert getattr(tracker, name) is not None


def test_the_docs_examples_take_only_exported_names_from_tracker():
    used = examples_names()

    assert {"Study", "ModelInfo", "SearchConfig", "tolerances"} <= used  # the examples are found
    assert sorted(used - set(tracker.__all__)) == []


def test_tolerances_are_the_tasks_tolerances_per_precision():
    assert tracker.tolerances("embedding") == task_tolerances("embedding")
    with pytest.raises(ValueError, match="unknown task 'segmentation'; known tasks: "):
        tracker.tolerances("segmentation")


def test_a_name_that_is_not_exported_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'tracker' has no attribute 'task_tolerances'"):
        tracker.task_tolerances  # noqa: B018 -- reading it is the test
