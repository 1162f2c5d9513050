"""The package's layout: subpackages by concern, the former flat module paths still importable
for a release, and the names exported from ``yolo3`` itself."""

import importlib
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import yolo3
from yolo3._moved import MOVED

PACKAGE = Path(yolo3.__file__).resolve().parent


def test_every_subpackage_says_what_it_holds():
    for info in pkgutil.iter_modules(yolo3.__path__):
        if info.ispkg:
            module = importlib.import_module(f"yolo3.{info.name}")
            assert module.__doc__ and len(module.__doc__.split()) > 10, info.name


def test_former_module_paths_import_with_a_warning_naming_the_new_one():
    for old, new in MOVED.items():
        assert not (PACKAGE / f"{old.split('.')[1]}.py").exists(), f"{old} is a file again"
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"^{old} is now {new}$"):
            former = importlib.import_module(old)
        current = importlib.import_module(new)
        public = [name for name in vars(current) if not name.startswith("_")]
        assert public and all(getattr(former, name) is getattr(current, name) for name in public)


def test_model_and_data_packages_answer_for_their_former_modules():
    from yolo3.data import make_dataset  # noqa: PLC0415
    from yolo3.data.pipeline import make_dataset as pipeline_make_dataset  # noqa: PLC0415
    from yolo3.model import (  # noqa: PLC0415
        build_model,
        network,  # noqa: PLC0415
        tiny_yolo_body,
        yolo_body,
    )

    assert make_dataset is pipeline_make_dataset
    assert (build_model, yolo_body, tiny_yolo_body) == (
        network.build_model,
        network.yolo_body,
        network.tiny_yolo_body,
    )
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        yolo3.model.no_such_name  # noqa: B018


def test_top_level_names_resolve_and_importing_them_lazily_starts_no_tensorflow():
    for name in yolo3.__all__:
        assert getattr(yolo3, name) is not None, name
    assert yolo3.train is yolo3.training.job.run
    code = (
        "import sys, yolo3, yolo3.model.resources, yolo3.data.annotations, yolo3.commands\n"
        "print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
