"""Floating-point operations of a built Keras model, counted from its layers.

A multiply-add counts as 2 FLOPs, as Darknet counts them (``BFLOPs`` in its network
printout) and as model FLOPs utilisation is usually stated. Only convolutions
(``Conv1D``, ``Conv2D``, ``Conv3D``, grouped or not) and ``Dense`` layers are counted:
batch norm, leaky ReLU, residual adds, upsampling, concatenation and max pooling do a
handful of operations per activation, under 1% of YOLOv3's convolutions (tiny-YOLOv3 at
416: 5.71 million max-pool comparisons against 5,565 million convolution FLOPs).

A training step costs about 3 times the forward pass: the forward itself, then the
backward pass computes the gradients for the layer inputs and for the weights, each a
convolution of the same size as the forward one (``TRAIN_STEP_FACTOR``).
"""

import math

import keras

TRAIN_STEP_FACTOR = 3
_CONVOLUTIONS = (keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D)


def _sublayers(model):
    """Every layer of ``model``, nested models opened."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _sublayers(layer)
        else:
            yield layer


def _output_positions(layer):
    """Output positions per image: the spatial size of a convolution's output, the leading
    dimensions of a ``Dense`` layer's."""
    try:
        shape = tuple(layer.output.shape)
    except (AttributeError, ValueError) as err:
        raise ValueError(
            f"layer {layer.name!r} has no single output shape to count FLOPs from (called "
            f"more than once, or never built in a functional model): {err}"
        ) from None
    if isinstance(layer, keras.layers.Dense):
        positions = shape[1:-1]
    elif getattr(layer, "data_format", "channels_last") == "channels_first":
        positions = shape[2:]
    else:
        positions = shape[1:-1]
    if any(size is None for size in positions):
        raise ValueError(
            f"layer {layer.name!r} has output shape {shape}: FLOPs need a fixed input size; "
            "build the model with one (e.g. build_model(..., input_size=416))"
        )
    return math.prod(positions)


def flops_by_layer(model):
    """``{layer name: forward FLOPs per image}`` of every convolution and ``Dense`` layer.

    Args:
        model: a built functional ``keras.Model`` with a fixed input size (nested models are
            opened); each counted layer must have been called once in it.

    Returns:
        Ints: ``2 * output positions * kernel size``. The kernel of a grouped convolution
        holds ``in_channels / groups`` inputs per filter, so the product counts groups
        right; a 3x3 Conv2D from 3 to 16 channels on a 416 x 416 output is
        ``2 * 416 * 416 * (3 * 3 * 3 * 16)``.
    """
    counts = {}
    for layer in _sublayers(model):
        if isinstance(layer, (*_CONVOLUTIONS, keras.layers.Dense)):
            kernel_size = math.prod(layer.kernel.shape)
            counts[layer.name] = 2 * _output_positions(layer) * kernel_size
    return counts


def count_flops(model):
    """Forward FLOPs per image of ``model``: the sum of :func:`flops_by_layer`.

    The train step's are ``TRAIN_STEP_FACTOR`` times as many (forward and backward).
    """
    counts = flops_by_layer(model)
    if not counts:
        raise ValueError(f"model {model.name!r} has no convolution or Dense layer to count")
    return sum(counts.values())
