"""YOLOv3 and tiny-YOLOv3 on Keras 3 and TensorFlow, trained on one or many GPUs and machines.

The package by concern:

- ``yolo3.model``: the networks, loss, targets, anchors and class files;
- ``yolo3.data``: annotations, images, augmentation, offline record shards, the input pipeline;
- ``yolo3.checkpoint``: weights files and their metadata, keras-yolo3 and Darknet files;
- ``yolo3.engine``: what a training run is made of (``TrainConfig``, the builders, the
  trainer and its Keras step);
- ``yolo3.training``: a run assembled from the engine and the callbacks (``run``);
- ``yolo3.comm``: how replicas exchange gradients (all-reduce, PowerSGD, local steps);
- ``yolo3.distributed``: devices, strategies, several machines;
- ``yolo3.evaluation``: mAP (VOC, COCO), reports and galleries;
- ``yolo3.inference``: ``Detector``, export, ``load_detector`` for every saved form;
- ``yolo3.commands``: the ``yolo3`` command line; ``yolo3.callbacks``: the training callbacks.

The names most programs start from are importable from here: :func:`build_model`,
:class:`Detector`, :func:`load_detector`, :func:`export_detector`, :class:`TrainConfig`,
:func:`train` (``yolo3.training.job.run``), :func:`open_record_set` and
:func:`evaluate_detector`. Importing this package starts no TensorFlow; each is imported on
first use, TensorFlow's start-up log held back as the commands hold it back (a notebook
shows what a process writes to its standard error; ``YOLO3_TF_LOG=1`` lets it through).
"""

from yolo3 import _moved

__version__ = "0.1.0"

# Public name -> (module, name there), imported on first use.
_EXPORTS = {
    "build_model": ("yolo3.model.network", "build_model"),
    "Detector": ("yolo3.inference.detect", "Detector"),
    "load_detector": ("yolo3.inference.runtime", "load_detector"),
    "export_detector": ("yolo3.inference.export", "export_detector"),
    "TrainConfig": ("yolo3.engine.config", "TrainConfig"),
    "train": ("yolo3.training.job", "run"),
    "open_record_set": ("yolo3.data.records", "open_record_set"),
    "evaluate_detector": ("yolo3.evaluation.validate", "evaluate_detector"),
}
__all__ = ["__version__", *_EXPORTS]

_moved.install()


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'yolo3' has no attribute {name!r}")
    import importlib  # noqa: PLC0415
    import sys  # noqa: PLC0415

    if "tensorflow" not in sys.modules:
        from yolo3.cli import start_tensorflow  # noqa: PLC0415

        start_tensorflow()
    module, attribute = _EXPORTS[name]
    return getattr(importlib.import_module(module), attribute)


def __dir__():
    return sorted([*globals(), *_EXPORTS])
