"""COCO AP during training, each epoch or every few, on the chief; the fitness that picks
the best weights."""

import contextlib
import math
import os
import re
import time
import unicodedata

import keras
import numpy as np

from yolo3.status import TrainingStatus

# What goes to TensorBoard beside ``val_mAP50`` (see :class:`MapEvaluation`): the first
# GALLERY_IMAGES validation images, each scaled to fit a GALLERY_TILE square, in rows of
# GALLERY_COLUMNS. The same images every time, so the pictures show the model learning.
TENSORBOARD_RUN = "evaluation"
MAP_KEY = "val_mAP50"  # the epoch logs' mAP@0.5 (history.jsonl, checkpoints, TensorBoard)
AP_KEY = "val_AP"  # COCO AP@[.5:.95] by pycocotools
AP50_KEY = "val_AP50"  # COCO AP@0.5 by pycocotools (101-point; MAP_KEY is VOC's all-point)
FITNESS_KEY = "val_fitness"  # what picks best.weights.h5, higher is better
# The fitness: mostly AP@[.5:.95], the figure a detector is judged by, which rewards tight
# boxes; a tenth AP50, which moves first early in training when AP is still near 0 and breaks
# its ties there. Ultralytics weighs them so too.
FITNESS_WEIGHTS = ((AP_KEY, 0.9), (AP50_KEY, 0.1))
# The fitness as the run's last lines name it: "0.9 AP + 0.1 AP50".
FITNESS_TEXT = " + ".join(
    f"{weight:g} {key.removeprefix('val_')}" for key, weight in FITNESS_WEIGHTS
)
# With every=None the evaluation runs each epoch while it costs at most this share of the
# epoch's time; when it costs more, every K epochs, K chosen after the first so it does not.
COST_SHARE = 0.1
GALLERY_IMAGES = 6
GALLERY_COLUMNS = 3
GALLERY_TILE = 256


def fitness(logs):
    """The fitness of an epoch's ``logs`` (:data:`FITNESS_WEIGHTS`), or None without AP."""
    if any(key not in logs for key, _ in FITNESS_WEIGHTS):
        return None
    return sum(weight * float(logs[key]) for key, weight in FITNESS_WEIGHTS)


class MapEvaluation(keras.callbacks.Callback):
    """Adds COCO AP (``val_AP``, ``val_AP50``), their :func:`fitness` (``val_fitness``) and
    VOC's ``val_mAP50`` to the logs of evaluated epochs (TensorBoard, checkpoints, history).

    ``every`` None: each epoch, as long as an evaluation costs at most :data:`COST_SHARE` of
    the epoch's time; if it costs more, every K epochs with K the smallest that keeps to the
    share, chosen again after each evaluation (the first pays for tracing the detector, the
    next ones do not) and logged when it changes. The last epoch of ``fit`` is evaluated
    whatever K, so the run's last weights are always scored.

    With ``tensorboard_dir``, each evaluation also writes to the TensorBoard run
    ``<tensorboard_dir>/evaluation``, at the step Keras's TensorBoard callback gives the
    epoch's losses and ``mAP50`` (the epoch index, from 0):

    - ``epoch_AP50/<class>``: the AP@0.5 of each class with ground truth (class names made
      safe for tags by :func:`class_tags`);
    - ``epoch_gallery``: one picture of the first :data:`GALLERY_IMAGES` validation images
      with their true boxes (dashed green) and detections scored 0.3 or more,
      :data:`GALLERY_COLUMNS` tiles of :data:`GALLERY_TILE` pixels a row (768 x 512 pixels
      for six images).

    Per-class figures stay out of the epoch logs, which checkpoints and the run's history
    record: there would be one entry per class in each of them, on evaluated epochs only.
    The run has its own folder because TensorBoard reads each folder's event files one after
    another, and would miss what Keras's writer adds to an older file in the same folder.

    Detection over the validation split takes a while; for long runs prefer a separate
    ``yolo3 evaluate --watch`` process on a device of its own, which does not hold up
    training.

    Args:
        body: the template model being trained.
        source: a record-set folder (or annotation file) to evaluate on.
        split: the record-set split.
        head: the :class:`yolo3.model.head.HeadSpec` the model is trained with (classes,
            anchors of each level, grid sensitivity).
        every: epochs between evaluations; None: chosen by cost (above).
        limit: evaluate at most this many images.
        tensorboard_dir: the folder of the run's TensorBoard logs; None writes nothing.
        log: a callable given one line per evaluation.
        status: the trainer's :class:`TrainingStatus`: a job asked to stop skips the
            evaluation (None: the job never asks to stop).
        averaged: a function giving the context in which ``body`` holds the weights to
            score (the trainer's ``averaged_weights``); None: the weights as they are.
    """

    def __init__(self, body, source, *, split, head, every, limit=None, tensorboard_dir=None,
                 log=None, status=None, averaged=None):  # fmt: skip
        super().__init__()
        self.averaged = averaged or contextlib.nullcontext
        self.status = status or TrainingStatus()
        self.body = body
        self.source = source
        self.split = split
        self.head = head
        self.every = None if every is None else int(every)
        self.fixed = every is not None  # given; else chosen by cost after each evaluation
        self._epoch_started = None
        self._evaluated = 0  # the last epoch evaluated, from 1
        self._detector = None
        self.limit = limit
        self.tensorboard_dir = tensorboard_dir
        self.log = log
        self.history = []
        self.seconds = 0.0  # spent evaluating, for a clock of training alone (EpochHistory)
        self.latest = None  # the last Evaluation, for a report at the run's end (MLflow)
        self._writer = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_started = time.perf_counter()

    def _due(self, epoch):
        last = (self.params or {}).get("epochs") == epoch + 1
        if self.fixed:
            return last or (epoch + 1) % self.every == 0
        return last or self.every is None or epoch + 1 - self._evaluated >= self.every

    def on_epoch_end(self, epoch, logs=None):
        if not self._due(epoch) or self.status.stop_requested:
            return
        epoch_seconds = time.perf_counter() - (self._epoch_started or time.perf_counter())
        from yolo3.evaluation import validate  # noqa: PLC0415 - pulls in pycocotools and the detector

        begun = time.perf_counter()
        if self._detector is None:  # built and traced once: a long run's memory stays flat
            self._detector, self.source = validate.model_detector(
                self.body, self.source, head=self.head
            )
        with self.averaged():
            evaluation = validate.evaluate_detector(
                self._detector,
                self.source,
                split=self.split,
                coco=True,
                gallery_size=GALLERY_IMAGES if self.tensorboard_dir else 0,
                limit=self.limit,
            )
        value = evaluation.map50
        self.history.append((epoch + 1, value))
        self.latest = evaluation
        figures = {MAP_KEY: value}
        figures[AP_KEY] = float((evaluation.coco or {}).get("AP", math.nan))
        figures[AP50_KEY] = float((evaluation.coco or {}).get("AP50", math.nan))
        figures = {key: v for key, v in figures.items() if math.isfinite(v)}
        score = fitness(figures)
        if score is not None:
            figures[FITNESS_KEY] = score
        if logs is not None:
            logs.update(figures)
        if self.tensorboard_dir:
            self.write_summaries(evaluation, epoch)
        spent = time.perf_counter() - begun
        self.seconds += spent
        if self.log:
            ap = (
                "" if score is None else f"AP {figures[AP_KEY]:.4f}, AP50 {figures[AP50_KEY]:.4f}, "
            )
            self.log(
                f"epoch {epoch + 1}: {ap}mAP@0.5 (VOC) {value:.4f} on "
                f"{evaluation.num_images} validation images in {spent:.1f} s"
            )
        self._evaluated = epoch + 1
        if not self.fixed:
            self._pace(spent, epoch_seconds)

    def _pace(self, spent, epoch_seconds):
        """Every epoch if an evaluation costs at most COST_SHARE of one, else every K epochs
        with K the smallest that keeps to the share; logged when K changes."""
        every = max(1, math.ceil(spent / (COST_SHARE * max(epoch_seconds, 1e-9))))
        if every == (self.every or 1):
            return
        self.every = None if every == 1 else every
        if self.log:
            pace = "each epoch" if every == 1 else f"every {every} epochs and at the last"
            self.log(
                f"AP {pace}: an evaluation took {spent:.1f} s, an epoch {epoch_seconds:.1f} s "
                f"(at most {COST_SHARE:.0%} of it goes to AP; --map-every K fixes K)"
            )

    def write_summaries(self, evaluation, step):
        """Writes ``evaluation``'s per-class AP and gallery at ``step`` (see the class)."""
        import tensorflow as tf  # noqa: PLC0415

        from yolo3.evaluation import plots  # noqa: PLC0415

        if self._writer is None:
            path = os.path.join(self.tensorboard_dir, TENSORBOARD_RUN)
            self._writer = tf.summary.create_file_writer(path)
        names = evaluation.class_names
        with self._writer.as_default(step=int(step)):
            for tag, ap in zip(class_tags(names), evaluation.voc.ap):
                if math.isfinite(ap):
                    tf.summary.scalar(f"epoch_AP50/{tag}", float(ap))
            if evaluation.gallery:
                images, truths, found = zip(*evaluation.gallery)
                picture = plots.gallery_image(
                    images, truths, found, names, GALLERY_COLUMNS, tile_size=GALLERY_TILE
                )
                tf.summary.image("epoch_gallery", np.asarray(picture)[None], max_outputs=1)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def class_tags(class_names):
    """One TensorBoard tag part per class: its name with accents dropped and every run of
    characters other than ASCII letters, digits, ``.``, ``-`` and ``_`` made one ``_``.

    A name left empty becomes ``class_<id>``; a tag already taken gets ``_<id>`` appended,
    so each class keeps a curve of its own.
    """
    tags, taken = [], set()
    for class_id, name in enumerate(class_names):
        ascii_name = unicodedata.normalize("NFKD", str(name)).encode("ascii", "ignore").decode()
        tag = re.sub(r"[^A-Za-z0-9._-]+", "_", ascii_name).strip("_") or f"class_{class_id}"
        while tag in taken:
            tag = f"{tag}_{class_id}"
        taken.add(tag)
        tags.append(tag)
    return tags
