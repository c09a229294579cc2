"""The architecture, checked: only `tracker/store/` imports MLflow (everything else is testable without a
tracking store), and no two modules of the library import each other, directly or around a loop."""

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


def library_imports(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the library modules it imports, at any depth (imports inside functions count too)."""
    modules = {_module_name(p, root): p for p in (root / "tracker").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against this module's package
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other around a loop (strongly connected, more than one)."""
    order, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in order:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], order[target])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return cycles


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_cycle_check_finds_a_loop_through_a_function_level_import(tmp_path):
    package = tmp_path / "tracker"
    (package / "report").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "report" / "__init__.py").write_text("")
    (package / "report" / "rows.py").write_text("def f():\n    from tracker.report.page import g\n")
    (package / "report" / "page.py").write_text("from . import rows\n")
    (package / "keys.py").write_text("import tracker.report.rows\n")
    assert import_cycles(library_imports(tmp_path)) == [["tracker.report.page", "tracker.report.rows"]]


def test_the_library_has_no_import_cycles():
    graph = library_imports()
    assert len(graph) > 40 and graph["tracker.api"]  # the walk found the library and its imports
    assert not import_cycles(graph), "modules that import each other (move the shared part down a layer)"
