"""The module paths of earlier releases, kept importable for a release.

The library was one flat folder; its modules now live in subpackages by concern. ``import
yolo3.training`` (and ``from yolo3.loss import yolo_loss``, ...) still work, with a
DeprecationWarning naming the new path. ``yolo3.model`` and ``yolo3.data`` are the packages
themselves and answer for their former modules (see their ``__init__``).
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from pathlib import Path

# Former module -> where it lives now.
MOVED = {
    "yolo3.annotations": "yolo3.data.annotations",
    "yolo3.augment": "yolo3.data.augment",
    "yolo3.communication": "yolo3.comm.allreduce",
    "yolo3.compression": "yolo3.comm.powersgd",
    "yolo3.darknet": "yolo3.checkpoint.darknet",
    "yolo3.darknet_writer": "yolo3.checkpoint.darknet_writer",
    "yolo3.detect": "yolo3.inference.detect",
    "yolo3.detector_spec": "yolo3.inference.detector_spec",
    "yolo3.devices": "yolo3.distributed.devices",
    "yolo3.distribute": "yolo3.distributed.strategy",
    "yolo3.engine.faults": "yolo3.faults",
    "yolo3.engine.hooks": "yolo3.training.hooks",
    "yolo3.engine.status": "yolo3.status",
    "yolo3.engine.training": "yolo3.training.job",
    "yolo3.evaluate": "yolo3.evaluation.metrics",
    "yolo3.export": "yolo3.inference.export",
    "yolo3.flops": "yolo3.model.flops",
    "yolo3.hygiene": "yolo3.data.hygiene",
    "yolo3.image": "yolo3.data.image",
    "yolo3.keras_mwms": "yolo3.distributed.keras_mwms",
    "yolo3.kmeans": "yolo3.data.kmeans",
    "yolo3.layers": "yolo3.model.layers",
    "yolo3.legacy": "yolo3.checkpoint.legacy",
    "yolo3.local_steps": "yolo3.comm.local_steps",
    "yolo3.loss": "yolo3.model.loss",
    "yolo3.malloc": "yolo3.distributed.malloc",
    "yolo3.multiscale": "yolo3.data.multiscale",
    "yolo3.plots": "yolo3.evaluation.plots",
    "yolo3.postprocess": "yolo3.inference.postprocess",
    "yolo3.preprocess": "yolo3.data.preprocess",
    "yolo3.records": "yolo3.data.records",
    "yolo3.remat": "yolo3.model.remat",
    "yolo3.resources": "yolo3.model.resources",
    "yolo3.resume": "yolo3.engine.resume",
    "yolo3.runtime": "yolo3.inference.runtime",
    "yolo3.synthetic": "yolo3.data.synthetic",
    "yolo3.targets": "yolo3.model.targets",
    "yolo3.trainer": "yolo3.engine.trainer",
    "yolo3.validate": "yolo3.evaluation.validate",
    "yolo3.weights": "yolo3.checkpoint.weights",
}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers a former path with a module that holds the new module's names."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        new = MOVED[module.__name__]
        warnings.warn(f"{module.__name__} is now {new}", DeprecationWarning, stacklevel=2)
        target = importlib.import_module(new)
        names = {k: v for k, v in vars(target).items() if not k.startswith("__")}
        module.__dict__.update(names)


def answer_for(package, module):
    """A ``__getattr__`` for ``package`` (a name), which took the place of a former module of
    the same name whose code is now its submodule ``module``: a submodule's name falls through
    to the import system, any other public name is ``module``'s, imported on first use (so the
    package's light submodules stay free of what ``module`` imports)."""
    folder = Path(sys.modules[package].__file__).resolve().parent

    def __getattr__(name):
        submodule = (folder / f"{name}.py").exists() or (folder / name / "__init__.py").exists()
        if name.startswith("_") or submodule:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__


def install():
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
