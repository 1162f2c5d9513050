"""Offline augmentation with the semantics of the original keras-yolo3 ``get_random_data``.

One augmented sample (``w, h`` the input size, ``iw, ih`` the image size, ``U`` uniform):

    aspect = (iw / ih) * U(1 - jitter, 1 + jitter) / U(1 - jitter, 1 + jitter)
    s = U(scale_min, scale_max)
    if aspect < 1: nh = int(s * h); nw = int(nh * aspect)
    else:          nw = int(s * w); nh = int(nw / aspect)
    resize to nw x nh (bicubic), paste at dx = int(U(0, w - nw)), dy = int(U(0, h - nh)) on a
    gray canvas (dx, dy < 0 crops the resized image), flip left-right with probability ``flip``,
    then shift hue by U(-hue, hue) (wrapping around) and scale saturation and value by
    U(1, f) or 1 / U(1, f) with equal odds, clipping both to [0, 1].

Boxes follow the pixels (``x * nw / iw + dx``, a flip maps ``x -> w - x``) and are clipped to
the canvas; a box narrower or shorter than 1 px afterwards is marked ``keep = False``. Rows are
never deleted, so callers can count drops and select class ids with the same mask.
:func:`render_sample` is the same transform onto a canvas of another size than the input's
(a quarter of a mosaic, :mod:`yolo3.data.mosaic`).

Every random number comes from the caller's ``numpy.random.Generator``, eleven per sample in a
fixed order, whatever the config: a seed gives the same sample on any machine and in any
process, and two configs differing only in the colour ranges give the same geometry.

This module imports only NumPy and Pillow, so preprocessing worker processes start quickly.
"""

from dataclasses import dataclass

import numpy as np
from PIL import Image

from yolo3.data.image import PAD_VALUE, letterbox_geometry, letterbox_image, to_rgb
from yolo3.flags import setting

# Uniform draws per sample, in this order: aspect numerator, aspect denominator, scale, dx, dy,
# flip, hue, saturation up-or-down, saturation factor, value up-or-down, value factor.
NUM_DRAWS = 11


@dataclass(frozen=True)
class AugmentConfig:
    """Ranges of the random transform; the defaults are the original keras-yolo3 ones.

    Attributes:
        jitter: aspect-ratio jitter in [0, 1); the aspect ratio is multiplied by the ratio of
            two draws from U(1 - jitter, 1 + jitter).
        scale: ``(min, max)`` of the resized image's long side (for the aspect ratio after
            jitter) as a fraction of the input's matching side; ``0 < min <= max``.
        flip: probability of a left-right flip, in [0, 1].
        hue: hue shift range as a fraction of the colour circle, in [0, 0.5]; the shift is
            U(-hue, hue).
        saturation: saturation factor range, >= 1; the factor is U(1, saturation) or its
            reciprocal with equal odds. 1 leaves saturation unchanged.
        value: value (brightness) factor range, >= 1, drawn like ``saturation``.

    Each is a flag of ``yolo3 preprocess`` (:func:`yolo3.flags.setting`), in its group
    ``"augmentation"``.
    """

    jitter: float = setting(0.3, group="augmentation")
    scale: tuple[float, float] = setting(
        (0.25, 2.0), group="augmentation", nargs=2, metavar=("MIN", "MAX")
    )
    flip: float = setting(0.5, group="augmentation", help="flip probability")
    hue: float = setting(0.1, group="augmentation")
    saturation: float = setting(1.5, group="augmentation")
    value: float = setting(1.5, group="augmentation")

    def __post_init__(self):
        # Accept a list (a config read back from JSON) but store a tuple: the class is hashable.
        scale = tuple(float(v) for v in self.scale)
        object.__setattr__(self, "scale", scale)
        if not 0.0 <= self.jitter < 1.0:
            raise ValueError(f"jitter must be in [0, 1), got {self.jitter}")
        if len(scale) != 2:
            raise ValueError(f"scale must be a (min, max) pair, got {self.scale}")
        if not 0.0 < scale[0] <= scale[1]:
            raise ValueError(
                f"scale must satisfy 0 < min <= max, got min {scale[0]} max {scale[1]}"
            )
        if not 0.0 <= self.flip <= 1.0:
            raise ValueError(f"flip is a probability in [0, 1], got {self.flip}")
        if not 0.0 <= self.hue <= 0.5:
            raise ValueError(f"hue must be in [0, 0.5] (0.5 reaches every hue), got {self.hue}")
        if not self.saturation >= 1.0:
            raise ValueError(
                f"saturation must be >= 1 (factors are U(1, saturation) or the reciprocal), "
                f"got {self.saturation}"
            )
        if not self.value >= 1.0:
            raise ValueError(
                f"value must be >= 1 (factors are U(1, value) or the reciprocal), got {self.value}"
            )


def clip_boxes(boxes, image_hw):
    """Clips boxes to an image.

    Args:
        boxes: ``(M, 4)`` float, ``x_min, y_min, x_max, y_max`` in pixels.
        image_hw: ``(height, width)`` of the image in pixels.

    Returns:
        ``(clipped, was_clipped)``: ``(M, 4)`` float32 boxes within ``[0, width] x
        [0, height]``, and ``(M,)`` bool, True where any coordinate lay outside the image.
    """
    boxes = _as_boxes(boxes)
    clipped = _clip(boxes, image_hw)
    return clipped.astype(np.float32), np.any(clipped != boxes, axis=1)


def letterbox(image, boxes, input_hw):
    """Letterboxes an image and its boxes without any randomness (validation, clean copies).

    The image is resized by ``min(input_w / image_w, input_h / image_h)`` (bicubic) and centred
    on a gray canvas, with the geometry of :func:`yolo3.data.image.letterbox_geometry`, so
    detection's inverse maps boxes back exactly.

    Args:
        image: ``(H, W, 3)`` uint8 RGB array (or a PIL image, converted to RGB).
        boxes: ``(M, 4)`` float, ``x_min, y_min, x_max, y_max`` in image pixels; parts outside
            the image are clipped away first.
        input_hw: ``(input_h, input_w)`` of the network input in pixels.

    Returns:
        ``(pixels, boxes, keep)``: ``(input_h, input_w, 3)`` uint8 RGB; ``(M, 4)`` float32
        boxes in input pixels, row-aligned with the input; ``(M,)`` bool, False where a box
        is narrower or shorter than 1 px after the transform and clipping.
    """
    image = _as_pil(image)
    image_hw = (image.height, image.width)
    scale_y, scale_x, offset_y, offset_x, _, _ = letterbox_geometry(image_hw, input_hw)
    pixels = letterbox_image(image, input_hw)
    boxes = _clip(_as_boxes(boxes), image_hw)
    boxes = boxes * (scale_x, scale_y, scale_x, scale_y) + (offset_x, offset_y, offset_x, offset_y)
    return (pixels, *_finish_boxes(boxes, input_hw))


def random_augment(image, boxes, input_hw, rng, config=AugmentConfig()):
    """One random sample: jittered resize, random placement, flip and HSV jitter.

    Args:
        image: ``(H, W, 3)`` uint8 RGB array (or a PIL image, converted to RGB).
        boxes: ``(M, 4)`` float, ``x_min, y_min, x_max, y_max`` in image pixels; parts outside
            the image are clipped away first.
        input_hw: ``(input_h, input_w)`` of the network input in pixels.
        rng: a ``numpy.random.Generator``; exactly :data:`NUM_DRAWS` uniforms are drawn.
        config: the ranges, an :class:`AugmentConfig`.

    Returns:
        ``(pixels, boxes, keep)`` as :func:`letterbox` returns them.
    """
    input_hw = tuple(int(v) for v in input_hw)
    pixels, boxes = render_sample(
        image, boxes, rng.random(NUM_DRAWS), input_hw, canvas_hw=input_hw, config=config
    )
    return (pixels, *_finish_boxes(boxes, input_hw))


def render_sample(image, boxes, draws, input_hw, canvas_hw, config):
    """:func:`random_augment`'s transform, drawn from given uniforms, onto a canvas of any size.

    The resized image's size is relative to ``input_hw`` (the network input) and its
    placement, flip and padding are on ``canvas_hw``: a mosaic (:mod:`yolo3.data.mosaic`)
    renders each quarter this way, so its objects keep the scale of plain augmented copies.

    Args:
        image: ``(H, W, 3)`` uint8 RGB array (or a PIL image, converted to RGB).
        boxes: ``(M, 4)`` float, ``x_min, y_min, x_max, y_max`` in image pixels; parts outside
            the image are clipped away first.
        draws: :data:`NUM_DRAWS` uniforms in [0, 1), in the order listed beside it.
        input_hw: ``(input_h, input_w)`` of the network input in pixels.
        canvas_hw: ``(canvas_h, canvas_w)`` of the output in pixels.
        config: the ranges, an :class:`AugmentConfig`.

    Returns:
        ``(pixels, boxes)``: ``(canvas_h, canvas_w, 3)`` uint8 RGB, and ``(M, 4)`` float64
        boxes in canvas pixels, flipped with the pixels but not clipped to the canvas.
    """
    image = _as_pil(image)
    canvas_h, canvas_w = (int(v) for v in canvas_hw)
    image_hw = (image.height, image.width)
    new_w, new_h, dx, dy = _random_geometry(draws, image_hw, input_hw, (canvas_h, canvas_w), config)

    # Resize only the part of the resized image that lands on the canvas (Pillow samples the
    # whole source around a box, so edges are right), in two explicit one-axis passes:
    # horizontal, then vertical. One two-axis call lets Pillow pick the order, which differs
    # between a full resize and a box, and between versions, by up to ~20 levels on sharp
    # detail (the intermediate image is rounded and clipped to uint8).
    x0, x1 = max(0, -dx), min(new_w, canvas_w - dx)
    y0, y1 = max(0, -dy), min(new_h, canvas_h - dy)
    scale_x, scale_y = new_w / image.width, new_h / image.height
    visible = image.resize(
        (x1 - x0, image.height), Image.BICUBIC, box=(x0 / scale_x, 0, x1 / scale_x, image.height)
    )
    visible = visible.resize(
        (x1 - x0, y1 - y0), Image.BICUBIC, box=(0, y0 / scale_y, x1 - x0, y1 / scale_y)
    )
    visible = np.asarray(visible)
    pad = np.full((1, 1, 3), PAD_VALUE, np.uint8)
    hue_shift, saturation_factor, value_factor = _colour_factors(draws, config)
    if not (hue_shift == 0.0 and saturation_factor == 1.0 and value_factor == 1.0):
        # HSV jitter is per pixel, so the padding (one colour) is converted once, not per pixel.
        visible = jitter_hsv(visible, hue_shift, saturation_factor, value_factor)
        pad = jitter_hsv(pad, hue_shift, saturation_factor, value_factor)
    pixels = np.empty((canvas_h, canvas_w, 3), np.uint8)
    pixels[...] = pad
    pixels[y0 + dy : y1 + dy, x0 + dx : x1 + dx] = visible

    boxes = _clip(_as_boxes(boxes), image_hw)
    boxes = boxes * (scale_x, scale_y, scale_x, scale_y) + (dx, dy, dx, dy)
    if draws[5] < config.flip:
        pixels = np.ascontiguousarray(pixels[:, ::-1])
        boxes = np.stack(
            [canvas_w - boxes[:, 2], boxes[:, 1], canvas_w - boxes[:, 0], boxes[:, 3]], axis=1
        )
    return pixels, boxes


def jitter_hsv(image, hue_shift, saturation_factor, value_factor):
    """Shifts hue and scales saturation and value, in float32 on [0, 1].

    Args:
        image: ``(H, W, 3)`` uint8 RGB.
        hue_shift: added to the hue (a fraction of the circle), wrapping around [0, 1).
        saturation_factor: multiplies saturation; the result is clipped to [0, 1].
        value_factor: multiplies value (the largest channel); clipped to [0, 1].

    Returns:
        ``(H, W, 3)`` uint8 RGB, ``round(rgb * 255)``.
    """
    image = np.asarray(image)
    if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != np.uint8:
        raise ValueError(
            f"image must be an (H, W, 3) uint8 RGB array, got shape {image.shape} "
            f"dtype {image.dtype}"
        )
    height, width, _ = image.shape
    # Channel planes, each contiguous: strided per-channel views make every ufunc slower.
    planes = np.empty((3, height * width), np.float32)
    np.multiply(image.reshape(-1, 3).T, np.float32(1 / 255), out=planes)
    hue, saturation, value = _rgb_to_hsv_planes(planes[0], planes[1], planes[2])
    # _hsv_to_rgb_planes wraps the shifted hue around [0, 1).
    hue += np.float32(hue_shift)
    np.multiply(saturation, np.float32(saturation_factor), out=saturation)
    np.minimum(saturation, 1.0, out=saturation)
    np.multiply(value, np.float32(value_factor), out=value)
    np.minimum(value, 1.0, out=value)
    _hsv_to_rgb_planes(hue, saturation, value, out=planes)
    # Channels lie in [0, value] up to float error, so +0.5 and truncation rounds without a clip.
    planes *= 255.0
    planes += 0.5
    return planes.T.astype(np.uint8).reshape(height, width, 3)


def rgb_to_hsv(rgb):
    """RGB to HSV as Python's ``colorsys`` defines it, vectorised.

    Args:
        rgb: ``(..., 3)`` float, channels in [0, 1].

    Returns:
        ``(..., 3)`` float32 hue in [0, 1) (0 for grays), saturation and value in [0, 1].
    """
    rgb = np.asarray(rgb, np.float32)
    planes = np.ascontiguousarray(rgb.reshape(-1, 3).T)
    return np.stack(_rgb_to_hsv_planes(*planes), axis=-1).reshape(rgb.shape)


def hsv_to_rgb(hsv):
    """HSV to RGB as Python's ``colorsys`` defines it, vectorised.

    Args:
        hsv: ``(..., 3)`` float, hue in [0, 1] (taken modulo 1), saturation and value in [0, 1].

    Returns:
        ``(..., 3)`` float32 RGB in [0, 1].
    """
    hsv = np.asarray(hsv, np.float32)
    planes = np.ascontiguousarray(hsv.reshape(-1, 3).T)
    out = np.empty_like(planes)
    return _hsv_to_rgb_planes(*planes, out=out).T.reshape(hsv.shape)


def _rgb_to_hsv_planes(red, green, blue):
    # Branch-free on purpose: np.where, np.mod and masked division on per-pixel masks run
    # 20-50 times slower than plain arithmetic, and this is the preprocessing hot path.
    value = np.maximum(red, green)
    np.maximum(value, blue, out=value)
    delta = np.minimum(red, green)
    np.minimum(delta, blue, out=delta)
    np.subtract(value, delta, out=delta)
    # A zero value has a zero delta, so any positive divisor gives saturation 0 there.
    saturation = delta / np.maximum(value, np.float32(1e-30))
    # colorsys's sector: red is the maximum (ties go to red, then green), else green, else blue.
    is_red = red == value
    is_green = (green == value) & ~is_red
    is_blue = ~(is_red | is_green)
    hue6 = (green - blue) * is_red
    hue6 += (blue - red + 2.0 * delta) * is_green
    hue6 += (red - green + 4.0 * delta) * is_blue
    # Grays (delta 0) have a zero numerator: red ties for the maximum and green == blue.
    hue6 /= delta + (delta == 0)
    hue = np.multiply(hue6, np.float32(1 / 6), out=hue6)
    # The red sector spans [-1/6, 1/6]; fold the negative half onto [5/6, 1).
    hue += hue < 0
    hue -= hue >= 1  # float32 rounding of a tiny negative hue + 1
    return hue, saturation, value


def _hsv_to_rgb_planes(hue, saturation, value, out):
    # channel_n = v - v * s * clip(min(k, 4 - k), 0, 1), k = (n + 6 h) mod 6, n = 5, 3, 1 for
    # red, green, blue: the closed form of colorsys's six-sector table.
    hue = np.asarray(hue, np.float32)
    hue6 = hue - np.floor(hue)
    hue6 *= np.float32(6.0)
    chroma = np.asarray(value, np.float32) * np.asarray(saturation, np.float32)
    for channel, n in enumerate((5.0, 3.0, 1.0)):
        k = hue6 + np.float32(n)
        k -= 6.0 * (k >= 6.0)
        ramp = np.minimum(k, 4.0 - k)
        np.clip(ramp, 0.0, 1.0, out=ramp)
        ramp *= chroma
        np.subtract(value, ramp, out=out[channel])
    return out


def _random_geometry(draws, image_hw, input_hw, canvas_hw, config):
    """``(new_w, new_h, dx, dy)``: the resized size, relative to the input, and its offset on
    the canvas (the input itself, or a mosaic's quarter)."""
    image_h, image_w = image_hw
    input_h, input_w = input_hw
    canvas_h, canvas_w = canvas_hw
    low, high = 1.0 - config.jitter, 1.0 + config.jitter
    aspect = (image_w / image_h) * (low + draws[0] * (high - low)) / (low + draws[1] * (high - low))
    scale = config.scale[0] + draws[2] * (config.scale[1] - config.scale[0])
    if aspect < 1:
        new_h = int(scale * input_h)
        new_w = int(new_h * aspect)
    else:
        new_w = int(scale * input_w)
        new_h = int(new_w / aspect)
    new_w, new_h = max(new_w, 1), max(new_h, 1)
    # int() truncates towards zero, as the original did, also when the offset is negative.
    dx = int(draws[3] * (canvas_w - new_w))
    dy = int(draws[4] * (canvas_h - new_h))
    return new_w, new_h, dx, dy


def _colour_factors(draws, config):
    hue_shift = -config.hue + draws[6] * 2.0 * config.hue
    saturation = 1.0 + draws[8] * (config.saturation - 1.0)
    saturation = saturation if draws[7] < 0.5 else 1.0 / saturation
    value = 1.0 + draws[10] * (config.value - 1.0)
    value = value if draws[9] < 0.5 else 1.0 / value
    return hue_shift, saturation, value


def _finish_boxes(boxes, input_hw):
    boxes = _clip(boxes, input_hw)
    keep = (boxes[:, 2] - boxes[:, 0] >= 1.0) & (boxes[:, 3] - boxes[:, 1] >= 1.0)
    return boxes.astype(np.float32), keep


def _clip(boxes, image_hw):
    height, width = (float(v) for v in image_hw)
    return np.clip(boxes, 0.0, (width, height, width, height))


def _as_boxes(boxes):
    boxes = np.asarray(boxes, np.float64)
    if boxes.size == 0:
        return boxes.reshape(0, 4)
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(
            f"boxes must be (M, 4) x_min, y_min, x_max, y_max, got shape {boxes.shape}"
        )
    return boxes


def _as_pil(image):
    if isinstance(image, Image.Image):
        return to_rgb(image)
    array = np.asarray(image)
    if array.ndim != 3 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise ValueError(
            f"image must be an (H, W, 3) uint8 RGB array, got shape {array.shape} "
            f"dtype {array.dtype}"
        )
    return Image.fromarray(array)
