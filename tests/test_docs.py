"""The documentation site builds with `mkdocs build --strict` (warnings as errors: a broken
internal link, a page left out of the nav, a docstring mkdocstrings cannot read), its API
reference has a page for every public module of the package, and the benchmark plots draw
from the committed JSON.
"""

import importlib
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from yolo3 import commands

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _load_file(path):
    spec = importlib.util.spec_from_file_location(f"_readme_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_plots_draw_from_the_committed_json():
    plots = _load_file(DOCS / "plots.py")
    json_files = sorted((DOCS / "data").glob("*.json"))
    assert json_files
    for path in json_files:
        assert path.with_suffix(".md").exists(), f"{path.name} needs its sidecar (command, machine)"
    figures = plots.draw_all(DOCS / "data")
    assert {figure.name for figure in figures} == {"scaling", "detect"}
    for figure in figures:
        assert figure.svg.startswith(b"<?xml") and b"<svg" in figure.svg


def _public_modules_on_disk():
    """Public modules of the installed package found by importing and walking it, not by
    the docs' own code: ``yolo3`` and ``yolo3.callbacks`` (installed from callbacks/), less
    the command modules (the CLI reference has those)."""
    names = set()
    for package_name in ("yolo3", "yolo3.callbacks"):
        package = importlib.import_module(package_name)
        names.add(package_name)
        for info in pkgutil.walk_packages(package.__path__, f"{package_name}."):
            names.add(info.name)
    return {
        name
        for name in names
        if not any(part.startswith("_") for part in name.split("."))
        and not name.startswith("yolo3.commands.")
    }


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site_dir = tmp_path_factory.mktemp("site")
    mkdocs = Path(sys.executable).with_name("mkdocs")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return site_dir


@pytest.mark.slow
def test_site_builds_strict_with_every_page(site):
    for page in ("index.html", "getting-started/index.html", "benchmarks/index.html"):
        assert (site / page).is_file()
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for name in commands.COMMANDS:
        assert f"yolo3 {name}" in cli
    benchmarks = (site / "benchmarks" / "index.html").read_text(encoding="utf-8")
    assert "img/plots/scaling.svg" in benchmarks and "img/plots/detect.svg" in benchmarks


@pytest.mark.slow
def test_api_reference_has_every_public_module(site):
    missing = []
    for name in sorted(_public_modules_on_disk()):
        page = site / "reference" / "api" / name / "index.html"
        if not page.is_file() or 'class="doc doc-' not in page.read_text(encoding="utf-8"):
            missing.append(name)
    assert not missing, f"modules without an API page: {missing}"
