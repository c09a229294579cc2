"""The project's own files agree: pyproject vs conda.yaml, MLproject entry points, README vs CI."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_conda_yaml_pins_the_same_dependencies_as_pyproject():
    conda = yaml.safe_load((ROOT / "conda.yaml").read_text())
    pip_section = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_deps = sorted(d for d in pip_section if not d.startswith("-e"))
    assert conda_deps == sorted(pyproject()["project"]["dependencies"])
    python = next(d for d in conda["dependencies"] if isinstance(d, str) and d.startswith("python="))
    assert pyproject()["project"]["requires-python"] == ">=" + python.split("=")[1]


def test_mlproject_entry_points_have_typed_parameters_and_existing_scripts():
    project = yaml.safe_load((ROOT / "MLproject").read_text())
    assert project["conda_env"] == "conda.yaml"
    entries = project["entry_points"]
    assert {"main", "linreg", "fusion"} <= set(entries)
    for name, entry in entries.items():
        for param, spec in entry["parameters"].items():
            assert spec["type"] in ("int", "float", "string", "path"), (name, param)
            assert f"{{{param}}}" in entry["command"], f"{name}: parameter {param} is not passed on"
        script = re.search(r"python (\S+\.py)", entry["command"]).group(1)
        assert (ROOT / script).is_file(), script


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    main_command, test_command = blocks[0].strip(), blocks[1].strip()
    assert "mlflow run ." in main_command and "--env-manager local" in main_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_the_console_script_points_at_the_cli():
    assert pyproject()["project"]["scripts"]["tracker"] == "tracker.cli:main"
