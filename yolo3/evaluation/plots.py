"""PNG figures for evaluation, drawn with Pillow: precision/recall curves, image galleries and
the confusion matrix.

All write atomically (a killed run leaves no half-written PNG) and import neither TensorFlow
nor matplotlib. :func:`gallery_image` gives the gallery as a picture in memory (TensorBoard);
its captions and legend come from :mod:`yolo3.drawing`, which
:func:`yolo3.inference.detect.draw_detections` draws with too.
"""

import math

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from yolo3.drawing import (
    BACKGROUND,
    MISSED_BOX_COLOR,
    TILE_BACKGROUND,
    class_colors,
    draw_caption,
    legend_band,
    outline,
)
from yolo3.evaluation.metrics import FALSE_POSITIVE, match_boxes
from yolo3.fileio import atomic_write

GRID_COLOR = (225, 225, 225)
RAW_CURVE_COLOR = (150, 180, 230)
ENVELOPE_COLOR = (20, 70, 180)
# The confusion matrix's colour scale runs from white (0) to this (a whole column).
HEAT_COLOR = (8, 48, 107)
# Labels longer than this are cut (with "~"), so that 80 COCO names leave room for the grid.
MAX_LABEL_CHARS = 18


def plot_pr_curve(recall, precision, ap, class_name, path, *, size=(480, 360)):
    """Writes one class's precision/recall curve as a PNG of ``size`` (width, height) pixels.

    Args:
        recall, precision: ``(n,)`` curves in detection-rank order, e.g. ``result.recall[c]``
            and ``result.precision[c]`` of :func:`yolo3.evaluation.metrics.evaluate_voc`.
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


def plot_confusion_matrix(matrix, labels, path, *, title="", max_size=1100):
    """Writes a confusion matrix as a heat map PNG; returns the path.

    Args:
        matrix: ``(L, L)`` counts, rows predicted, columns true (as
            :func:`yolo3.evaluation.confusion.confusion_matrix` gives, L = C + 1).
        labels: the L row and column names (class names, then "background").
        path: the ``.png`` file to write.
        title: a line above the grid (the thresholds, say).
        max_size: the grid's side in pixels is at most this (cells are 12 to 56 pixels).

    Each cell's colour is its share of its column (the true class's boxes: where they went),
    so a rare class reads as clearly as a common one; the counts are written in the cells
    when they are 28 pixels or wider (about 35 labels or fewer), and zeros are left blank.
    """
    matrix = np.asarray(matrix, np.int64)
    size = len(labels)
    if matrix.shape != (size, size):
        raise ValueError(f"matrix has shape {matrix.shape} for {size} labels")
    font = ImageFont.load_default()
    names = [_cut(str(label)) for label in labels]
    cell = int(np.clip(max_size // max(size, 1), 12, 56))
    label_w = max(font.getbbox(name)[2] for name in names) + 8
    left, top = label_w + 22, label_w + 22 + (18 if title else 0)
    width, height = left + size * cell + 12, top + size * cell + 12
    if title:
        width = max(width, font.getbbox(title)[2] + 16)
    image = Image.new("RGB", (width, height), BACKGROUND)
    draw = ImageDraw.Draw(image)
    column_totals = matrix.sum(axis=0)
    shares = np.divide(matrix, column_totals, out=np.zeros(matrix.shape), where=column_totals > 0)
    for row in range(size):
        for column in range(size):
            share = shares[row, column]
            color = tuple(round(255 + (h - 255) * share) for h in HEAT_COLOR)
            x0, y0 = left + column * cell, top + row * cell
            draw.rectangle((x0, y0, x0 + cell, y0 + cell), fill=color, outline=GRID_COLOR)
            count = int(matrix[row, column])
            if cell >= 28 and count:
                text = str(count)
                if font.getbbox(text)[2] < cell - 2:
                    ink = (255, 255, 255) if share > 0.5 else (0, 0, 0)
                    center = (x0 + cell / 2, y0 + cell / 2)
                    draw.text(center, text, fill=ink, font=font, anchor="mm")
    draw.rectangle((left, top, left + size * cell, top + size * cell), outline=(0, 0, 0))
    for index, name in enumerate(names):
        middle = index * cell + cell // 2
        draw.text((left - 4, top + middle), name, fill=(0, 0, 0), font=font, anchor="rm")
        _vertical_text(image, name, (left + middle, top - 4), font, align="bottom")
    draw.text((left + size * cell / 2, top - label_w - 14), "true", fill=(0, 0, 0),
              font=font, anchor="mm")  # fmt: skip
    _vertical_text(image, "predicted", (10, top + size * cell // 2), font)
    if title:
        draw.text((width / 2, 4), title, fill=(0, 0, 0), font=font, anchor="ma")
    _save_png(image, path)
    return str(path)


def _cut(label):
    return label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 1] + "~"


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
    iou_threshold=0.5,
    legend=True,
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
        iou_threshold=iou_threshold,
        legend=legend,
    )
    _save_png(canvas, path)
    return str(path)


def gallery_image(
    images,
    ground_truths,
    detections,
    class_names,
    columns=4,
    *,
    tile_size=320,
    min_score=0.3,
    iou_threshold=0.5,
    legend=True,
):
    """Tiles images with their true and predicted boxes into one RGB PIL image.

    Given both truths and detections, each image's detections are matched to its truths by
    :func:`match_image` and the marks tell the outcome (:data:`BOX_STYLES`): a found truth is a
    thin green line, a missed one thick magenta-and-white dashes tagged "miss <name>"; a
    matched detection is solid in its class colour with "<name> <score>", a false positive is
    dashed in its class colour with "FP <name> <score>". Every line has a black halo, so it
    shows on dark, light and green images alike. A match's caption sits inside the top of
    its box when it covers little of it, else just outside; a false positive's above the box
    first; a miss tag at the bottom. All stay within their tile.

    Args:
        images: PIL images or ``(H, W, 3)`` uint8 RGB arrays, any sizes.
        ground_truths: per image ``{"boxes": (M, 4), "classes": (M,)}`` (optionally
            ``"difficult": (M,)`` bool) in that image's pixels, or None to draw none.
        detections: per image ``{"boxes": (K, 4), "scores": (K,), "classes": (K,)}`` in that
            image's pixels, or None. Without truths, all are drawn as matched.
        class_names: names indexed by class id.
        columns: tiles per row.
        tile_size: each image is scaled to fit a ``tile_size`` square, keeping its aspect.
        min_score: detections scored below it are neither drawn nor matched (evaluation keeps
            low-scored boxes that would hide the picture).
        iou_threshold: the IoU at which a detection matches a truth of its class.
        legend: add :func:`legend_band` below the tiles: the marks, and the colours of the
            classes detected.

    The picture is ``min(columns, n) * tile_size`` wide and ``ceil(n / columns) * tile_size``
    high, plus the legend's ``8 + 16 * lines`` pixels.
    """
    images = list(images)
    if not images:
        raise ValueError("no images to draw")
    for name, entries in (("ground_truths", ground_truths), ("detections", detections)):
        if entries is not None and len(entries) != len(images):
            raise ValueError(f"{len(entries)} {name} entries for {len(images)} images")
    columns = max(1, min(int(columns), len(images)))
    rows = math.ceil(len(images) / columns)
    tiles, detected_classes = [], set()
    for index, image in enumerate(images):
        truth = None if ground_truths is None else ground_truths[index]
        found = None if detections is None else detections[index]
        tile, classes = _gallery_tile(
            image, truth, found, class_names, tile_size, min_score, iou_threshold
        )
        tiles.append(tile)
        detected_classes.update(classes)
    band = None
    if legend:
        if ground_truths is None:
            marks = ("detection",)
        elif detections is None:
            marks = ("truth",)
        else:
            marks = ("truth", "missed", "match", "false_positive")
        band = legend_band(columns * tile_size, class_names, detected_classes, marks)
    height = rows * tile_size + (band.height if band else 0)
    canvas = Image.new("RGB", (columns * tile_size, height), TILE_BACKGROUND)
    for index, tile in enumerate(tiles):
        canvas.paste(tile, (index % columns * tile_size, index // columns * tile_size))
    if band:
        canvas.paste(band, (0, rows * tile_size))
    return canvas


def match_image(truth, detection, *, iou_threshold=0.5):
    """Which detections and truths of one image matched, by the VOC rule.

    Per class, :func:`yolo3.evaluation.metrics.match_boxes` takes the detections by descending
    score; each matches the truth it overlaps most if IoU >= ``iou_threshold`` and no
    higher-scored detection took that truth first, so a truth matches at most once.

    Args:
        truth: ``{"boxes": (M, 4), "classes": (M,)}``, optionally ``"difficult": (M,)``.
        detection: ``{"boxes": (K, 4), "scores": (K,), "classes": (K,)}``, the same pixels.

    Returns:
        ``(matched (K,), found (M,))`` bool: the detections that are not false positives and
        the truths that are not missed. VOC scores neither a detection of a difficult truth
        nor a difficult truth left alone, so both count as matched and found.
    """
    gt_boxes = np.asarray(truth["boxes"], np.float64).reshape(-1, 4)
    gt_classes = np.asarray(truth["classes"], np.int64).reshape(-1)
    difficult = truth.get("difficult")
    if difficult is None:
        difficult = np.zeros(len(gt_boxes), bool)
    difficult = np.asarray(difficult, bool).reshape(-1)
    det_boxes = np.asarray(detection["boxes"], np.float64).reshape(-1, 4)
    det_classes = np.asarray(detection["classes"], np.int64).reshape(-1)
    det_scores = np.asarray(detection["scores"], np.float64).reshape(-1)
    matched, found = np.zeros(len(det_boxes), bool), difficult.copy()
    for class_id in np.unique(det_classes):
        in_class = np.flatnonzero(det_classes == class_id)
        gt_in_class = np.flatnonzero(gt_classes == class_id)
        labels, taken = match_boxes(
            det_boxes[in_class],
            det_scores[in_class],
            gt_boxes[gt_in_class],
            difficult[gt_in_class],
            iou_threshold=iou_threshold,
        )
        matched[in_class] = labels != FALSE_POSITIVE
        found[gt_in_class[taken]] = True
    return matched, found


def _gallery_tile(image, truth, detection, class_names, tile_size, min_score, iou_threshold):
    """A ``tile_size`` square of ``image`` with its marks, and the class ids detected in it."""
    image = image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))
    image = image.convert("RGB")
    scale = min(tile_size / image.width, tile_size / image.height)
    new_w, new_h = max(1, round(image.width * scale)), max(1, round(image.height * scale))
    origin_x, origin_y = (tile_size - new_w) // 2, (tile_size - new_h) // 2
    tile = Image.new("RGB", (tile_size, tile_size), TILE_BACKGROUND)
    tile.paste(image.resize((new_w, new_h), Image.BILINEAR), (origin_x, origin_y))

    def to_tile(box):
        x_min, y_min, x_max, y_max = (float(v) * scale for v in box)
        x0, x1 = sorted((round(origin_x + x_min), round(origin_x + x_max)))
        y0, y1 = sorted((round(origin_y + y_min), round(origin_y + y_max)))
        return x0, y0, x1, y1

    gt_boxes, gt_classes = np.zeros((0, 4)), np.zeros(0, np.int64)
    if truth is not None:
        gt_boxes = np.asarray(truth["boxes"], np.float64).reshape(-1, 4)
        gt_classes = np.asarray(truth["classes"], np.int64).reshape(-1)
    det_boxes, det_classes, scores = np.zeros((0, 4)), np.zeros(0, np.int64), np.zeros(0)
    if detection is not None:
        scores = np.asarray(detection["scores"], np.float64).reshape(-1)
        keep = scores >= min_score
        det_boxes = np.asarray(detection["boxes"], np.float64).reshape(-1, 4)[keep]
        det_classes = np.asarray(detection["classes"], np.int64).reshape(-1)[keep]
        scores = scores[keep]
    matched, found = np.ones(len(det_boxes), bool), np.ones(len(gt_boxes), bool)
    if truth is not None and detection is not None:
        kept = {"boxes": det_boxes, "scores": scores, "classes": det_classes}
        matched, found = match_image(truth, kept, iou_threshold=iou_threshold)

    draw = ImageDraw.Draw(tile)
    font = ImageFont.load_default()
    colors = class_colors(len(class_names))
    for box, hit in zip(gt_boxes, found):
        outline(draw, to_tile(box), "truth" if hit else "missed")
    for box, class_id, hit in zip(det_boxes, det_classes, matched):
        style = "match" if hit else "false_positive"
        outline(draw, to_tile(box), style, colors[class_id % len(colors)])
    # Captions last, so that no line crosses them. A false positive's goes above its box first:
    # a duplicate of a match would otherwise hide the match's caption.
    bounds = (0, 0, tile_size, tile_size)
    for box, class_id, score, hit in zip(det_boxes, det_classes, scores, matched):
        caption = f"{'' if hit else 'FP '}{class_names[class_id]} {score:.2f}"
        places = ("inside_top", "above", "below") if hit else ("above", "inside_top", "below")
        color = colors[class_id % len(colors)]
        draw_caption(draw, caption, to_tile(box), color, font, bounds, places)
    for box, class_id, hit in zip(gt_boxes, gt_classes, found):
        if not hit:
            # At the bottom edge, apart from a nearby detection's caption at its top.
            caption, places = f"miss {class_names[class_id]}", ("inside_bottom", "below", "above")
            draw_caption(draw, caption, to_tile(box), MISSED_BOX_COLOR, font, bounds, places)
    return tile, set(det_classes.tolist())


def _vertical_text(image, text, center, font, *, align="middle"):
    """Pastes ``text`` rotated 90 degrees counter-clockwise, centred on ``center``, or with
    its end (the bottom once rotated) at ``center`` for ``align="bottom"``."""
    left, top, right, bottom = font.getbbox(text)
    label = Image.new("RGB", (right - left + 2, bottom - top + 2), BACKGROUND)
    ImageDraw.Draw(label).text((1 - left, 1 - top), text, fill=(0, 0, 0), font=font)
    label = label.rotate(90, expand=True)
    y = center[1] - (label.height if align == "bottom" else label.height // 2)
    image.paste(label, (center[0] - label.width // 2, y))


def _save_png(image, path):
    with atomic_write(path) as temp:
        image.save(temp, format="PNG")
