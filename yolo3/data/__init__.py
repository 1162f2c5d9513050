"""Data from annotation files to training batches: annotation formats and their checks
(``annotations``, ``hygiene``), images and letterboxing (``image``), augmentation, offline
preprocessing into record shards (``preprocess``, ``records``), the tf.data input pipeline
(``pipeline``), multi-scale sizes, anchor fitting (``kmeans``) and the generated demo data
(``synthetic``).

``from yolo3.data import make_dataset`` (any public name of ``pipeline``) keeps working as
before the package existed.
"""

from pathlib import Path

_FOLDER = Path(__file__).resolve().parent


def __getattr__(name):
    # As yolo3.model: submodules through the import system, other names from pipeline.
    if name.startswith("_") or (_FOLDER / f"{name}.py").exists():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from yolo3.data import pipeline  # noqa: PLC0415

    return getattr(pipeline, name)
