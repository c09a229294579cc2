"""The documentation: the site builds with `mkdocs build --strict`, its generated reference lists every name a run
holds, the README stays short and its links into docs/ resolve, and every dependency is explained."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PINNED = ROOT / "tests" / "fixtures" / "linreg_run_names.json"
README_MAX_LINES = 150


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with the venv's mkdocs, warnings as errors."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", "mkdocs.yml",
                           "--site-dir", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text()


def missing_keys(page_html: str, pinned: dict[str, dict[str, list[str]]]) -> list[str]:
    """The pinned names a page does not show as code of their own (`latency.speedup` is not found inside
    `latency.speedup_ci_low`)."""
    shown = set(re.findall(r"<code>([^<]*)</code>", page_html))
    wanted = {html.escape(name, quote=False) for names in pinned.values() for kind in names.values() for name in kind}
    return sorted(html.unescape(name) for name in wanted - shown)


def test_the_site_builds_strictly_and_the_run_contents_page_lists_every_pinned_name(site):
    pinned = json.loads(PINNED.read_text())
    assert sum(len(v) for names in pinned.values() for v in names.values()) > 100
    assert missing_keys(page(site, "reference/run-contents"), pinned) == []


def test_a_name_missing_from_the_run_contents_page_is_caught(site):
    text = page(site, "reference/run-contents")
    pinned = json.loads(PINNED.read_text())
    # `latency.speedup` is a prefix of other shown names: the check must still see it go.
    for gone in ("latency.speedup", "tables/ops_by_op.csv", "tracker.best_attempt"):
        assert missing_keys(text.replace(f"<code>{gone}</code>", ""), pinned) == [gone]


def test_the_registry_and_cli_pages_are_generated_from_the_code(site):
    from tracker.optimize import REGISTRY

    registry = page(site, "reference/registry")
    assert all(f"<code>{name}</code>" in registry for name in REGISTRY)
    assert "<code>per_channel</code>" in registry and "<code>block_size</code>" in registry
    cli = page(site, "reference/cli")
    for command in ("optimize", "summarize", "profile", "inspect", "upload", "compare", "check"):
        assert f"<code>tracker {command}</code>" in cli
    assert "<code>--require</code>" in cli and "<code>--dry-run</code>" in cli


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move the detail into docs/"


def test_the_readme_links_into_docs_resolve(site):
    links = re.findall(r"\]\((docs/[^)\s]+)\)", (ROOT / "README.md").read_text())
    assert len(links) >= 8
    for link in links:
        path, _, anchor = link.partition("#")
        assert (ROOT / path).is_file(), f"README.md links to {path}, which does not exist"
        if anchor:
            built = site / Path(path).relative_to("docs").with_suffix("") / "index.html"
            assert f'id="{anchor}"' in built.read_text(), f"README.md links to {link}: no such heading"


def test_every_dependency_in_pyproject_is_explained():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + [s for extra in project["optional-dependencies"].values() for s in extra]
    names = {re.match(r"[A-Za-z0-9_.\-]+", spec).group(0).lower() for spec in specs}
    table = (ROOT / "docs" / "dependencies.md").read_text().lower()
    explained = {name for row in re.findall(r"^\| ([^|]+) \|", table, flags=re.M) for name in re.findall(
        r"[a-z0-9_.\-]+", row.split("(")[0])}
    assert sorted(names - explained) == [], "add a row to docs/dependencies.md for each"
