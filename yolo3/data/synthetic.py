"""Generated images of coloured shapes with exact boxes, for demos and tests.

Two generators live here:

- :func:`make_image` / :func:`make_dataset`: in-memory batches of ``CLASS_NAMES`` shapes on
  a two-tone noisy ramp (the quickstart, the benchmark and unit tests use them).
- :func:`draw_scene` / :func:`write_demo_dataset`: the demo data set written to disk in the
  annotation-file format, with ``DEMO_CLASS_NAMES`` shapes on textured backgrounds (ramps,
  stripes, checkerboards, blotches; all with pixel noise), partial occlusion and some
  images with no objects at all.

Box convention of the demo data set: a box is the exact extent of the *whole* shape (the
amodal box), ``x_min, y_min, x_max, y_max`` with the max exclusive, so a shape covering
pixel columns 3..9 has ``x_min = 3, x_max = 10``. A later shape may hide part of an
earlier one, but never more than ``1 - min_visible`` of its pixels. Shapes are flat
colours drawn without anti-aliasing, picked to stand out from the background and from
the shapes they overlap, so every box edge is a sharp colour edge in the image.
"""

import dataclasses
import io
import math
import os

import numpy as np
from PIL import Image, ImageDraw

from yolo3.data import annotations

CLASS_NAMES = ("rectangle", "ellipse", "triangle")
DEMO_CLASS_NAMES = ("rectangle", "ellipse", "triangle", "cross")
# Per-image generators are seeded with (seed, split id, index): an image does not depend
# on how many images the other split has.
DEMO_SPLITS = {"train": 0, "val": 1}
_BACKGROUND_KINDS = ("ramp", "stripes", "checkerboard", "blotches")


def _background(rng, size):
    height, width = size
    base = rng.integers(0, 256, 3)
    other = rng.integers(0, 256, 3)
    ramp = np.linspace(0, 1, width)[None, :, None]
    image = base * (1 - ramp) + other * ramp + rng.normal(0, 12, (height, width, 3))
    return Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))


def make_image(rng, size=(128, 128), max_objects=4, min_side=14, max_side=56):
    """One image of ``CLASS_NAMES`` shapes and their boxes.

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


@dataclasses.dataclass(frozen=True)
class SceneConfig:
    """How demo images are drawn.

    Attributes:
        size: ``(height, width)`` of the images in pixels.
        max_objects: the most shapes in one image; a non-empty image has 1..max_objects.
        empty_fraction: the share of images with no shape at all.
        min_side, max_side: the range of a shape's size (the square root of its box area)
            as fractions of the image's shorter side.
        max_aspect: the largest ratio of a box's long side to its short side.
        min_visible: the smallest share of a shape's pixels that later shapes may leave
            visible; 1 forbids any occlusion.
        min_contrast: the RGB distance a shape's colour aims to keep from the background
            palette (the line between its two colours) and from the shapes it overlaps; of
            32 random colours the one farthest from all of them is taken.
        noise: ``(min, max)`` of the per-image standard deviation of background pixel noise.
    """

    size: tuple = (96, 96)
    max_objects: int = 4
    empty_fraction: float = 0.1
    min_side: float = 0.2
    max_side: float = 0.5
    max_aspect: float = 2.0
    min_visible: float = 0.85
    min_contrast: float = 90.0
    noise: tuple = (3.0, 15.0)

    def __post_init__(self):
        height, width = self.size
        if min(height, width) < 16:
            raise ValueError(f"image size {height}x{width} is too small; use at least 16x16")
        if not 0 < self.min_side <= self.max_side <= 1:
            raise ValueError(
                f"min_side {self.min_side} and max_side {self.max_side} must satisfy "
                "0 < min_side <= max_side <= 1"
            )
        if self.max_objects < 1:
            raise ValueError(f"max_objects is {self.max_objects}; expected 1 or more")
        if not 0 <= self.empty_fraction <= 1:
            raise ValueError(f"empty_fraction {self.empty_fraction} is not in [0, 1]")
        if self.max_aspect < 1:
            raise ValueError(f"max_aspect {self.max_aspect} must be >= 1")


@dataclasses.dataclass(frozen=True)
class Scene:
    """One demo image and the truth about every shape in it.

    Attributes:
        image: ``(H, W, 3)`` uint8 RGB.
        boxes: ``(K, 4)`` float32 ``x_min, y_min, x_max, y_max`` in pixels, max exclusive:
            the extent of each whole shape, in drawing order (later shapes are on top).
        classes: ``(K,)`` int64 indices into ``DEMO_CLASS_NAMES``.
        colours: ``(K, 3)`` uint8 flat colour of each shape.
        masks: ``(K, H, W)`` bool, the pixels of each whole shape, hidden parts included.
    """

    image: np.ndarray
    boxes: np.ndarray
    classes: np.ndarray
    colours: np.ndarray
    masks: np.ndarray

    @property
    def visible(self):
        """``(K, H, W)`` bool: the pixels where each shape is the top one."""
        shown = self.masks.copy()
        for index in range(len(shown) - 1):
            shown[index] &= ~np.any(self.masks[index + 1 :], axis=0)
        return shown


def _textured_background(rng, size, noise):
    """``(image, palette)``: float (H, W, 3) pixels and the (2, 3) colours they blend."""
    height, width = size
    palette = rng.uniform(0, 255, (2, 3))
    kind = _BACKGROUND_KINDS[int(rng.integers(len(_BACKGROUND_KINDS)))]
    rows, columns = np.mgrid[0:height, 0:width] / max(height, width)
    angle = rng.uniform(0, 2 * math.pi)
    along = columns * math.cos(angle) + rows * math.sin(angle)
    if kind == "ramp":
        blend = (along - along.min()) / max(along.max() - along.min(), 1e-6)
    elif kind == "stripes":
        periods = rng.uniform(2, 8)
        wave = np.sin(2 * math.pi * periods * along + rng.uniform(0, 2 * math.pi))
        sharpness = rng.uniform(1, 6)  # 1: soft waves; larger: hard-edged bands
        blend = 0.5 + 0.5 * np.tanh(sharpness * wave) / math.tanh(sharpness)
    elif kind == "checkerboard":
        cell = int(rng.integers(max(min(height, width) // 16, 2), max(min(height, width) // 4, 3)))
        grid = np.indices((height, width)) // cell
        blend = ((grid[0] + grid[1]) % 2).astype(np.float64)
    else:  # blotches: coarse random values, smoothly upsampled
        coarse = rng.random((int(rng.integers(3, 7)), int(rng.integers(3, 7))))
        blotches = Image.fromarray(coarse.astype(np.float32))  # mode "F"
        blend = np.asarray(blotches.resize((width, height), Image.BILINEAR), np.float64)
    pixels = palette[0] + (palette[1] - palette[0]) * blend[..., None]
    pixels = pixels + rng.normal(0, rng.uniform(*noise), (height, width, 3))
    return pixels, palette


def _distance_to_segment(points, start, end):
    """RGB distance of each of ``points`` (n, 3) to the segment ``start``-``end``."""
    direction = end - start
    length = max(float(direction @ direction), 1e-9)
    along = np.clip((points - start) @ direction / length, 0, 1)
    return np.linalg.norm(points - (start + along[:, None] * direction), axis=1)


def _pick_colour(rng, palette, neighbours, min_contrast, tries=32):
    """A colour far from the background palette and from overlapping shapes' colours."""
    candidates = rng.integers(0, 256, (tries, 3)).astype(np.float64)
    score = _distance_to_segment(candidates, palette[0], palette[1]) / min_contrast
    for colour in neighbours:
        score = np.minimum(score, np.linalg.norm(candidates - colour, axis=1) / min_contrast)
    return candidates[int(np.argmax(score))].astype(np.uint8)  # the best if none is far enough


def _shape_mask(rng, class_id, box, size):
    """The (H, W) bool pixels of one shape inscribed in ``box`` (x0, y0, x1, y1 inclusive)."""
    height, width = size
    x0, y0, x1, y1 = box
    canvas = Image.new("L", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    name = DEMO_CLASS_NAMES[class_id]
    if name == "rectangle":
        draw.rectangle([x0, y0, x1, y1], fill=1)
    elif name == "ellipse":
        draw.ellipse([x0, y0, x1, y1], fill=1)
    elif name == "triangle":
        # The base lies on one side of the box, the apex on the middle half of the opposite
        # side: an apex near a corner makes a needle-thin tip, whose end is hard to see.
        side, offset = int(rng.integers(4)), rng.uniform(0.25, 0.75)
        if side in (0, 1):  # apex up or down
            apex_x = x0 + offset * (x1 - x0)
            base_y, apex_y = (y1, y0) if side == 0 else (y0, y1)
            points = [(x0, base_y), (x1, base_y), (apex_x, apex_y)]
        else:  # apex left or right
            apex_y = y0 + offset * (y1 - y0)
            base_x, apex_x = (x1, x0) if side == 2 else (x0, x1)
            points = [(base_x, y0), (base_x, y1), (apex_x, apex_y)]
        draw.polygon(points, fill=1)
    else:  # cross: two bars through the centre, each spanning the whole box
        thickness = rng.uniform(0.25, 0.4)
        half_w = max((x1 - x0 + 1) * thickness / 2, 1.0)
        half_h = max((y1 - y0 + 1) * thickness / 2, 1.0)
        centre_x, centre_y = (x0 + x1) / 2, (y0 + y1) / 2
        draw.rectangle([round(centre_x - half_w), y0, round(centre_x + half_w) - 1, y1], fill=1)
        draw.rectangle([x0, round(centre_y - half_h), x1, round(centre_y + half_h) - 1], fill=1)
    return np.asarray(canvas, np.uint8).astype(bool)


def _mask_box(mask):
    rows = np.flatnonzero(mask.any(axis=1))
    columns = np.flatnonzero(mask.any(axis=0))
    return [columns[0], rows[0], columns[-1] + 1, rows[-1] + 1]


def draw_scene(rng, config=SceneConfig()):
    """One demo image with up to ``config.max_objects`` shapes.

    Each shape gets a few tries at a position where it leaves every earlier shape at least
    ``config.min_visible`` of its pixels visible; a shape that finds none is left out.

    Args:
        rng: a ``numpy.random.Generator``; the scene depends on it alone.
        config: a :class:`SceneConfig`.

    Returns:
        A :class:`Scene`.
    """
    height, width = config.size
    pixels, palette = _textured_background(rng, config.size, config.noise)
    count = 0 if rng.random() < config.empty_fraction else int(rng.integers(config.max_objects)) + 1
    short = min(height, width)
    masks, classes, colours, boxes = [], [], [], []
    for _ in range(count):
        class_id = int(rng.integers(len(DEMO_CLASS_NAMES)))
        side = rng.uniform(config.min_side, config.max_side) * short
        stretch = math.exp(rng.uniform(-1, 1) * math.log(config.max_aspect) / 2)
        box_w = int(np.clip(round(side * stretch), 4, width))
        box_h = int(np.clip(round(side / stretch), 4, height))
        for _ in range(8):
            x0 = int(rng.integers(0, width - box_w + 1))
            y0 = int(rng.integers(0, height - box_h + 1))
            mask = _shape_mask(
                rng, class_id, (x0, y0, x0 + box_w - 1, y0 + box_h - 1), (height, width)
            )
            if _keeps_visible(masks, mask, config.min_visible):
                break
        else:
            continue
        overlapping = [c for m, c in zip(masks, colours) if np.any(m & mask)]
        colours.append(_pick_colour(rng, palette, overlapping, config.min_contrast))
        masks.append(mask)
        classes.append(class_id)
        boxes.append(_mask_box(mask))
    for mask, colour in zip(masks, colours):
        pixels[mask] = colour
    return Scene(
        image=np.clip(np.rint(pixels), 0, 255).astype(np.uint8),
        boxes=np.asarray(boxes, np.float32).reshape(-1, 4),
        classes=np.asarray(classes, np.int64),
        colours=np.asarray(colours, np.uint8).reshape(-1, 3),
        masks=np.asarray(masks, bool).reshape(-1, height, width),
    )


def _keeps_visible(masks, new_mask, min_visible):
    """Whether every earlier shape keeps ``min_visible`` of its pixels under ``new_mask``."""
    covered = new_mask.copy()
    for index in range(len(masks) - 1, -1, -1):  # top first: what is above hides it
        shown = masks[index] & ~covered
        if shown.sum() < min_visible * masks[index].sum():
            return False
        covered |= masks[index]
    return True


def scene_rng(seed, split, index):
    """The generator that draws image ``index`` of ``split`` (``"train"`` or ``"val"``)."""
    return np.random.default_rng((seed, DEMO_SPLITS[split], index))


def write_demo_dataset(output, *, train=4000, val=300, seed=0, config=SceneConfig()):
    """Writes a demo data set: PNG images, annotation files and a classes file.

    Layout under ``output``: ``images/{train,val}/NNNNN.png``, ``train.txt`` and ``val.txt``
    (image paths relative to ``output``, boxes as described in the module docstring) and
    ``classes.txt``. The annotation and classes files are written atomically, last, so a
    reader never finds one that names missing images. The same arguments give the same
    bytes.

    Returns:
        A summary dict: per split ``images``, ``boxes``, ``empty_images`` and
        ``boxes_per_class`` (a list indexed by class id); and ``files``, the paths of the
        annotation and classes files.
    """
    output = os.fspath(output)
    counts = {"train": train, "val": val}
    for split, count in counts.items():
        if count < 0:
            raise ValueError(f"{split} image count is {count}; expected 0 or more")
    summary, files, pending = {}, [], []
    for split, count in counts.items():
        folder = os.path.join(output, "images", split)
        os.makedirs(folder, exist_ok=True)
        lines, per_class, empty = [], np.zeros(len(DEMO_CLASS_NAMES), np.int64), 0
        for index in range(count):
            scene = draw_scene(scene_rng(seed, split, index), config)
            name = f"{index:05d}.png"
            buffer = io.BytesIO()
            Image.fromarray(scene.image).save(buffer, "PNG", compress_level=1)
            with open(os.path.join(folder, name), "wb") as f:
                f.write(buffer.getvalue())
            lines.append(
                annotations.format_line(f"images/{split}/{name}", scene.boxes, scene.classes)
            )
            per_class += np.bincount(scene.classes, minlength=len(DEMO_CLASS_NAMES))
            empty += not len(scene.classes)
        pending.append((os.path.join(output, f"{split}.txt"), lines))
        summary[split] = {
            "images": count,
            "boxes": int(per_class.sum()),
            "empty_images": empty,
            "boxes_per_class": per_class.tolist(),
        }
    pending.append((os.path.join(output, "classes.txt"), list(DEMO_CLASS_NAMES)))
    for path, lines in pending:
        annotations.write_annotations(path, lines)
        files.append(path)
    summary["files"] = files
    return summary
