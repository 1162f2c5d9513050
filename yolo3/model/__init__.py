"""The networks and what defines them: YOLOv3 and tiny-YOLOv3 (``network``), their layers,
the per-image loss and its targets, recomputation (``remat``), FLOPs, and the anchors and
class-name files (``resources``).

``from yolo3.model import build_model`` (any public name of ``network``) keeps working as
before the package existed; nothing is imported until a name is asked for, so
``yolo3.model.resources`` stays free of TensorFlow.
"""

from yolo3._moved import answer_for

__getattr__ = answer_for(__name__, "network")
