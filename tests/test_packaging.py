"""The project's own files agree: pyproject vs python_env.yaml and conda.yaml, MLproject entry points, README vs CI."""

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


def test_python_env_yaml_pins_the_same_dependencies_as_pyproject_and_an_exact_python():
    python_env = yaml.safe_load((ROOT / "python_env.yaml").read_text())
    assert sorted(python_env["dependencies"]) == sorted(pyproject()["project"]["dependencies"])
    # A bare "3.11" makes MLflow ask pyenv for the newest 3.11.x it knows, which pyenv must download.
    assert re.fullmatch(r"3\.11\.\d+", python_env["python"]), python_env["python"]
    assert pyproject()["project"]["requires-python"] == ">=3.11"
    assert python_env["build_dependencies"] == ["pip"]


def test_mlproject_runs_in_python_env_yaml_and_its_entry_points_have_typed_parameters_and_existing_scripts():
    project = yaml.safe_load((ROOT / "MLproject").read_text())
    # python_env makes a bare `mlflow run .` use virtualenv (no conda needed); conda_env would make it conda.
    assert project["python_env"] == "python_env.yaml"
    assert "conda_env" not in project
    entries = project["entry_points"]
    assert {"main", "linreg", "fusion", "gpt2"} <= set(entries)
    for name, entry in entries.items():
        for param, spec in entry["parameters"].items():
            assert spec["type"] in ("int", "float", "string", "path"), (name, param)
            assert f"{{{param}}}" in entry["command"], f"{name}: parameter {param} is not passed on"
        # `-m` from the project folder: MLflow's environment holds the dependencies, not the tracker; the
        # weights on huge pages, for the speed-up's interval.
        module = re.match(r"GLIBC_TUNABLES=glibc\.malloc\.hugetlb=1 python -m (experiments\.\w+) ",
                          entry["command"]).group(1)
        assert (ROOT / (module.replace(".", "/") + ".py")).is_file(), module


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    main_command, test_command = blocks[0].strip(), blocks[1].strip()
    assert "mlflow run ." in main_command and "--env-manager" not in main_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_the_console_script_points_at_the_cli():
    assert pyproject()["project"]["scripts"]["tracker"] == "tracker.cli:main"
