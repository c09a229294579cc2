"""Only `tracker/store/` imports MLflow: everything else is testable without a tracking store."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "tracker" / "store"
CHECKED = ("tracker", "experiments")


def mlflow_imports(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, statement) of every import of `mlflow` or a submodule of it, at any depth (functions too)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == "mlflow" or name.startswith("mlflow.") for name in names):
            found.append((node.lineno, ast.unparse(node)))
    return found


def modules_outside_the_store() -> list[Path]:
    paths = sorted(p for folder in CHECKED for p in (ROOT / folder).rglob("*.py"))
    return [p for p in paths if STORE not in p.parents]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import mlflow\n", [1], id="import mlflow"),
        pytest.param("import os, mlflow.tracking as t\n", [1], id="a submodule among others"),
        pytest.param("from mlflow import MlflowClient\n", [1], id="from mlflow"),
        pytest.param("def f():\n    from mlflow.entities import Run\n", [2], id="inside a function"),
        pytest.param("import mlflow_like\nfrom tracker.store import write\nfrom . import mlflow\n", [],
                     id="other modules of similar names"),
    ],
)
def test_the_check_finds_every_form_of_an_mlflow_import(source, expected):
    assert [line for line, _ in mlflow_imports(source, "example.py")] == expected


def test_no_module_outside_tracker_store_imports_mlflow():
    modules = modules_outside_the_store()
    assert len(modules) > 20  # the walk found the library, not an empty folder
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {statement}"
        for path in modules
        for line, statement in mlflow_imports(path.read_text(encoding="utf-8"), str(path))
    ]
    assert not offenders, (
        "only tracker/store/ may import mlflow; move the MLflow call into a store function:\n" + "\n".join(offenders)
    )
