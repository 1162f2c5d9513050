"""The networks and what defines them: YOLOv3 and tiny-YOLOv3 (``network``), their layers,
the per-image loss and its targets, recomputation (``remat``), FLOPs, and the anchors and
class-name files (``resources``).

``from yolo3.model import build_model`` (any public name of ``network``) keeps working as
before the package existed; nothing is imported until a name is asked for, so
``yolo3.model.resources`` stays free of TensorFlow.
"""

from pathlib import Path

_FOLDER = Path(__file__).resolve().parent


def __getattr__(name):
    # A submodule's name falls through to the import system; any other public name is
    # network's, imported on first use.
    if name.startswith("_") or (_FOLDER / f"{name}.py").exists():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from yolo3.model import network  # noqa: PLC0415

    return getattr(network, name)
