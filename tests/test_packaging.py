"""What ``pip install .`` puts on a machine: the library under one top-level name, ``yolo3``.

The wheel is built from a copy of the project's own files with the setuptools already
installed (no network), installed by pip without dependencies into a fresh virtual
environment, and imported there with this environment's packages behind it for TensorFlow
and Keras.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from PIL import Image
from test_detect import EXPECTED_LANDSCAPE, sorted_rows, write_described_weights

from yolo3.distributed.keras_mwms import TESTED_KERAS_VERSIONS

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("setup.py", "pyproject.toml", "README.md", "yolo3", "callbacks", "model_data")
BENCHMARK_MODULES = {"benchmark", "benchmark_io", "benchmark_scaling", "benchmark_train"}


def _run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "--wheel-dir", str(work / "dist"), str(source)])  # fmt: skip
    (wheel,) = (work / "dist").glob("keras_yolo3-*.whl")
    env_dir = work / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    python = env_dir / "bin" / "python"
    site = Path(
        _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).strip()
    )
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
          "--no-deps", "--no-index", str(wheel)])  # fmt: skip
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata).decode()
    # This environment's packages (TensorFlow, Keras, ...) as a plain path entry: its .pth
    # files, the editable install's import hook among them, are not run from there.
    (site / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return {
        "python": python,
        "bin": env_dir / "bin",
        "site": site,
        "names": names,
        "cwd": work,
        "metadata": metadata,
    }


def _outside_env():
    """This environment without PYTHONPATH: what is imported comes from the installed wheel."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _python(installed, code):
    return _run([str(installed["python"]), "-c", code], cwd=installed["cwd"], env=_outside_env())


def test_wheel_adds_exactly_one_top_level_name(installed):
    top = {name.split("/")[0] for name in installed["names"]}
    top = {name for name in top if not name.endswith(".dist-info")}
    assert top == {"yolo3"}
    assert "yolo3/callbacks/__init__.py" in installed["names"]
    assert "yolo3/callbacks/checkpoint.py" in installed["names"]


def test_installed_library_imports_callbacks_inside_its_namespace(installed):
    out = _python(
        installed,
        "import importlib.util, pkgutil, yolo3, yolo3.callbacks, yolo3.training.job\n"
        "print(yolo3.callbacks.__file__)\n"
        "print(yolo3.training.job.yolo_callbacks is yolo3.callbacks)\n"
        "print(importlib.util.find_spec('callbacks'))\n"
        "print(','.join(sorted(m.name for m in pkgutil.iter_modules(yolo3.__path__))))\n",
    )
    callbacks_file, same, top_level, modules = out.strip().splitlines()[-4:]
    assert Path(callbacks_file) == installed["site"] / "yolo3" / "callbacks" / "__init__.py"
    assert same == "True"
    assert top_level == "None", "`import callbacks` must fail in an installed environment"
    modules = set(modules.split(","))
    packages = {"model", "data", "checkpoint", "engine", "comm", "distributed", "evaluation"}
    assert {*packages, "inference", "commands", "callbacks", "cli"} <= modules
    assert not modules & BENCHMARK_MODULES
    assert "original_input" not in modules


def test_keras_requirement_admits_exactly_the_versions_the_workaround_accepts(installed):
    (line,) = [
        line.split(":", 1)[1].strip()
        for line in installed["metadata"].splitlines()
        if line.startswith("Requires-Dist:") and re.match(r"Requires-Dist:\s*keras\b", line)
    ]
    requirement = Requirement(line)
    candidates = {"3.14.0", "3.15.0", "3.15.1", "3.15.2", "3.16.0", *TESTED_KERAS_VERSIONS}
    allowed = {version for version in candidates if requirement.specifier.contains(version)}
    assert allowed == set(TESTED_KERAS_VERSIONS)


def test_yolo3_command_detects_from_the_installed_wheel_outside_the_checkout(installed):
    # The console script, run from a folder outside the repository: the tool's code, its
    # shipped anchors and classes (yolo3/model_data) and the weights' own metadata all come
    # from the installed package, and the hand-set model gives its hand-derived boxes.
    work = installed["cwd"] / "detect_run"
    work.mkdir()
    weights = write_described_weights(work / "described.weights.h5")
    Image.new("RGB", (128, 96), (10, 20, 30)).save(work / "a.png")
    yolo3 = str(installed["bin"] / "yolo3")
    env = _outside_env()
    _run([yolo3, "detect", "a.png", "--weights", weights, "--output", "out"], cwd=work, env=env)
    [record] = json.loads((work / "out" / "detections.json").read_text())["images"]
    np.testing.assert_allclose(sorted_rows(record["boxes"]), EXPECTED_LANDSCAPE, atol=1e-3)
    assert record["labels"] == ["dog"] * 4
    assert "yolo3 detect" in _run([yolo3, "detect", "--help"], cwd=work, env=env)
    out = _python(
        installed,
        "from yolo3.model.resources import model_data_file\n"
        "print(model_data_file('yolo_anchors.txt'))\n",
    )
    shipped = Path(out.strip().splitlines()[-1])
    assert shipped == installed["site"] / "yolo3" / "model_data" / "yolo_anchors.txt"
    overview = _run([yolo3, "--help"], cwd=work, env=env)
    from yolo3.commands import COMMANDS  # noqa: PLC0415

    assert all(f"  {name} " in overview for name in COMMANDS)
