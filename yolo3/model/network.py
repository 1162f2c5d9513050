"""YOLOv3, tiny-YOLOv3 and the Darknet-53 backbone as Keras 3 functional models.

The topology follows Darknet's ``yolov3.cfg``, ``yolov3-tiny.cfg`` and ``darknet53.cfg``.
Every layer carries a stable explicit name derived from the position of its convolution
in the Darknet config (``conv_12``, ``bn_12``, ``leaky_12``), so weights can be matched by
name, converted from Darknet in order, and reloaded in a fresh process.

Input: ``(N, H, W, 3)`` float32 RGB scaled to [0, 1]; ``H`` and ``W`` multiples of 32, or
``None`` for any such size at inference. Output of a detection model: one raw head per
level, ``(N, H / stride, W / stride, num_anchors * (5 + num_classes))``, largest stride
first (32, 16, 8 for YOLOv3; 32, 16 for tiny).
"""

import keras
from keras import layers

from yolo3.model.layers import SyncBatchNormalization
from yolo3.model.resources import MODEL_TYPES

# Darknet normalises with sqrt(variance) + 1e-6 (``normalize_cpu``); Keras uses
# sqrt(variance + epsilon). With epsilon=1e-6 the two agree to ~1e-6 relative, while
# Keras's default of 1e-3 shifts converted outputs by ~1e-2.
BN_EPSILON = 1e-6
LEAKY_SLOPE = 0.1
# The share of a batch-norm moving statistic kept at each training step. Keras's and
# Darknet's .99 keeps 54% of the initial statistics after the 62 steps of an epoch of 1,000
# images at batch 16, and lags the weights after: at 192 px with 1,000 images one seed of two
# scored COCO AP 0.293, and 0.552 with the statistics measured again on its training images.
# Ultralytics' .97 (its BN momentum 0.03): 0.560 +- 0.003 against 0.415 +- 0.122 there,
# 0.646 +- 0.003 against 0.644 +- 0.002 on the demo's task (docs/benchmarks.md).
BN_MOMENTUM = 0.97
DEFAULT_WEIGHT_DECAY = 5e-4

# The name each builder gives its model: how a built model says which architecture it is.
MODEL_NAMES = {"yolov3": "yolo_body", "tiny": "tiny_yolo_body", "darknet53": "darknet53"}


class _Builder:
    """Numbers convolutions in Darknet order and names every layer after that number."""

    def __init__(self, weight_decay, synchronized_bn, bn_momentum=BN_MOMENTUM):
        self.weight_decay = weight_decay
        self.synchronized_bn = synchronized_bn
        self.bn_momentum = bn_momentum
        self.conv_index = 0
        self.counts = {}

    def _name(self, kind):
        index = self.counts.get(kind, 0)
        self.counts[kind] = index + 1
        return f"{kind}_{index}"

    def conv(self, x, filters, kernel_size, strides=1, batch_norm=True):
        """Darknet ``[convolutional]``: conv, then batch norm and leaky ReLU unless it is a head."""
        index = self.conv_index
        self.conv_index += 1
        if strides == 2:
            # Darknet pads stride-2 convolutions on the top and left only.
            x = layers.ZeroPadding2D(((1, 0), (1, 0)), name=f"pad_{index}")(x)
        regularizer = keras.regularizers.L2(self.weight_decay) if self.weight_decay else None
        x = layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding="valid" if strides == 2 else "same",
            use_bias=not batch_norm,
            kernel_regularizer=regularizer,
            name=f"conv_{index}",
        )(x)
        if batch_norm:
            # Not BatchNormalization(synchronized=True): its one-pass E[x^2] - E[x]^2 variance
            # cancels in float32 for channels whose mean is large against their spread.
            norm = SyncBatchNormalization if self.synchronized_bn else layers.BatchNormalization
            x = norm(epsilon=BN_EPSILON, momentum=self.bn_momentum, name=f"bn_{index}")(x)
            x = layers.LeakyReLU(negative_slope=LEAKY_SLOPE, name=f"leaky_{index}")(x)
        return x

    def residual_stage(self, x, filters, num_blocks):
        x = self.conv(x, filters, 3, strides=2)
        for _ in range(num_blocks):
            y = self.conv(x, filters // 2, 1)
            y = self.conv(y, filters, 3)
            x = layers.Add(name=self._name("add"))([x, y])
        return x

    def upsample(self, x):
        return layers.UpSampling2D(2, name=self._name("upsample"))(x)

    def concat(self, tensors):
        return layers.Concatenate(name=self._name("concat"))(tensors)

    def maxpool(self, x, strides):
        return layers.MaxPooling2D(2, strides=strides, padding="same", name=self._name("maxpool"))(
            x
        )


def _check_inputs(inputs, input_shape):
    if inputs is None:
        inputs = keras.Input(shape=tuple(input_shape), name="image")
    height, width, channels = inputs.shape[1:]
    if channels != 3:
        raise ValueError(f"input has {channels} channels; YOLOv3 expects 3 (RGB)")
    for size in (height, width):
        if size is not None and size % 32:
            raise ValueError(
                f"input size {size} is not a multiple of 32; use e.g. {max(32, size // 32 * 32)}"
            )
    return inputs


def _darknet53(builder, inputs):
    x = builder.conv(inputs, 32, 3)
    x = builder.residual_stage(x, 64, 1)
    x = builder.residual_stage(x, 128, 2)
    stride_8 = builder.residual_stage(x, 256, 8)
    stride_16 = builder.residual_stage(stride_8, 512, 8)
    stride_32 = builder.residual_stage(stride_16, 1024, 4)
    return stride_8, stride_16, stride_32


def darknet_body(
    inputs=None,
    *,
    input_shape=(None, None, 3),
    weight_decay=DEFAULT_WEIGHT_DECAY,
    synchronized_bn=False,
    bn_momentum=BN_MOMENTUM,
):
    """Darknet-53 feature extractor: 52 convolutions, ``conv_0`` to ``conv_51``.

    Returns a model whose outputs are the feature maps at strides 8, 16 and 32
    (256, 512 and 1024 channels): the taps YOLOv3's heads use.
    """
    inputs = _check_inputs(inputs, input_shape)
    builder = _Builder(weight_decay, synchronized_bn, bn_momentum)
    return keras.Model(inputs, list(_darknet53(builder, inputs)), name="darknet_body")


def _detection_block(builder, x, filters, out_channels):
    """Five alternating 1x1/3x3 convs, then a 3x3 and the linear 1x1 head."""
    for _ in range(2):
        x = builder.conv(x, filters, 1)
        x = builder.conv(x, filters * 2, 3)
    x = builder.conv(x, filters, 1)
    head = builder.conv(x, filters * 2, 3)
    head = builder.conv(head, out_channels, 1, batch_norm=False)
    return x, head


def _validate_counts(num_anchors, num_classes):
    if num_anchors < 1:
        raise ValueError(f"num_anchors must be at least 1 per level, got {num_anchors}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be at least 1, got {num_classes}")
    return num_anchors * (5 + num_classes)


def yolo_body(
    inputs=None,
    num_anchors=3,
    num_classes=80,
    *,
    input_shape=(None, None, 3),
    weight_decay=DEFAULT_WEIGHT_DECAY,
    synchronized_bn=False,
    bn_momentum=BN_MOMENTUM,
):
    """YOLOv3 (``yolov3.cfg``): Darknet-53 plus heads at strides 32, 16 and 8.

    Args:
        inputs: a ``keras.Input`` of shape (H, W, 3), or None to make one from ``input_shape``.
        num_anchors: anchors per level (3 for the standard 9 anchors).
        num_classes: number of object classes.
        synchronized_bn: batch-norm training statistics over the global batch of a
            distribution strategy (``yolo3.model.layers.SyncBatchNormalization``) instead of each
            replica's local batch.
        bn_momentum: the share of each batch-norm moving statistic kept at a training step.

    Returns:
        ``keras.Model`` named ``yolo_body`` with outputs ``conv_58``, ``conv_66``, ``conv_74``.
    """
    out_channels = _validate_counts(num_anchors, num_classes)
    inputs = _check_inputs(inputs, input_shape)
    builder = _Builder(weight_decay, synchronized_bn, bn_momentum)
    stride_8, stride_16, stride_32 = _darknet53(builder, inputs)

    x, head_32 = _detection_block(builder, stride_32, 512, out_channels)
    x = builder.upsample(builder.conv(x, 256, 1))
    x = builder.concat([x, stride_16])
    x, head_16 = _detection_block(builder, x, 256, out_channels)
    x = builder.upsample(builder.conv(x, 128, 1))
    x = builder.concat([x, stride_8])
    _, head_8 = _detection_block(builder, x, 128, out_channels)
    return keras.Model(inputs, [head_32, head_16, head_8], name=MODEL_NAMES["yolov3"])


def tiny_yolo_body(
    inputs=None,
    num_anchors=3,
    num_classes=80,
    *,
    input_shape=(None, None, 3),
    weight_decay=DEFAULT_WEIGHT_DECAY,
    synchronized_bn=False,
    bn_momentum=BN_MOMENTUM,
):
    """tiny-YOLOv3 (``yolov3-tiny.cfg``): 13 convolutions, heads at strides 32 and 16.

    Returns:
        ``keras.Model`` named ``tiny_yolo_body`` with outputs ``conv_9`` and ``conv_12``.
    """
    out_channels = _validate_counts(num_anchors, num_classes)
    inputs = _check_inputs(inputs, input_shape)
    builder = _Builder(weight_decay, synchronized_bn, bn_momentum)
    x = inputs
    for filters in (16, 32, 64, 128):
        x = builder.maxpool(builder.conv(x, filters, 3), strides=2)
    stride_16 = builder.conv(x, 256, 3)
    x = builder.maxpool(stride_16, strides=2)
    x = builder.conv(x, 512, 3)
    # Darknet's size-2 stride-1 maxpool pads one row and column at the bottom and right,
    # which is what Keras's "same" padding does here.
    x = builder.maxpool(x, strides=1)
    x = builder.conv(x, 1024, 3)
    x = builder.conv(x, 256, 1)
    head_32 = builder.conv(builder.conv(x, 512, 3), out_channels, 1, batch_norm=False)
    x = builder.upsample(builder.conv(x, 128, 1))
    x = builder.concat([x, stride_16])
    head_16 = builder.conv(builder.conv(x, 256, 3), out_channels, 1, batch_norm=False)
    return keras.Model(inputs, [head_32, head_16], name=MODEL_NAMES["tiny"])


def darknet53_classifier(
    inputs=None,
    num_classes=1000,
    *,
    input_shape=(None, None, 3),
    weight_decay=DEFAULT_WEIGHT_DECAY,
):
    """The ImageNet classifier of ``darknet53.cfg``: Darknet-53, global average pool,
    a biased 1x1 conv (``conv_52``) and a softmax. Output: ``(N, num_classes)`` probabilities.
    """
    inputs = _check_inputs(inputs, input_shape)
    builder = _Builder(weight_decay, False)
    _, _, x = _darknet53(builder, inputs)
    x = layers.GlobalAveragePooling2D(keepdims=True, name="avgpool")(x)
    x = builder.conv(x, num_classes, 1, batch_norm=False)
    x = layers.Flatten(name="flatten")(x)
    outputs = layers.Softmax(name="softmax")(x)
    return keras.Model(inputs, outputs, name=MODEL_NAMES["darknet53"])


def build_model(model_type, num_classes, *, num_anchors=3, input_size=None, **kwargs):
    """Builds ``yolo_body`` (``model_type="yolov3"``) or ``tiny_yolo_body`` (``"tiny"``).

    ``input_size`` is an int (square), an ``(height, width)`` pair, or None for any size.
    Extra keyword arguments go to the body builder.
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model type {model_type!r}; expected one of {MODEL_TYPES}")
    if isinstance(input_size, int):
        input_size = (input_size, input_size)
    height, width = input_size if input_size is not None else (None, None)
    body = yolo_body if model_type == "yolov3" else tiny_yolo_body
    return body(None, num_anchors, num_classes, input_shape=(height, width, 3), **kwargs)


def build_head_model(head, *, input_size=None, **kwargs):
    """The network of ``head`` (a :class:`yolo3.model.head.HeadSpec`): its model type,
    classes and anchors per level, at ``input_size`` when given, else the head's own (None
    there: any size). Extra keyword arguments go to the body builder."""
    return build_model(
        head.model_type,
        head.num_classes,
        num_anchors=head.anchors_per_level,
        input_size=input_size if input_size is not None else head.input_hw,
        **kwargs,
    )


def model_type_of(model):
    """``"yolov3"``, ``"tiny"`` or ``"darknet53"`` for a model built here, else None."""
    return {name: kind for kind, name in MODEL_NAMES.items()}.get(getattr(model, "name", None))


def head_layer_names(model_type):
    """Names of the output convolutions, largest stride first."""
    return ["conv_58", "conv_66", "conv_74"] if model_type == "yolov3" else ["conv_9", "conv_12"]


def set_head_biases(model, model_type, biases):
    """Sets the biases of ``model``'s output convolutions to ``biases`` (largest stride
    first), e.g. :func:`yolo3.model.head.prior_biases`."""
    for name, bias in zip(head_layer_names(model_type), biases, strict=True):
        model.get_layer(name).bias.assign(bias)
