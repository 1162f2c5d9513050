"""PNG figures for evaluation, drawn with Pillow: precision/recall curves and image galleries.

Both write atomically (a killed run leaves no half-written PNG) and import neither TensorFlow
nor matplotlib. :func:`gallery_image` gives the gallery as a picture in memory (TensorBoard).
"""

import colorsys
import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from yolo3.fileio import atomic_write

TRUE_BOX_COLOR = (0, 230, 0)
BACKGROUND = (255, 255, 255)
GRID_COLOR = (225, 225, 225)
RAW_CURVE_COLOR = (150, 180, 230)
ENVELOPE_COLOR = (20, 70, 180)


def class_colors(num_classes):
    """One RGB colour per class, the same as :func:`yolo3.detect.class_colors`.

    Repeated here because importing :mod:`yolo3.detect` loads TensorFlow.
    """
    hues = [index / max(num_classes, 1) for index in range(num_classes)]
    return [tuple(int(255 * c) for c in colorsys.hsv_to_rgb(h, 0.9, 1.0)) for h in hues]


def plot_pr_curve(recall, precision, ap, class_name, path, *, size=(480, 360)):
    """Writes one class's precision/recall curve as a PNG of ``size`` (width, height) pixels.

    Args:
        recall, precision: ``(n,)`` curves in detection-rank order, e.g. ``result.recall[c]``
            and ``result.precision[c]`` of :func:`yolo3.evaluate.evaluate_voc`.
        ap: the class's AP, shown in the title (NaN shows as "n/a").
        class_name: shown in the title.
        path: the ``.png`` file to write.

    The light line is the raw curve; the dark step line is its interpolation (precision made
    non-increasing in recall), whose area is the all-point AP.
    """
    recall = np.asarray(recall, np.float64).reshape(-1)
    precision = np.asarray(precision, np.float64).reshape(-1)
    if recall.shape != precision.shape:
        raise ValueError(f"recall has {recall.size} points and precision {precision.size}")
    width, height = size
    left, right, top, bottom = 58, 18, 34, 46
    plot_w, plot_h = width - left - right, height - top - bottom
    if plot_w < 20 or plot_h < 20:
        raise ValueError(f"size {size} is too small for a plot; use at least 100 x 100")
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()

    def to_pixels(r, p):
        return left + r * plot_w, top + (1.0 - p) * plot_h

    for tick in np.arange(6) / 5:
        x, y = to_pixels(tick, tick)
        draw.line((x, top, x, top + plot_h), fill=GRID_COLOR)
        draw.line((left, y, left + plot_w, y), fill=GRID_COLOR)
        draw.line((x, top + plot_h, x, top + plot_h + 4), fill=(0, 0, 0))
        draw.line((left - 4, y, left, y), fill=(0, 0, 0))
        draw.text((x, top + plot_h + 6), f"{tick:.1f}", fill=(0, 0, 0), font=font, anchor="ma")
        draw.text((left - 6, y), f"{tick:.1f}", fill=(0, 0, 0), font=font, anchor="rm")
    draw.rectangle((left, top, left + plot_w, top + plot_h), outline=(0, 0, 0))
    draw.text((left + plot_w / 2, height - 6), "recall", fill=(0, 0, 0), font=font, anchor="md")
    _vertical_text(image, "precision", (12, top + plot_h // 2), font)
    ap_text = f"{ap:.3f}" if ap is not None and np.isfinite(ap) else "n/a"
    title = f"{class_name}:  AP = {ap_text}"
    draw.text((left + plot_w / 2, top / 2), title, fill=(0, 0, 0), font=font, anchor="mm")

    if recall.size:
        draw.line([to_pixels(r, p) for r, p in zip(recall, precision)], fill=RAW_CURVE_COLOR)
        envelope = np.maximum.accumulate(precision[::-1])[::-1]
        steps, previous = [], 0.0
        for r, p in zip(recall, envelope):
            steps += [to_pixels(previous, p), to_pixels(r, p)]
            previous = r
        draw.line(steps, fill=ENVELOPE_COLOR, width=2)
    else:
        draw.text(to_pixels(0.5, 0.5), "no detections", fill=(0, 0, 0), font=font, anchor="mm")
    _save_png(image, path)
    return str(path)


def draw_gallery(
    images,
    ground_truths,
    detections,
    class_names,
    path,
    columns=4,
    *,
    tile_size=320,
    min_score=0.3,
):
    """Writes :func:`gallery_image`'s picture to ``path`` as a PNG; returns the path."""
    canvas = gallery_image(
        images,
        ground_truths,
        detections,
        class_names,
        columns,
        tile_size=tile_size,
        min_score=min_score,
    )
    _save_png(canvas, path)
    return str(path)


def gallery_image(
    images, ground_truths, detections, class_names, columns=4, *, tile_size=320, min_score=0.3
):
    """Tiles images with their true and predicted boxes into one RGB PIL image.

    Args:
        images: PIL images or ``(H, W, 3)`` uint8 RGB arrays, any sizes.
        ground_truths: per image ``{"boxes": (M, 4), "classes": (M,)}`` in that image's pixels
            (drawn as thin dashed green boxes), or None to draw none.
        detections: per image ``{"boxes": (K, 4), "scores": (K,), "classes": (K,)}`` in that
            image's pixels (drawn in the class colour with "name score"), or None.
        class_names: names indexed by class id.
        columns: tiles per row.
        tile_size: each image is scaled to fit a ``tile_size`` square, keeping its aspect.
        min_score: detections scored below it are not drawn (evaluation keeps low-scored
            boxes that would hide the picture).

    The picture is ``min(columns, n) * tile_size`` wide and ``ceil(n / columns) * tile_size``
    high.
    """
    images = list(images)
    if not images:
        raise ValueError("no images to draw")
    for name, entries in (("ground_truths", ground_truths), ("detections", detections)):
        if entries is not None and len(entries) != len(images):
            raise ValueError(f"{len(entries)} {name} entries for {len(images)} images")
    columns = max(1, min(int(columns), len(images)))
    rows = math.ceil(len(images) / columns)
    canvas = Image.new("RGB", (columns * tile_size, rows * tile_size), (40, 40, 40))
    draw = ImageDraw.Draw(canvas)
    font = ImageFont.load_default()
    colors = class_colors(len(class_names))
    for index, image in enumerate(images):
        image = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
        image = image.convert("RGB")
        scale = min(tile_size / image.width, tile_size / image.height)
        new_w, new_h = max(1, round(image.width * scale)), max(1, round(image.height * scale))
        origin_x = index % columns * tile_size + (tile_size - new_w) // 2
        origin_y = index // columns * tile_size + (tile_size - new_h) // 2
        canvas.paste(image.resize((new_w, new_h), Image.BILINEAR), (origin_x, origin_y))

        def to_tile(box, scale=scale, origin_x=origin_x, origin_y=origin_y):
            x_min, y_min, x_max, y_max = (float(v) * scale for v in box)
            return (origin_x + x_min, origin_y + y_min, origin_x + x_max, origin_y + y_max)

        if ground_truths is not None:
            for box in np.asarray(ground_truths[index]["boxes"], np.float64).reshape(-1, 4):
                _dashed_rectangle(draw, to_tile(box), TRUE_BOX_COLOR)
        if detections is not None:
            found = detections[index]
            boxes = np.asarray(found["boxes"], np.float64).reshape(-1, 4)
            for box, score, class_id in zip(boxes, found["scores"], found["classes"]):
                if score < min_score:
                    continue
                color = colors[int(class_id) % len(colors)]
                x_min, y_min, x_max, y_max = to_tile(box)
                draw.rectangle((x_min, y_min, x_max, y_max), outline=color, width=2)
                caption = f"{class_names[int(class_id)]} {float(score):.2f}"
                *_, text_right, text_bottom = draw.textbbox(
                    (x_min + 2, y_min + 1), caption, font=font
                )
                draw.rectangle((x_min, y_min, text_right + 2, text_bottom + 1), fill=color)
                draw.text((x_min + 2, y_min + 1), caption, fill=(0, 0, 0), font=font)
    return canvas


def _dashed_rectangle(draw, box, color, dash=4):
    x_min, y_min, x_max, y_max = box
    corners = [(x_min, y_min), (x_max, y_min), (x_max, y_max), (x_min, y_max), (x_min, y_min)]
    for (x0, y0), (x1, y1) in zip(corners[:-1], corners[1:]):
        length = math.hypot(x1 - x0, y1 - y0)
        for start in np.arange(0.0, length, 2 * dash):
            end = min(start + dash, length)
            fraction_a, fraction_b = start / length, end / length
            draw.line(
                (
                    x0 + (x1 - x0) * fraction_a,
                    y0 + (y1 - y0) * fraction_a,
                    x0 + (x1 - x0) * fraction_b,
                    y0 + (y1 - y0) * fraction_b,
                ),
                fill=color,
            )


def _vertical_text(image, text, center, font):
    """Pastes ``text`` rotated 90 degrees counter-clockwise, centred on ``center``."""
    left, top, right, bottom = font.getbbox(text)
    label = Image.new("RGB", (right - left + 2, bottom - top + 2), BACKGROUND)
    ImageDraw.Draw(label).text((1 - left, 1 - top), text, fill=(0, 0, 0), font=font)
    label = label.rotate(90, expand=True)
    image.paste(label, (center[0] - label.width // 2, center[1] - label.height // 2))


def _save_png(image, path):
    with atomic_write(path) as temp:
        image.save(temp, format="PNG")
