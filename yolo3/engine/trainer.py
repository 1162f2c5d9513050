"""The training wrapper around ``yolo_body``: loss, learning-rate schedule and freezing.

:class:`YoloTrainer` is a ``keras.Model`` that owns the bare detection network (the
*template*, ``trainer.body``) and computes the YOLOv3 loss in ``compute_loss``, so that
``model.fit`` with any ``tf.distribute`` strategy, callbacks and ``BackupAndRestore`` work
unchanged. Checkpoints save ``trainer.body`` by layer name: they load into a ``yolo_body``
built on one GPU or a CPU with no strategy.

Loss reduction: :func:`yolo3.model.loss.yolo_loss` returns one value per image, ``(N, 1)``.
Each replica differentiates ``sum(per_image) / global_batch`` (the local mean scaled by
``1 / num_replicas``, Keras's own convention for distributed losses), so the summed
gradients of the replicas equal the gradient of the mean over the global batch.
"""

import contextlib
import dataclasses
import math

import keras
import tensorflow as tf
from keras import ops

from yolo3.comm.schemes import AllReduce
from yolo3.engine.averaging import WeightAverage
from yolo3.engine.step import StepFunctions, accumulated_step
from yolo3.model.loss import (
    IGNORE_THRESH,
    LossOptions,
    loss_terms,
    replica_loss,
    term_log_key,
    yolo_loss,
)
from yolo3.model.network import head_layer_names
from yolo3.model.remat import RematForward
from yolo3.model.targets import IOU_THRESH, NEIGHBOUR_SCALE_X_Y, build_targets
from yolo3.status import TrainingStatus

# Convolutions of the feature extractor that --freeze-body 1 freezes: Darknet-53 for
# YOLOv3 (as the original's first 185 Keras layers), the first five conv+pool stages for
# tiny (the original's first 20 layers).
BACKBONE_CONVS = {"yolov3": 52, "tiny": 5}
OPTIMIZERS = ("adam", "sgd")


@keras.saving.register_keras_serializable(package="yolo3")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``peak``, then constant or cosine decay to ``final_fraction * peak``.

    ``total_steps``: the run's length in optimizer steps, a number or a variable (which
    :class:`yolo3.callbacks.TimeBudget` sets as the run's plan changes).

    ``scale`` is an optional scalar variable multiplied in (1.0 unless a plateau callback
    lowers it); it lives in the trainer so that checkpoints and backups restore it.
    """

    def __init__(
        self, peak, warmup_steps, total_steps, kind="cosine", final_fraction=0.01, scale=None
    ):
        if kind not in ("cosine", "constant"):
            raise ValueError(f"learning-rate schedule {kind!r}: use cosine or constant")
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        # A variable where the run's length changes as it goes (--time).
        self.total_steps = (
            total_steps if hasattr(total_steps, "assign") else max(int(total_steps), 1)
        )
        self.kind = kind
        self.final_fraction = float(final_fraction)
        self.scale = scale

    def value(self, step):
        """The learning rate at ``step`` (a Python number or a tensor)."""
        step = ops.cast(step, "float32")
        warmup = ops.minimum(1.0, (step + 1.0) / max(self.warmup_steps, 1))
        rate = self.peak * warmup
        if self.kind == "cosine":
            total = ops.cast(self.total_steps, "float32")  # a number, or a variable
            decay_steps = ops.maximum(total - self.warmup_steps, 1.0)
            progress = ops.clip((step - self.warmup_steps) / decay_steps, 0.0, 1.0)
            cosine = 0.5 * (1.0 + ops.cos(math.pi * progress))
            rate = rate * (self.final_fraction + (1.0 - self.final_fraction) * cosine)
        return rate

    def __call__(self, step):
        rate = self.value(step)
        return rate if self.scale is None else rate * ops.cast(self.scale, "float32")

    def get_config(self):
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "total_steps": int(ops.convert_to_numpy(self.total_steps)),
            "kind": self.kind,
            "final_fraction": self.final_fraction,
        }


@keras.saving.register_keras_serializable(package="yolo3")
class ReplicaSafeLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras's dynamic loss scaling, with every replica agreeing whether to skip a step.

    Under ``MirroredStrategy`` Keras 3.15 checks the gradients for infinities on the first
    replica only, before they are summed across replicas: a step whose gradient overflows
    on another replica is applied, and the summed infinity lands in every weight (and the
    loss scale is not lowered). Here the check is all-reduced, so a step that overflows on
    any replica is skipped on all of them and the scale halves, as on one device.
    """

    def check_finite(self, grads):
        finite = super().check_finite(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        # ReduceOp has SUM and MEAN only: count the replicas that saw an overflow.
        overflows = context.all_reduce(
            tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32)
        )
        return overflows == 0.0


def make_optimizer(name, learning_rate, *, momentum=0.9):
    """Adam (as the original keras-yolo3) or SGD with Nesterov-free momentum (as Darknet).

    Under the ``mixed_float16`` policy it comes wrapped in
    :class:`ReplicaSafeLossScaleOptimizer` (Keras would wrap it in its own, which is unsafe
    with several replicas).
    """
    if name == "adam":
        optimizer = keras.optimizers.Adam(learning_rate)
    elif name == "sgd":
        optimizer = keras.optimizers.SGD(learning_rate, momentum=momentum)
    else:
        raise ValueError(f"--optimizer {name!r}: use one of {OPTIMIZERS}")
    if keras.mixed_precision.global_policy().name == "mixed_float16":
        optimizer = ReplicaSafeLossScaleOptimizer(optimizer)
    return optimizer


def scaled_learning_rate(base_lr, global_batch, reference_batch=64):
    """The linear scaling rule: ``base_lr`` is for ``reference_batch`` images per step."""
    return base_lr * global_batch / reference_batch


def frozen_layer_names(body, model_type, freeze_body):
    """Names of the layers ``--freeze-body`` freezes in stage one.

    0: none. 1: the feature extractor (``BACKBONE_CONVS``). 2: everything except the
    output convolutions (the heads), as the original's ``freeze_body=2``.
    """
    if freeze_body == 0:
        return []
    if freeze_body not in (1, 2):
        raise ValueError(f"--freeze-body {freeze_body}: use 0, 1 or 2")
    convs = sorted(
        int(layer.name.split("_")[1]) for layer in body.layers if layer.name.startswith("conv_")
    )
    heads = {int(name.split("_")[1]) for name in head_layer_names(model_type)}
    if freeze_body == 1:
        frozen = [index for index in convs if index < BACKBONE_CONVS[model_type]]
    else:
        frozen = [index for index in convs if index not in heads]
    names = set()
    for index in frozen:
        names.update({f"conv_{index}", f"bn_{index}"})
    return sorted(name for name in names if _has_layer(body, name))


def _has_layer(model, name):
    try:
        model.get_layer(name)
    except ValueError:
        return False
    return True


def set_frozen(body, names, frozen):
    """Sets ``trainable = not frozen`` on the named layers (frozen BN runs in inference mode)."""
    for name in names:
        body.get_layer(name).trainable = not frozen


class YoloTrainer(StepFunctions, keras.Model):
    """``model.fit``-able wrapper: ``call`` runs the body, ``compute_loss`` the YOLOv3 loss.

    Args:
        body: the bare detection model (``yolo_body`` or ``tiny_yolo_body``).
        head: the :class:`yolo3.model.head.HeadSpec` ``body`` was built for: classes,
            anchors per level and grid sensitivity (detection must decode with the same).
        ignore_thresh: IoU above which a background prediction is not penalised.
        iou_thresh: a box is also assigned to every anchor whose centred IoU with it is
            above this (AlexeyAB Darknet's ``iou_thresh``; default
            :data:`yolo3.model.targets.IOU_THRESH`; 1: its best anchor only, YOLOv3's rule).
        neighbour_cells: a box is also assigned to the two cells beside its centre's
            nearest to the centre (YOLOv5's rule, :func:`yolo3.model.targets.build_targets`);
            needs a grid sensitivity of at least 2 on every level.
        loss_options: the loss's box term and the weights of its terms, a
            :class:`yolo3.model.loss.LossOptions` (default: its defaults, the recipe's
            CIoU box term; ``LossOptions(iou_loss="mse")`` is YOLOv3's loss).
        remat: ``off``, or ``full`` / ``large``: the training forward pass recomputes
            activations in the backward pass (:class:`yolo3.model.remat.RematForward`) to fit
            larger batches; the loss and gradients stay the same.
        multi_scale: a :class:`yolo3.data.multiscale.ScaleSchedule`: each train step resizes its
            batch to the schedule's size for that step (the body must accept any size).
        accumulate: micro-batches per optimizer step (Darknet's ``subdivisions``). Each
            replica takes this many batches from the iterator, runs them one after another,
            sums their gradients locally and all-reduces once. Batch norm normalises each
            micro-batch with its own statistics (synchronised across replicas when the body
            has synchronised batch norm) and updates its moving averages once per
            micro-batch, as Darknet does; everything else equals one step on the
            ``accumulate`` times larger batch.
        communication: how gradients cross the network, a
            :class:`yolo3.comm.schemes.Communication` (default: ``AllReduce()``, Keras's
            float32 all-reduce); :func:`yolo3.comm.schemes.communication_from` builds one
            from ``yolo3 train``'s flags. One per trainer: ``compile`` builds its state
            (saved with the trainer's weights) under the strategy's scope and installs its
            reduction in the optimizer.

    Data: ``x`` is ``(N, H, W, 3)``, float32 in [0, 1] or uint8 (scaled here); ``y`` the
    per-level targets of :func:`yolo3.model.targets.build_targets`, or the padded boxes
    ``(N, max_boxes, 5)`` they are built from (then built here, on the accelerator).
    Logged metrics: ``loss`` (with regularisation) and the terms of
    :func:`yolo3.model.loss.loss_terms`: ``box_loss`` (``xy_loss`` and ``wh_loss`` with
    YOLOv3's ``mse`` box terms), ``objectness_loss``, ``class_loss`` (per-image means).
    """

    # With --time: the variable of the run's planned optimizer steps, which the learning
    # rate schedule reads (set by yolo3.engine.builders.build_trainer).
    planned_steps = None

    def __init__(
        self,
        body,
        *,
        head,
        ignore_thresh=IGNORE_THRESH,
        iou_thresh=IOU_THRESH,
        neighbour_cells=False,
        loss_options=None,
        remat="off",
        multi_scale=None,
        accumulate=1,
        communication=None,
        ema=None,
        **kwargs,
    ):
        super().__init__(name=kwargs.pop("name", "yolo_trainer"), **kwargs)
        if int(accumulate) != accumulate or accumulate < 1:
            raise ValueError(f"--accumulate {accumulate}: use a whole number of micro-batches >= 1")
        self.accumulate = int(accumulate)
        self.communication = communication or AllReduce()
        # What the step and the communication tell the callbacks: the stop request, the
        # dense phase.
        self.status = TrainingStatus()
        # The communication's state layer, tracked for saving. Private: Keras saves a
        # model's public attributes in name order before its ``layers`` (where checkpoints
        # hold the state, by class name) and its private ones after.
        self._communication_state = None
        self.body = body
        self.multi_scale = multi_scale
        self.scale_history = []  # the size of every step this process has trained
        self.scale_functions = {}  # size -> its compiled train function
        self.remat = remat
        self._remat_forward = None if remat == "off" else RematForward(body, remat)
        self.head = head
        self.ignore_thresh = float(ignore_thresh)
        self.iou_thresh = float(iou_thresh)
        if neighbour_cells and min(head.scale_x_y) < NEIGHBOUR_SCALE_X_Y:
            raise ValueError(
                "--neighbour-cells on: a neighbour cell's prediction reaches the box centre "
                f"only with a grid sensitivity of at least {NEIGHBOUR_SCALE_X_Y:g} (the head "
                f"has {', '.join(f'{v:g}' for v in head.scale_x_y)}); give --scale-x-y 2"
            )
        self.neighbour_cells = bool(neighbour_cells)
        self.loss_options = loss_options or LossOptions()
        self.term_names = loss_terms(self.loss_options.iou_loss)
        self.term_trackers = [
            keras.metrics.Mean(name=term_log_key(term)) for term in self.term_names
        ]
        # Multiplies the learning rate; lowered by a plateau callback, saved with the model.
        self.lr_scale = self.add_weight(
            shape=(), initializer="ones", trainable=False, name="lr_scale"
        )
        # Private, as the communication's state: saved after the layers, so that the
        # state files of runs without an average are as they were.
        self._weight_average = None
        self._averaged = False  # the body holds the averages (within averaged_weights)
        if ema is not None:
            decay, warmup = ema
            self._weight_average = WeightAverage(body, decay=decay, warmup=warmup)

    @property
    def weight_average(self):
        """The :class:`yolo3.engine.averaging.WeightAverage` of the body, or None."""
        return self._weight_average

    def averaged_weights(self):
        """A context in which the body holds its weights' moving average (if the trainer
        keeps one and it has started; else the weights as they are); the weights are back
        after it. Nested, the inner one changes nothing."""
        if self._weight_average is None or self._averaged:
            return contextlib.nullcontext()
        return self._swapped_in()

    @contextlib.contextmanager
    def _swapped_in(self):
        drift = not self.communication.all_reduces_in_step
        with self._weight_average.swapped_in(self.distribute_strategy, replicas_drift=drift):
            self._averaged = True
            try:
                yield
            finally:
                self._averaged = False

    def evaluate(self, *args, **kwargs):
        """Keras's ``evaluate``, on the weights' moving average when the trainer keeps one
        (as ``fit``'s validation)."""
        with self.averaged_weights():
            return super().evaluate(*args, **kwargs)

    def compile(self, *args, **kwargs):
        super().compile(*args, **kwargs)
        if self.optimizer is None:
            return
        self.communication.build(self.body, self.status)
        self._communication_state = self.communication.state
        self.communication.install(self.optimizer)

    def _should_eval(self, epoch, validation_freq):
        # A job asked to stop goes straight to its backup: no validation pass first.
        return not self.status.stop_requested and super()._should_eval(epoch, validation_freq)

    def train_step(self, data):
        """Keras's step; with ``accumulate`` > 1, ``data`` is a tuple of micro-batches
        (:func:`yolo3.engine.step.accumulated_step`).

        The communication's own work of the step (``in_step``) comes first: with overlapped
        local steps, the step's share of the previous period's synchronisation.
        """
        # Plain TensorFlow ops decided by Python settings: AutoGraph has nothing to convert
        # there (and warns on the base class's empty method when it tries).
        tf.autograph.experimental.do_not_convert(self.communication.in_step)()
        if self.accumulate == 1:
            return super().train_step(data)
        return accumulated_step(self, data)

    def call(self, images, training=False):
        if keras.backend.standardize_dtype(images.dtype) == "uint8":
            images = ops.cast(images, self.compute_dtype) / 255.0
        if training and self._remat_forward is not None:
            return self._remat_forward(images)
        return self.body(images, training=training)

    def test_step(self, data):
        """Keras's step, or with ``(x, y, weights)`` each image weighted: ``weights`` ``(N,)``
        is 0 for the images that pad a validation pass to whole global batches
        (:func:`yolo3.data.pipeline.padded_pass_steps`), so that the logged losses are the
        means over the validation images, each counted once."""
        x, y, weights = keras.utils.unpack_x_y_sample_weight(data)
        if weights is None:
            return super().test_step(data)
        y_pred = self(x, training=False)
        per_image, terms = self.per_image_loss(x, y, y_pred)
        weights = ops.cast(ops.reshape(weights, (-1,)), "float32")
        count = ops.sum(weights)
        mean = ops.sum(ops.reshape(per_image, (-1,)) * weights) / ops.maximum(count, 1.0)
        decay = [ops.cast(reg, "float32") for reg in self.losses]
        if decay:
            mean = mean + ops.sum(ops.stack(decay))
        # Keras's Mean metrics sum value x weight and the weights over the replicas.
        self._loss_tracker.update_state(mean, sample_weight=count)
        for tracker, term in zip(self.term_trackers, self.term_names):
            values = ops.reshape(terms[term], (-1,))
            tracker.update_state(values, sample_weight=weights)
        return self.get_metrics_result()

    def per_image_loss(self, x, y, y_pred):
        """``(total (N, 1), terms)`` of :func:`yolo3.model.loss.yolo_loss`, float32, the
        targets built here from padded boxes ``y`` when they are not given."""
        outputs = [ops.cast(output, "float32") for output in y_pred]  # mixed precision
        boxes = None
        if not isinstance(y, (tuple, list)):  # padded boxes: targets are built here
            # The batch's own size: a multi-scale body accepts any.
            input_hw = tuple(x.shape[1:3]) if x is not None else self.body.input_shape[1:3]
            boxes = y
            y = build_targets(
                boxes,
                head=self.head,
                input_hw=input_hw,
                iou_thresh=self.iou_thresh,
                neighbour_cells=self.neighbour_cells,
            )
        total, terms = yolo_loss(
            tuple(y),
            outputs,
            head=self.head,
            ignore_thresh=self.ignore_thresh,
            true_boxes=boxes,
            **dataclasses.asdict(self.loss_options),
        )
        return total, terms

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        del sample_weight, training
        total, terms = self.per_image_loss(x, y, y_pred)
        for tracker, term in zip(self.term_trackers, self.term_names):
            tracker.update_state(terms[term])
        return self.replica_loss(total)

    def replica_loss(self, per_image):
        """The scalar this replica differentiates: :func:`yolo3.model.loss.replica_loss` of
        ``per_image`` (N, 1) over the global batch (this replica's N times the replicas and
        the micro-batches, in equal shares), plus its share of the weight decay in float32.
        Keras unscales it for the logs."""
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        global_batch = ops.shape(per_image)[0] * replicas * self.accumulate
        weight_decay = [ops.cast(reg, "float32") / self.accumulate for reg in self.losses]
        return replica_loss(per_image, global_batch, weight_decay)

    @property
    def metrics(self):
        tracked = [m for m in super().metrics if all(m is not t for t in self.term_trackers)]
        return tracked + list(self.term_trackers)
