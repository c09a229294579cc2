"""The library type-checks: mypy, run as pyproject.toml's [tool.mypy] configures it, finds nothing in tracker/.
The settings that make it strict are shown to report what they are for, so a config mypy stopped reading fails. And
the repository lints: ruff, as [tool.ruff] configures it, finds nothing anywhere."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def mypy(*args: str) -> subprocess.CompletedProcess:
    """The venv's mypy in the repository root, where it reads pyproject.toml."""
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing_in_the_repository():
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "."], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_reads_the_config_and_reports_an_unused_import(tmp_path):
    (tmp_path / "snippet.py").write_text("import os\n")
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--config", str(ROOT / "pyproject.toml"),
                             str(tmp_path / "snippet.py")], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and "F401" in result.stdout, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_finds_no_error_in_the_library():
    result = mypy()
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("code", "reported"),
    [
        pytest.param("def f():\n    x: int = 'text'\n", "[assignment]", id="check_untyped_defs"),
        pytest.param("x = 1  # type: ignore[assignment]\n", "[unused-ignore]", id="warn_unused_ignores"),
        pytest.param("def f(x: int = None) -> None: ...\n", "[assignment]", id="no_implicit_optional"),
    ],
)
def test_the_config_reports_what_its_settings_are_for(code, reported, tmp_path):
    (tmp_path / "snippet.py").write_text(code)
    result = mypy(str(tmp_path / "snippet.py"))  # a file named here is checked instead of the config's `files`
    assert result.returncode == 1, result.stdout + result.stderr
    assert reported in result.stdout, result.stdout + result.stderr
