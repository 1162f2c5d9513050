"""YOLOv3 and tiny-YOLOv3 on Keras 3 and TensorFlow, trained on one or many GPUs and machines.

The modules users import: ``yolo3.model`` (the networks), ``yolo3.detect`` (``Detector``),
``yolo3.runtime`` (``load_detector`` for any saved detector), ``yolo3.training`` (a run from
a ``TrainConfig``), ``yolo3.records`` and ``yolo3.evaluate``. The command line is ``yolo3``
(``yolo3.commands``). Importing this package starts no TensorFlow.
"""

__version__ = "0.1.0"
