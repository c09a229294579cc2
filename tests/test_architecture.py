"""The architecture, checked by import-linter's contracts in pyproject.toml: the layers (a package imports only
from below), only `tracker/store/` imports MLflow, nothing below the study imports it, and no import cycles between
siblings. Each contract is shown to fail on the import it forbids, in a copy of the library. A search strategy takes no
callable (it proposes; the study measures). No private MLflow name is used, and tests leave MLflow's process globals
alone. Then the size limits: no module over 350 lines and no package with more than 12 modules."""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tracker.search import ForwardSearch
from tracker.search.decode_search import DecodeSearch

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
MAX_MODULE_LINES = 350
MAX_PACKAGE_MODULES = 12


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """`lint-imports` on the library under `root`, with `root`'s pyproject.toml."""
    return subprocess.run([str(LINT_IMPORTS), str(root / "pyproject.toml"), "--no-cache"],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "COLUMNS": "400"},
                          capture_output=True, text=True, timeout=300)


def test_the_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        pytest.param("base/errors.py", "import tracker.api\n", "Layers of the library", id="base imports api"),
        pytest.param("profile/columns.py", "def f():\n    from tracker.measure.attempt import Attempt\n",
                     "Layers of the library", id="a function-level import up a layer"),
        pytest.param("measure/timing/latency.py", "from tracker.measure.runtimes import ort_runtime\n",
                     "Layers of measure/", id="timing imports runtimes"),
        pytest.param("report/page.py", "import mlflow\n", "Only tracker.store talks to MLflow", id="report imports mlflow"),
        pytest.param("optimize/ort_optimizer.py", "from tracker.optimize import fp16\n", "No import cycles",
                     id="a cycle between siblings"),
        pytest.param("search/run.py", "def f():\n    from tracker.study import Study\n", "Nothing below the study",
                     id="the search calls the study"),
    ],
)
def test_an_added_import_breaks_its_contract(tmp_path, module, line, broken):
    shutil.copytree(ROOT / "tracker", tmp_path / "tracker", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    path = tmp_path / "tracker" / module
    path.write_text(path.read_text() + "\n" + line)
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    verdicts = [line for line in result.stdout.splitlines() if line.endswith((" KEPT", " BROKEN"))]
    assert len(verdicts) == 5, result.stdout
    assert any(line.startswith(broken) and line.endswith(" BROKEN") for line in verdicts), result.stdout


@pytest.mark.parametrize("strategy", [ForwardSearch, DecodeSearch])
def test_a_search_strategy_takes_no_callable(strategy):
    taken = {name: str(p.annotation) for name, p in inspect.signature(strategy).parameters.items()}
    assert taken and not [name for name, annotation in taken.items() if "Callable" in annotation
                          or annotation in ("Optimize", "object")], taken
    assert [name for name, _ in inspect.getmembers(strategy, inspect.isfunction)
            if name in ("proposals", "record", "result")] == ["proposals", "record", "result"]


def test_no_module_is_over_350_lines_and_no_package_holds_more_than_12_modules():
    library = ROOT / "tracker"
    long = {str(p.relative_to(ROOT)): n for p in library.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {long}"
    crowded = {str(d.relative_to(ROOT)): n for d in [library, *library.rglob("*")] if d.is_dir()
               and (n := len([p for p in d.glob("*.py") if p.name != "__init__.py"])) > MAX_PACKAGE_MODULES}
    assert not crowded, f"packages with more than {MAX_PACKAGE_MODULES} modules (split them): {crowded}"


PRIVATE_MLFLOW = re.compile(r"\bmlflow(\.\w+)*\._\w|from mlflow[\w.]* import [^\n]*\b_\w")
MLFLOW_GLOBALS = re.compile(r"\bmlflow\.(set_tracking_uri|set_experiment)\(")


def test_no_private_mlflow_name_is_used_and_tests_leave_mlflows_process_globals_alone():
    """MLflow's private names change without notice, and its process-global URI and experiment (`set_tracking_uri`,
    `set_experiment`) cannot be undone through its public API: tests choose their store by MLFLOW_TRACKING_URI, which
    monkeypatch undoes. The one call left is the tracker's own, where a caller set another store
    (`store.connect.setup_tracking`)."""
    sources = [p for folder in ("tracker", "tests", "experiments", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    private = [f"{p.relative_to(ROOT)}:{n}" for p in sources
               for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if PRIVATE_MLFLOW.search(line)]
    assert not private, f"private MLflow names used: {private}"
    setting = [f"{p.relative_to(ROOT)}:{n}" for p in sources if p.name != "connect.py"
               for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if MLFLOW_GLOBALS.search(line)]
    assert not setting, f"MLflow's process globals set (use MLFLOW_TRACKING_URI, or an experiment id): {setting}"
