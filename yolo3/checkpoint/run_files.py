"""The names of the files in a run's checkpoint folder, and the training state read back.

Written by :class:`yolo3.callbacks.TemplateCheckpoint` (see :mod:`yolo3.callbacks.checkpoint`
for what each holds); read by ``--resume`` and by the end of a run, which sit below the
callbacks and so read them here.
"""

import os

from yolo3.checkpoint.weights import read_metadata

LAST = "last.weights.h5"
BEST = "best.weights.h5"
STATE = "state.weights.h5"


def read_training_state(directory):
    """``(path, metadata)`` of the training state in ``directory``, or ``None`` if absent.

    ``metadata["epoch"]`` is the number of finished epochs.
    """
    path = os.path.join(directory, STATE)
    if not os.path.exists(path):
        return None
    return path, read_metadata(path)
