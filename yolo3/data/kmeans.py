"""Anchor boxes by k-means on box sizes with ``1 - IoU`` as the distance (YOLOv2, sec. 2).

Boxes and anchors are compared by size only, as if aligned at a common corner, so the
IoU of a ``w x h`` box and an ``a x b`` anchor is
``min(w, a) * min(h, b) / (w * h + a * b - min(w, a) * min(h, b))``.

Also :func:`letterboxed_sizes`, which scales annotated boxes the way letterboxing to the
network input will, reading only each image's header. No TensorFlow here.
"""

import concurrent.futures
import os

import numpy as np

from yolo3 import fileio
from yolo3.data.image import letterbox_geometry, open_image

# EXIF orientations 5-8 rotate by 90 degrees: the upright image has width and height swapped.
_EXIF_ORIENTATION = 0x0112
_TRANSPOSED = (5, 6, 7, 8)


def wh_iou(wh, anchors):
    """``(N, K)`` IoU of ``(N, 2)`` box sizes and ``(K, 2)`` anchor sizes, corner-aligned."""
    wh = np.asarray(wh, dtype=np.float64)
    anchors = np.asarray(anchors, dtype=np.float64)
    intersection = np.minimum(wh[:, :1], anchors[:, 0]) * np.minimum(wh[:, 1:], anchors[:, 1])
    union = (wh[:, 0] * wh[:, 1])[:, None] + anchors[:, 0] * anchors[:, 1] - intersection
    return intersection / union


def mean_best_iou(wh, anchors):
    """Mean over boxes of the IoU with the best-matching anchor, a float in ``(0, 1]``.

    Args:
        wh: ``(N, 2)`` box widths and heights, any unit shared with ``anchors``.
        anchors: ``(K, 2)`` anchor widths and heights.
    """
    return float(np.mean(np.max(wh_iou(_check_wh(wh), anchors), axis=1)))


def _check_wh(wh):
    wh = np.asarray(wh, dtype=np.float64)
    if wh.ndim != 2 or wh.shape[1] != 2:
        raise ValueError(f"box sizes have shape {wh.shape}; expected (N, 2) widths and heights")
    if not np.all(np.isfinite(wh)) or np.any(wh <= 0):
        raise ValueError("box sizes must be positive and finite; drop zero-area boxes first")
    return wh


def _init_plus_plus(wh, k, rng):
    # k-means++: each new centre is drawn with probability proportional to its squared
    # distance (1 - IoU) to the nearest centre chosen so far.
    centres = [wh[rng.integers(len(wh))]]
    distance = 1.0 - wh_iou(wh, centres[0][None])[:, 0]
    for _ in range(1, k):
        weights = distance**2
        index = rng.choice(len(wh), p=weights / weights.sum())
        centres.append(wh[index])
        distance = np.minimum(distance, 1.0 - wh_iou(wh, wh[index][None])[:, 0])
    return np.array(centres)


def _lloyd(wh, centres, iterations):
    assignment = None
    for _ in range(iterations):
        iou = wh_iou(wh, centres)
        new_assignment = np.argmax(iou, axis=1)
        if assignment is not None and np.array_equal(new_assignment, assignment):
            break
        assignment = new_assignment
        for cluster in range(len(centres)):
            members = wh[assignment == cluster]
            if len(members):
                # The median, as the original kmeans.py: robust to a few huge boxes.
                centres[cluster] = np.median(members, axis=0)
            else:
                # An empty cluster moves to the box its nearest anchor fits worst.
                centres[cluster] = wh[np.argmin(np.max(iou, axis=1))]
    return centres


def iou_kmeans(wh, k, *, seed=0, iterations=300, restarts=5):
    """Clusters box sizes into ``k`` anchors, keeping the best of ``restarts`` runs.

    Args:
        wh: ``(N, 2)`` positive box widths and heights (e.g. input pixels after letterbox).
        k: number of anchors: 9 for YOLOv3, 6 for tiny-YOLOv3.
        seed: int; the result is a function of ``wh``, ``k`` and the seed only.
        iterations: most assignment/update rounds per run (stops early when stable).
        restarts: independent k-means++ initialisations; the one with the highest mean
            best IoU is kept.

    Returns:
        ``(anchors, mean_best_iou)``: ``(k, 2)`` float64 widths and heights, smallest area
        first as Darknet lists them, and the mean IoU of each box with its best anchor.
    """
    wh = _check_wh(wh)
    if k < 1 or restarts < 1 or iterations < 1:
        raise ValueError(f"k={k}, restarts={restarts}, iterations={iterations} must be >= 1")
    distinct = len(np.unique(wh, axis=0))
    if distinct < k:
        raise ValueError(f"{distinct} distinct box sizes cannot give {k} different anchors")
    best_anchors, best_iou = None, -1.0
    for run_rng in np.random.default_rng(seed).spawn(restarts):
        anchors = _lloyd(wh, _init_plus_plus(wh, k, run_rng), iterations)
        score = mean_best_iou(wh, anchors)
        if score > best_iou:
            best_anchors, best_iou = anchors, score
    order = np.lexsort((best_anchors[:, 0], np.prod(best_anchors, axis=1)))
    return best_anchors[order], best_iou


def format_anchors(anchors):
    """``"10,13,  16,30,  ..."``: whole-pixel anchors (at least 1) in the anchors file format."""
    rounded = np.maximum(np.floor(np.asarray(anchors, np.float64) + 0.5), 1).astype(np.int64)
    return ",  ".join(f"{w},{h}" for w, h in rounded)


def image_hw(path):
    """``(height, width)`` of the upright image, reading only the header.

    EXIF orientations 5-8 swap width and height, as :func:`yolo3.data.image.decode_rgb` does.
    Raises FileNotFoundError or ValueError naming the file, for a decompression bomb too
    (:func:`yolo3.data.image.open_image`).
    """
    path = os.fspath(path)
    try:
        file = fileio.open_file(path, "rb")
    except FileNotFoundError:
        raise FileNotFoundError(f"image {path} does not exist") from None
    except (OSError, ValueError) as err:  # a folder, no permission, a NUL in the name...
        raise ValueError(f"cannot read image {path}: {err}") from err
    with file, open_image(file, path) as image:
        width, height = image.size
        orientation = image.getexif().get(_EXIF_ORIENTATION)
    return (width, height) if orientation in _TRANSPOSED else (height, width)


def letterboxed_sizes(entries, input_hw=None, *, threads=8):
    """Box sizes as the network will see them.

    Args:
        entries: :class:`yolo3.data.annotations.Entry` list.
        input_hw: ``(height, width)`` of the network input: each box is scaled by its
            image's letterbox factors, which needs the image size (header only). ``None``
            keeps original pixels and opens no image.
        threads: parallel header reads (they are I/O bound, notably on ``gs://``).

    Returns:
        ``(wh, unreadable, outside)``: ``(N, 2)`` float64 widths and heights; a list of
        ``(path, message)`` for images that could not be read (their boxes are left out);
        and the number of boxes left out because they lie wholly outside their image.
        With ``input_hw`` boxes are first clipped to the image, as preprocessing does.
    """
    entries = [entry for entry in entries if len(entry.boxes)]
    if input_hw is None:
        sizes = [entry.boxes[:, 2:4] - entry.boxes[:, 0:2] for entry in entries]
        return (np.concatenate(sizes) if sizes else np.zeros((0, 2))), [], 0

    def read(entry):
        try:
            return image_hw(entry.path)
        except (FileNotFoundError, ValueError) as err:
            return str(err)

    with concurrent.futures.ThreadPoolExecutor(max(threads, 1)) as pool:
        results = list(pool.map(read, entries))
    sizes, unreadable, outside = [], [], 0
    for entry, result in zip(entries, results):
        if isinstance(result, str):
            unreadable.append((entry.path, result))
            continue
        height, width = result
        clipped = np.clip(entry.boxes, 0, [width, height, width, height])
        size = clipped[:, 2:4] - clipped[:, 0:2]
        inside = np.all(size > 0, axis=1)
        outside += int((~inside).sum())
        scale_y, scale_x = letterbox_geometry(result, input_hw)[:2]
        sizes.append(size[inside] * [scale_x, scale_y])
    wh = np.concatenate(sizes) if sizes else np.zeros((0, 2))
    return wh, unreadable, outside
