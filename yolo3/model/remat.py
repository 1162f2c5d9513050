"""Recomputing activations in the backward pass instead of keeping them (``--remat``).

A training step keeps every activation of the forward pass until the backward pass has used
it; for YOLOv3 that, not the weights, is what fills a GPU as the batch grows.
:class:`RematForward` runs the template body in *segments*, one Darknet ``[convolutional]``
unit each (convolution, batch norm, leaky ReLU, and the add, concat, upsample or max pool
that follows the unit before it), and keeps only what crosses a segment's border: in the
backward pass each segment is run again from its kept inputs, and its gradients are taken
from that second run. That is about one forward pass more per step, for a step that keeps
one tensor per unit instead of five or six (the convolution's output, batch norm's
float32 copy and its output, the activation).

Modes: ``full`` recomputes every segment; ``large`` only those at strides 1 to 8 (52 x 52
and finer at 416), which hold four fifths of YOLOv3's activations, leaving the deep and
cheap-to-keep ones as they are; ``off`` runs the body as one model.

Why not ``keras.RematScope``: in Keras 3.15 on TensorFlow it wraps each layer's ``call`` in
``tf.recompute_grad``, whose custom gradient refuses keyword arguments in graph mode, so any
layer called with ``training=`` (batch norm) fails inside ``model.fit`` (keras#21207). It
would also recompute one layer at a time, still keeping each layer's input, which saves
little here. And ``tf.recompute_grad`` itself runs a batch norm's moving-statistics update a
second time when it recomputes; here the recomputation freezes them.

Not with synchronised batch norm on several replicas: the all-reduces of the recomputed
statistics, and of their gradients, were seen to reach the replicas in different orders
("Shape mismatch in the collective instance ..."), so that combination is refused; each
replica's own batch norm (``--sync-bn off``) recomputes fine under any strategy.

The segments are sub-models over the template's own layers: the same variables, so weights
and checkpoints are the template's, and the outputs are the template's to the last bit.
"""

import contextlib

import keras
import tensorflow as tf

from yolo3.model.layers import SyncBatchNormalization

REMAT_CHOICES = ("off", "full", "large")
# --remat large: segments whose outputs are at most this many times smaller than the input.
LARGE_MAX_STRIDE = 8


def _tensors(value):
    return value if isinstance(value, (list, tuple)) else [value]


def _is_unit_end(layer, output_names):
    """A segment ends at a unit's activation, and at a head (a model output)."""
    return isinstance(layer, keras.layers.LeakyReLU) or layer.output.name in output_names


def _stride_change(layer):
    """How much ``layer`` divides (> 1) or multiplies (< 1) the spatial size."""
    if isinstance(layer, (keras.layers.Conv2D, keras.layers.MaxPooling2D)):
        return layer.strides[0]
    if isinstance(layer, keras.layers.UpSampling2D):
        return 1 / layer.size[0]
    return 1


class _Segment:
    """Consecutive layers of the body as a sub-model: ``inputs`` and ``outputs`` are the
    names of the template's tensors that cross its borders."""

    def __init__(self, model, inputs, outputs, stride, recompute):
        self.model = model
        self.inputs = inputs
        self.outputs = outputs
        self.stride = stride
        self.recompute = recompute
        self.batch_norms = [
            layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)
        ]

    def __call__(self, values):
        args = [values[name] for name in self.inputs]
        run = self._recomputed if self.recompute else self._plain
        values.update(zip(self.outputs, run(*args)))

    def _plain(self, *args):
        return _tensors(self.model(list(args), training=True))

    @property
    def _recomputed(self):
        segment = self

        @tf.custom_gradient
        def forward(*args):
            outputs = segment._plain(*args)

            def backward(*output_grads, variables=None):
                variables = list(variables or [])
                # The recomputation may start only once the gradients reach this segment;
                # the identities keep graph optimisers from merging it with the forward run.
                with tf.control_dependencies(output_grads):
                    again_args = [tf.identity(arg) for arg in args]
                with _frozen_statistics(segment.batch_norms), tf.GradientTape() as tape:
                    tape.watch(again_args)
                    again = segment._plain(*again_args)
                grads = tape.gradient(
                    again,
                    again_args + variables,
                    output_gradients=list(output_grads),
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                return grads[: len(args)], grads[len(args) :]

            return outputs, backward

        return forward


@contextlib.contextmanager
def _frozen_statistics(batch_norms):
    """Batch norms whose moving-statistics update keeps the values (momentum 1) while the
    forward pass is traced again: the step's own update already ran."""
    momenta = [layer.momentum for layer in batch_norms]
    for layer in batch_norms:
        layer.momentum = 1.0
    try:
        yield
    finally:
        for layer, momentum in zip(batch_norms, momenta):
            layer.momentum = momentum


def split_into_segments(body):
    """The layers of ``body`` in order, cut after each unit's activation and each head.

    Returns:
        A list of ``(layers, inputs, outputs, stride)``: the segment's layers, the names of
        the tensors it reads from earlier segments (or the image), the names of those it
        makes that later segments or the model's outputs read, and its output stride.
    """
    output_names = {tensor.name for tensor in _tensors(body.output)}
    layers = [layer for layer in body.layers if not isinstance(layer, keras.layers.InputLayer)]
    readers = {}  # tensor name -> index of the last layer that reads it
    for index, layer in enumerate(layers):
        for tensor in _tensors(layer.input):
            readers[tensor.name] = index
    strides = {tensor.name: 1 for tensor in _tensors(body.input)}
    segments, current = [], []
    for index, layer in enumerate(layers):
        current.append(layer)
        stride = strides[_tensors(layer.input)[0].name] * _stride_change(layer)
        strides[layer.output.name] = stride
        if not _is_unit_end(layer, output_names) and index < len(layers) - 1:
            continue
        made = {member.output.name for member in current}
        inputs = []
        for member in current:
            for tensor in _tensors(member.input):
                if tensor.name not in made and tensor.name not in inputs:
                    inputs.append(tensor.name)
        outputs = [
            member.output.name
            for member in current
            if readers.get(member.output.name, -1) > index or member.output.name in output_names
        ]
        segments.append((current, inputs, outputs, stride))
        current = []
    return segments


class RematForward:
    """The training forward pass of ``body`` with activations recomputed per ``mode``.

    Args:
        body: the template model (``yolo_body`` or ``tiny_yolo_body``), built.
        mode: one of ``REMAT_CHOICES`` other than ``off``.

    Calling it with images ``(N, H, W, 3)`` (the body's input dtype) returns the body's
    outputs in training mode, the same values as ``body(images, training=True)``.
    """

    def __init__(self, body, mode):
        if mode not in REMAT_CHOICES or mode == "off":
            raise ValueError(f"--remat {mode!r}: use one of {REMAT_CHOICES}")
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        if replicas > 1 and any(isinstance(x, SyncBatchNormalization) for x in body.layers):
            raise ValueError(
                f"--remat {mode} with synchronised batch norm on {replicas} replicas: their "
                "all-reduces cannot be replayed in the backward pass in one order on every "
                "replica. Use --sync-bn off (each replica's own statistics) or --remat off"
            )
        self.mode = mode
        tensors = {tensor.name: tensor for tensor in _tensors(body.input)}
        for layer in body.layers:
            tensors[layer.output.name] = layer.output
        self.input_name = _tensors(body.input)[0].name
        self.output_names = [tensor.name for tensor in _tensors(body.output)]
        self.segments = []
        for index, (_, inputs, outputs, stride) in enumerate(split_into_segments(body)):
            model = keras.Model(
                [tensors[name] for name in inputs],
                [tensors[name] for name in outputs],
                name=f"{body.name}_segment_{index}",
            )
            recompute = mode == "full" or stride <= LARGE_MAX_STRIDE
            self.segments.append(_Segment(model, inputs, outputs, stride, recompute))

    def __call__(self, images):
        values = {self.input_name: images}
        for segment in self.segments:
            segment(values)
        return [values[name] for name in self.output_names]
