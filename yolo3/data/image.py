"""Reading images as RGB uint8 and letterboxing them to the network's input size.

Letterboxing (as in the original keras-yolo3) scales an image by one factor so that it fits
inside the input, pastes it centred on a gray canvas, and leaves the rest as padding:

    scale = min(input_w / image_w, input_h / image_h)
    new_w, new_h = int(image_w * scale), int(image_h * scale)
    pasted at ((input_w - new_w) // 2, (input_h - new_h) // 2)

:func:`letterbox_geometry` is the single definition of that arithmetic; detection
(:func:`yolo3.inference.postprocess.undo_letterbox`, through its TensorFlow twin
:func:`yolo3.inference.postprocess.letterbox_geometry_tf`) and offline preprocessing use it, so
boxes map back to exactly the pixels that were resized. This module does not import TensorFlow, so
preprocessing worker processes start quickly.

It is also where the limit on an image's size is set, once for every reader
(:data:`MAX_IMAGE_PIXELS`): a PNG of a few kilobytes can declare 30000 x 30000 pixels, and
:func:`open_image` refuses it from its header, naming the file, before anything is decoded.
"""

import contextlib
import io
import os
import struct

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from yolo3 import fileio

# The canvas colour of the original keras-yolo3; the network has seen it as "no content".
PAD_VALUE = 128
# The image files a folder is searched for (a YOLO dataset's, yolo3 detect's inputs): formats
# Pillow reads and writes, so an annotated copy keeps its input's suffix.
IMAGE_SUFFIXES = (".bmp", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp")
# How a letterboxed input is resampled: PIL bicubic, as the original keras-yolo3 and this
# library's preprocessing do, or Darknet's own resize (see letterbox_darknet).
RESAMPLING = ("bicubic", "darknet")
# Pillow's own default, set here so that every process that reads images has it, whatever
# another library did to it: Pillow warns (DecompressionBombWarning) over this many pixels
# and refuses an image over twice as many (DecompressionBombError, 179 million pixels: 537 MB
# as RGB, before the copies that letterboxing and augmentation make of it).
MAX_IMAGE_PIXELS = 89_478_485
Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS
# What Pillow raises for a file it cannot decode: an OSError for an unknown format (its
# UnidentifiedImageError) or corrupt data, SyntaxError for bad PNG chunks, ValueError,
# struct.error for a short header, and DecompressionBombError, which is none of those.
DECODE_ERRORS = (OSError, SyntaxError, ValueError, struct.error, Image.DecompressionBombError)


def letterbox_geometry(image_hw, input_hw):
    """Where an image of size ``image_hw`` lands inside a letterboxed input of ``input_hw``.

    Args:
        image_hw: ``(height, width)`` of the original image in pixels, positive ints.
        input_hw: ``(height, width)`` of the network input in pixels.

    Returns:
        ``(scale_y, scale_x, offset_y, offset_x, new_h, new_w)``: the resized image is
        ``new_h x new_w`` pixels pasted with its top-left corner at ``(offset_x, offset_y)``;
        ``scale_y = new_h / image_h`` and ``scale_x = new_w / image_w`` are the exact per-axis
        factors of that resize (they differ from ``scale`` by the rounding of ``new_*``), so
        a point maps as ``x_input = x_image * scale_x + offset_x``.
    """
    image_h, image_w = (int(v) for v in image_hw)
    input_h, input_w = (int(v) for v in input_hw)
    if min(image_h, image_w, input_h, input_w) < 1:
        raise ValueError(f"image size {image_hw} and input size {input_hw} must be positive")
    # int(image_w * scale) in integer arithmetic: the limiting axis fills the input exactly
    # and the other is floored. Floats can land just below an integer (480 * (416 / 640)
    # must be 312), and the TensorFlow twin below must reproduce this bit for bit.
    if input_w * image_h <= input_h * image_w:
        new_w, new_h = input_w, image_h * input_w // image_w
    else:
        new_w, new_h = image_w * input_h // image_h, input_h
    # An extreme aspect ratio (a 1-pixel-wide strip) would otherwise resize to nothing.
    new_w, new_h = max(new_w, 1), max(new_h, 1)
    offset_y, offset_x = (input_h - new_h) // 2, (input_w - new_w) // 2
    return new_h / image_h, new_w / image_w, offset_y, offset_x, new_h, new_w


def letterbox_image(image, input_hw):
    """Resizes ``image`` (bicubic) to fit ``input_hw`` and pastes it on a gray canvas.

    Args:
        image: a PIL image (any mode; converted with :func:`to_rgb`) or an ``(H, W, 3)``
            uint8 RGB array.
        input_hw: ``(height, width)`` of the network input in pixels.

    Returns:
        ``(input_h, input_w, 3)`` uint8 RGB array; padding is ``(128, 128, 128)``.
    """
    image = to_rgb(image) if isinstance(image, Image.Image) else _array_to_pil(image)
    input_h, input_w = (int(v) for v in input_hw)
    _, _, offset_y, offset_x, new_h, new_w = letterbox_geometry(
        (image.height, image.width), (input_h, input_w)
    )
    canvas = Image.new("RGB", (input_w, input_h), (PAD_VALUE,) * 3)
    canvas.paste(image.resize((new_w, new_h), Image.BICUBIC), (offset_x, offset_y))
    return np.asarray(canvas, dtype=np.uint8)


def darknet_resize(image, new_hw):
    """Darknet's ``resize_image``: separable linear interpolation, no antialiasing.

    Transcribed from pjreddie's ``image.c`` in float32 arithmetic: first along rows, column
    ``c`` samples ``x = c * (w - 1) / (new_w - 1)`` (truncated to the left pixel, weights
    ``1 - dx`` and ``dx``; the last column copies the last pixel), then along columns the
    same way, the last row taking only the ``1 - dy`` term.

    Args:
        image: ``(H, W, C)`` float32.
        new_hw: ``(new_h, new_w)``.

    Returns:
        ``(new_h, new_w, C)`` float32.
    """
    image = np.asarray(image, np.float32)
    height, width = image.shape[:2]
    new_h, new_w = (int(v) for v in new_hw)
    one = np.float32(1)

    def positions(source, target):
        scale = np.float32(source - 1) / np.float32(max(target - 1, 1))
        sample = np.arange(target, dtype=np.float32) * scale
        left = np.minimum(sample.astype(np.int64), source - 1)
        return left, (sample - left.astype(np.float32)).astype(np.float32)

    if width == 1:
        part = np.repeat(image[:, -1:], new_w, axis=1)
    else:
        left, dx = positions(width, new_w)
        right = np.minimum(left + 1, width - 1)
        dx = dx[None, :, None]
        part = (one - dx) * image[:, left] + dx * image[:, right]
        part[:, new_w - 1] = image[:, width - 1]
    top, dy = positions(height, new_h)
    dy = dy[:, None, None]
    resized = (one - dy) * part[top]
    if height > 1:
        below = np.minimum(top + 1, height - 1)
        added = resized + dy * part[below]
        resized[: new_h - 1] = added[: new_h - 1]  # Darknet skips the last row's second term
    return resized.astype(np.float32)


def letterbox_darknet(image, input_hw):
    """Darknet's ``letterbox_image``: :func:`darknet_resize` into a 0.5 gray canvas.

    Pixels are read as Darknet reads them (``uint8 / 255.`` in double, stored as float) and
    the result is the network input itself, float32 in [0, 1]: Darknet never rounds it to
    8 bits. Placement is :func:`letterbox_geometry`, the same as Darknet's.

    Args:
        image: a PIL image or an ``(H, W, 3)`` uint8 RGB array.
        input_hw: ``(height, width)`` of the network input.

    Returns:
        ``(input_h, input_w, 3)`` float32.
    """
    array = np.asarray(to_rgb(image) if isinstance(image, Image.Image) else image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 RGB image, got {array.dtype} {array.shape}")
    input_h, input_w = (int(v) for v in input_hw)
    _, _, offset_y, offset_x, new_h, new_w = letterbox_geometry(array.shape[:2], input_hw)
    pixels = (array.astype(np.float64) / 255.0).astype(np.float32)
    canvas = np.full((input_h, input_w, 3), 0.5, np.float32)
    canvas[offset_y : offset_y + new_h, offset_x : offset_x + new_w] = darknet_resize(
        pixels, (new_h, new_w)
    )
    return canvas


def _array_to_pil(array):
    array = np.asarray(array)
    if array.ndim != 3 or array.shape[-1] != 3 or array.dtype != np.uint8:
        raise ValueError(
            f"expected an (H, W, 3) uint8 RGB array, got shape {array.shape} dtype "
            f"{array.dtype}; convert with yolo3.data.image.to_rgb(PIL.Image.fromarray(...)) first"
        )
    return Image.fromarray(array, mode="RGB")


def to_rgb(image):
    """Converts a PIL image of any common mode to 8-bit RGB.

    Grayscale, palette and CMYK convert directly. Transparent pixels are composited onto
    the letterbox gray rather than whatever colour hides under alpha 0. 16- and 32-bit
    integer images are rescaled (Pillow's own conversion clips everything above 255 to
    white); float images are taken as [0, 1] when they stay within it, else as [0, 255].
    """
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F"):
        values = np.asarray(image).astype(np.float64)
        if image.mode == "F":
            values = values * 255.0 if values.max(initial=0.0) <= 1.0 else values
        elif image.mode.startswith("I;16") or values.max(initial=0.0) > 255:
            values = values / 257.0  # 65535 -> 255
        gray = np.clip(np.round(values), 0, 255).astype(np.uint8)
        return Image.fromarray(np.stack([gray] * 3, axis=-1), mode="RGB")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (PAD_VALUE, PAD_VALUE, PAD_VALUE, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


@contextlib.contextmanager
def open_image(file, name):
    """``PIL.Image.open(file)``, its errors as one ValueError naming the image.

    Covers what the ``with`` block does too (a ``load()``), so a corrupt or truncated file
    fails with the same message wherever it is read. The header alone is checked against the
    pixel limit (:data:`MAX_IMAGE_PIXELS`), so a decompression bomb is refused unread.

    Args:
        file: a path or a binary file object.
        name: how errors refer to the image (usually its path).
    """
    try:
        with Image.open(file) as image:
            yield image
    except UnidentifiedImageError as err:
        # Pillow's own text names its buffer (a memory address), not the file.
        raise ValueError(f"cannot read image {name}: not in an image format Pillow reads") from err
    except DECODE_ERRORS as err:
        raise ValueError(f"cannot read image {name}: {err}") from err


def decode_rgb(data, name="image"):
    """Decodes encoded image bytes as RGB uint8, upright according to the EXIF orientation.

    Args:
        data: the bytes of a JPEG, PNG, BMP, GIF, TIFF or any format Pillow reads.
        name: how errors refer to the image (usually its path).

    Returns:
        ``(H, W, 3)`` uint8 array; H and W after the EXIF rotation.

    Raises:
        ValueError naming the image when Pillow cannot decode it or it is truncated.
    """
    with open_image(io.BytesIO(data), name) as image:
        image.load()  # decode now, so a truncated file fails here and not later
        image = ImageOps.exif_transpose(image)
        return np.asarray(to_rgb(image), dtype=np.uint8)


def load_rgb(path):
    """Reads an image file (local or any ``tf.io.gfile`` path) with :func:`decode_rgb`.

    Raises:
        FileNotFoundError if ``path`` does not exist; ValueError naming the file when it is
        not an image Pillow can decode (or is truncated).
    """
    path = os.fspath(path)
    if not fileio.exists(path):
        raise FileNotFoundError(f"image {path} does not exist")
    return decode_rgb(fileio.read_bytes(path), path)
