"""Keras callbacks for training YOLOv3 with ``model.fit`` on one device or many.

The repository's ``callbacks/`` folder, installed as ``yolo3.callbacks``.

- :class:`TemplateCheckpoint`: the bare ``yolo_body`` weights (last, best, every k epochs)
  plus the full training state for ``--resume``; written by the chief worker only.
- :class:`WorkerBackup`: per-worker backups; a killed job resumes when started again, from
  the newest step every worker has.
- :class:`LocalSync`: with ``--local-steps``, averages the replicas every H steps, and
  fully (optimizer state too) at epoch ends and before backups.
- :class:`RecordSetCheck`: ends a run whose record shards changed on disk under it.
- :class:`Preemption`: SIGTERM stops every worker after the same step, with a backup there.
- :class:`TrainingStatus`: the stop request and dense phase the trainer hands to callbacks.
- :class:`Throughput`: images/s and the time each step waited for input.
- :class:`ProgressLines`: plain progress lines for a log file, in place of the progress bar.
- :class:`StopOnNonFinite`: stops on a NaN or infinite loss, naming the step and the term.
- :class:`FreezeSchedule`: trains with frozen layers for some epochs, then unfreezes them.
- :class:`PlateauScale`: lowers the learning-rate scale when validation loss stalls.
- :class:`TimeBudget`: fits the run's epochs and learning-rate schedule to ``--time``.
- :class:`CloseMosaic`: the last epochs read no mosaic records (``--close-mosaic``).
- :class:`MapEvaluation`: COCO AP on the validation split each epoch (or every k), and
  the fitness that picks the best weights.
- :class:`LearningRateLogger`: puts the learning rate into the epoch logs (TensorBoard).
- :class:`EpochHistory`: one JSON line per epoch in ``history.jsonl`` (losses, mAP, the
  training clock).
- :class:`ResultsFiles`: ``results.csv`` and ``results.png``, from the history.

:mod:`yolo3.callbacks.mlflow_tracking` (``MlflowTracking``, for ``--mlflow``) is left out
of this namespace: only a run that tracks imports it, and MLflow with it.
"""

from yolo3.checkpoint.run_files import BEST, LAST, read_training_state
from yolo3.comm.local_sync import LocalSync
from yolo3.status import TrainingStatus

from .backup import WorkerBackup
from .checkpoint import TemplateCheckpoint
from .evaluation import AP50_KEY, AP_KEY, FITNESS_KEY, MAP_KEY, MapEvaluation, fitness
from .history import HISTORY_FILE, EpochHistory, read_history
from .monitor import LearningRateLogger, ProgressLines, StopOnNonFinite, Throughput
from .preemption import PREEMPTED_STATUS, Preemption, make_stop_flag
from .record_check import RecordSetCheck
from .results import ResultsFiles, write_results
from .schedule import CloseMosaic, FreezeSchedule, PlateauScale, TimeBudget

__all__ = [
    "BEST",
    "HISTORY_FILE",
    "LAST",
    "EpochHistory",
    "FreezeSchedule",
    "LearningRateLogger",
    "LocalSync",
    "AP50_KEY",
    "AP_KEY",
    "FITNESS_KEY",
    "MAP_KEY",
    "MapEvaluation",
    "PREEMPTED_STATUS",
    "PlateauScale",
    "TimeBudget",
    "CloseMosaic",
    "Preemption",
    "ProgressLines",
    "RecordSetCheck",
    "ResultsFiles",
    "StopOnNonFinite",
    "TemplateCheckpoint",
    "Throughput",
    "TrainingStatus",
    "WorkerBackup",
    "fitness",
    "make_stop_flag",
    "read_history",
    "read_training_state",
    "write_results",
]
