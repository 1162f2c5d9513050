"""mAP during training, every few epochs, on the chief."""

import math

import keras
import numpy as np


class MapEvaluation(keras.callbacks.Callback):
    """Adds ``val_mAP50`` to the epoch logs every ``every`` epochs (TensorBoard, checkpoints).

    Detection over the validation split takes a while; for long runs prefer a separate
    ``tools/evaluate.py --watch`` process on a device of its own, which does not hold up
    training.

    Args:
        body: the template model being trained.
        source: a record-set folder (or annotation file) to evaluate on.
        split: the record-set split.
        anchors, class_names: as the model was built with.
        every: epochs between evaluations.
        limit: evaluate at most this many images.
    """

    def __init__(self, body, source, *, split, anchors, class_names, every, limit=None,
                 log=None):  # fmt: skip
        super().__init__()
        self.body = body
        self.source = source
        self.split = split
        self.anchors = np.asarray(anchors, np.float32)
        self.class_names = list(class_names)
        self.every = int(every)
        self.limit = limit
        self.log = log
        self.history = []

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every or getattr(self.model, "stop_requested", False):
            return
        from yolo3 import validate  # noqa: PLC0415 - pulls in pycocotools and the detector

        evaluation = validate.evaluate_model(
            self.body,
            self.source,
            anchors=self.anchors,
            class_names=self.class_names,
            split=self.split,
            coco=False,
            gallery_size=0,
            limit=self.limit,
        )
        value = evaluation.map50
        self.history.append((epoch + 1, value))
        if logs is not None and math.isfinite(value):
            logs["val_mAP50"] = value
        if self.log:
            self.log(f"epoch {epoch + 1}: mAP@0.5 {value:.4f} on {evaluation.num_images} images")
