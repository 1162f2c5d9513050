"""Data from annotation files to training batches: annotation formats and their checks
(``annotations``, ``hygiene``), images and letterboxing (``image``), augmentation, offline
preprocessing into record shards (``preprocess``, ``records``), the tf.data input pipeline
(``pipeline``), multi-scale sizes, anchor fitting (``kmeans``) and the generated demo data
(``synthetic``).

``from yolo3.data import make_dataset`` (any public name of ``pipeline``) keeps working as
before the package existed.
"""

from yolo3._moved import answer_for

__getattr__ = answer_for(__name__, "pipeline")
