"""mAP during training, every few epochs, on the chief."""

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
GALLERY_IMAGES = 6
GALLERY_COLUMNS = 3
GALLERY_TILE = 256


class MapEvaluation(keras.callbacks.Callback):
    """Adds ``val_mAP50`` to the epoch logs every ``every`` epochs (TensorBoard, checkpoints).

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
        every: epochs between evaluations.
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
        self.every = int(every)
        self.limit = limit
        self.tensorboard_dir = tensorboard_dir
        self.log = log
        self.history = []
        self.seconds = 0.0  # spent evaluating, for a clock of training alone (EpochHistory)
        self.latest = None  # the last Evaluation, for a report at the run's end (MLflow)
        self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every or self.status.stop_requested:
            return
        from yolo3.evaluation import validate  # noqa: PLC0415 - pulls in pycocotools and the detector

        begun = time.perf_counter()
        with self.averaged():
            evaluation = validate.evaluate_model(
                self.body,
                self.source,
                head=self.head,
                split=self.split,
                coco=False,
                gallery_size=GALLERY_IMAGES if self.tensorboard_dir else 0,
                limit=self.limit,
            )
        value = evaluation.map50
        self.history.append((epoch + 1, value))
        self.latest = evaluation
        if logs is not None and math.isfinite(value):
            logs[MAP_KEY] = value
        if self.tensorboard_dir:
            self.write_summaries(evaluation, epoch)
        if self.log:
            self.log(f"epoch {epoch + 1}: mAP@0.5 {value:.4f} on {evaluation.num_images} images")
        self.seconds += time.perf_counter() - begun

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
