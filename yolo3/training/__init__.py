"""A training run assembled: the engine's pieces and the callbacks wired into one job.

``job`` lists the steps of a run (:func:`yolo3.training.job.run`, what ``yolo3 train``
runs) and ``hooks`` builds its callbacks. This package stands above both the engine (the
trainer, its step, the builders) and :mod:`yolo3.callbacks`, which implement the hooks: it
is the one place that imports them together, so neither imports the other's user.

``yolo3.training.run`` (any public name of ``job``) is importable from here.
"""

from yolo3._moved import answer_for

__getattr__ = answer_for(__name__, "job")
