"""Generated images of coloured shapes with exact boxes, for demos and tests.

Classes: ``rectangle``, ``ellipse``, ``triangle``. Each shape is drawn in a random colour
on a random two-tone noisy background; boxes are the shapes' exact pixel extents.
"""

import numpy as np
from PIL import Image, ImageDraw

CLASS_NAMES = ("rectangle", "ellipse", "triangle")


def _background(rng, size):
    height, width = size
    base = rng.integers(0, 256, 3)
    other = rng.integers(0, 256, 3)
    ramp = np.linspace(0, 1, width)[None, :, None]
    image = base * (1 - ramp) + other * ramp + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def make_image(rng, size=(128, 128), max_objects=4, min_side=14, max_side=56):
    """One image and its boxes.

    Returns:
        ``(image, boxes)``: a PIL RGB image of ``size`` (height, width) and a float32 array
        (k, 5) of x_min, y_min, x_max, y_max in pixels and a class id; k may be 0.
    """
    height, width = size
    image = _background(rng, size)
    draw = ImageDraw.Draw(image)
    boxes = []
    for _ in range(rng.integers(0, max_objects + 1)):
        w, h = rng.integers(min_side, max_side + 1, 2)
        x0, y0 = rng.integers(0, width - w), rng.integers(0, height - h)
        x1, y1 = x0 + w - 1, y0 + h - 1
        class_id = int(rng.integers(len(CLASS_NAMES)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        if class_id == 0:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
        elif class_id == 1:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        else:
            draw.polygon([(x0, y1), (x1, y1), ((x0 + x1) / 2, y0)], fill=colour)
        boxes.append([x0, y0, x1 + 1, y1 + 1, class_id])
    return image, np.asarray(boxes, np.float32).reshape(-1, 5)


def make_dataset(count, seed, size=(128, 128), max_boxes=8, **kwargs):
    """``count`` images as a uint8 array (count, H, W, 3) and padded boxes (count, max_boxes, 5)."""
    rng = np.random.default_rng(seed)
    images = np.zeros((count, *size, 3), np.uint8)
    boxes = np.zeros((count, max_boxes, 5), np.float32)
    for index in range(count):
        image, image_boxes = make_image(rng, size, max_objects=min(max_boxes, 4), **kwargs)
        images[index] = np.asarray(image)
        boxes[index, : len(image_boxes)] = image_boxes
    return images, boxes
