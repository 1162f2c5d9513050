"""Online augmentation: each training image scaled and shifted with its boxes, and its colour
changed, inside ``tf.data`` every time it is read, beside the offline copies of
``yolo3 preprocess`` (:mod:`yolo3.data.augment`).

One sample (``w, h`` the input size, ``U`` uniform, all draws stateless from the image's
``(seed, position)``, so a seed gives the same batches on any machine):

    s = U(1 - scale, 1 + scale); tx = U(-translate, translate) w; ty = U(-translate, translate) h
    a pixel at (x, y) moves to (s (x - w/2) + w/2 + tx, s (y - h/2) + h/2 + ty), bilinear, the
    uncovered part the letterbox's gray; boxes move with the pixels and are clipped to the
    image; a box is dropped when less than :data:`MIN_VISIBLE` of its moved area stays inside
    or a side is under 1 px (the offline rule);
    then the hue, saturation and value change as ``yolo3 preprocess``'s ``--hue``,
    ``--saturation`` and ``--value`` define them: hue shifted by U(-hue, hue), saturation and
    value multiplied by U(1, f) or 1 / U(1, f) with equal odds, clipped to [0, 1].

The image stays its size, so the records' letterbox and the batch shapes are unchanged.
"""

import dataclasses

import tensorflow as tf

from yolo3.data.image import PAD_VALUE

# The least part of a box's moved area that must stay inside the image for it to be kept
# (YOLOv5's random_perspective keeps 0.1): a box cut to a sliver names no object.
MIN_VISIBLE = 0.1
# Stateless draws per image, in this order: scale, x shift, y shift, hue, saturation up or
# down, saturation factor, value up or down, value factor.
NUM_DRAWS = 8


@dataclasses.dataclass(frozen=True)
class OnlineAugment:
    """Ranges of the online transform; the defaults leave images as they are."""

    scale: float = 0.0  # the scale factor is U(1 - scale, 1 + scale); in [0, 1)
    translate: float = 0.0  # the shift is up to this fraction of each side; in [0, 1)
    hue: float = 0.0  # in [0, 0.5], as yolo3 preprocess --hue
    saturation: float = 1.0  # >= 1, as yolo3 preprocess --saturation
    value: float = 1.0  # >= 1, as yolo3 preprocess --value

    @property
    def moves(self):
        """Whether images move (and their boxes with them)."""
        return self.scale > 0 or self.translate > 0

    @property
    def colours(self):
        return self.hue > 0 or self.saturation > 1 or self.value > 1

    def __bool__(self):
        return self.moves or self.colours

    def problems(self):
        """``(field, "must be ...")`` for each field out of range."""
        checks = (
            ("scale", 0.0 <= self.scale < 1.0, "must be in [0, 1)"),
            ("translate", 0.0 <= self.translate < 1.0, "must be in [0, 1)"),
            ("hue", 0.0 <= self.hue <= 0.5, "must be in [0, 0.5]"),
            ("saturation", self.saturation >= 1.0, "must be >= 1 (1: off)"),
            ("value", self.value >= 1.0, "must be >= 1 (1: off)"),
        )
        return [(field, rule) for field, ok, rule in checks if not ok]


def augment(image, boxes, seed, config):
    """One image and its boxes through ``config``'s transform, drawn from ``seed``.

    Args:
        image: ``(H, W, 3)`` uint8.
        boxes: ``(M, 5)`` float32 corners in pixels and the class id, no padding rows.
        seed: shape (2,) int64 tensor, the image's own (``(seed, position)``).
        config: an :class:`OnlineAugment`.

    Returns:
        ``(image, boxes)``: ``(H, W, 3)`` uint8, and the ``(M', 5)`` boxes kept, moved.
    """
    # Folded: the flip draws from the image's seed itself.
    seed = tf.random.experimental.stateless_fold_in(seed, 1)
    draws = tf.random.stateless_uniform([NUM_DRAWS], seed=seed, dtype=tf.float32)
    return transform(image, boxes, draws, config)


def transform(image, boxes, draws, config):
    """:func:`augment` with its :data:`NUM_DRAWS` uniform draws given."""
    pixels = tf.cast(image, tf.float32)
    boxes = tf.convert_to_tensor(boxes, tf.float32)
    if config.moves:
        pixels, boxes = _move(pixels, boxes, draws, config)
    if config.colours:
        pixels = _recolour(pixels, draws, config)
    return tf.cast(tf.clip_by_value(tf.round(pixels), 0.0, 255.0), tf.uint8), boxes


def _move(pixels, boxes, draws, config):
    shape = tf.shape(pixels)
    height, width = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    scale = 1.0 - config.scale + 2.0 * config.scale * draws[0]
    shift_x = (2.0 * draws[1] - 1.0) * config.translate * width
    shift_y = (2.0 * draws[2] - 1.0) * config.translate * height
    centre_x, centre_y = width / 2.0, height / 2.0
    # crop_and_resize samples output row i at input row y1 (H - 1) + i (y2 - y1) (H - 1) /
    # (H - 1), by pixel index; a pixel's index is its centre's coordinate less a half, so the
    # image's centre in indices is (H - 1) / 2. Output index i must sample
    # (i - (c + ty)) / s + c: y2 - y1 = 1 / s and y1 (H - 1) = c - (c + ty) / s (the same
    # for x). (Twice as fast as ImageProjectiveTransform for this axis-aligned map.)
    index_x, index_y = (width - 1.0) / 2.0, (height - 1.0) / 2.0
    y1 = (index_y - (index_y + shift_y) / scale) / (height - 1.0)
    x1 = (index_x - (index_x + shift_x) / scale) / (width - 1.0)
    window = tf.stack([y1, x1, y1 + 1.0 / scale, x1 + 1.0 / scale])
    moved = tf.image.crop_and_resize(
        pixels[None], window[None], [0], shape[:2], extrapolation_value=float(PAD_VALUE)
    )[0]
    offset = tf.stack([centre_x + shift_x, centre_y + shift_y] * 2)
    centre = tf.stack([centre_x, centre_y] * 2)
    corners = (boxes[:, :4] - centre) * scale + offset
    inside = tf.clip_by_value(corners, 0.0, tf.stack([width, height] * 2))
    sides = inside[:, 2:4] - inside[:, 0:2]
    area = tf.reduce_prod(corners[:, 2:4] - corners[:, 0:2], axis=1)
    visible = tf.reduce_prod(tf.maximum(sides, 0.0), axis=1)
    keep = (
        tf.reduce_all(sides >= 1.0, axis=1)
        & (visible >= MIN_VISIBLE * area)
    )  # fmt: skip
    moved_boxes = tf.concat([inside, boxes[:, 4:]], axis=1)
    return moved, tf.boolean_mask(moved_boxes, keep)


def _factor(up, amount, limit):
    """U(1, limit) or its reciprocal with equal odds, from two draws in [0, 1)."""
    factor = 1.0 + amount * (limit - 1.0)
    return tf.where(up < 0.5, factor, 1.0 / factor)


def _recolour(pixels, draws, config):
    hsv = tf.image.rgb_to_hsv(pixels / 255.0)
    hue = tf.math.floormod(hsv[..., 0] + (2.0 * draws[3] - 1.0) * config.hue, 1.0)
    saturation = hsv[..., 1] * _factor(draws[4], draws[5], config.saturation)
    value = hsv[..., 2] * _factor(draws[6], draws[7], config.value)
    hsv = tf.stack(
        [hue, tf.clip_by_value(saturation, 0.0, 1.0), tf.clip_by_value(value, 0.0, 1.0)], axis=-1
    )
    return tf.image.hsv_to_rgb(hsv) * 255.0
