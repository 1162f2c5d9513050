"""Data set hygiene over parsed annotations: the rare-class filter and the validation split.

Both take and return lists of :class:`yolo3.data.annotations.Entry` and are deterministic: the
split depends only on the seed and each image's own path, not on file order.
"""

import collections
import dataclasses
import hashlib
import logging

import numpy as np

logger = logging.getLogger(__name__)


def images_per_class(entries, num_classes):
    """``(num_classes,)`` int64: how many entries contain each class at least once."""
    counts = np.zeros(num_classes, np.int64)
    for entry in entries:
        present = np.unique(entry.classes)
        if present.size and (present[0] < 0 or present[-1] >= num_classes):
            raise ValueError(
                f"{entry.source}:{entry.line} has class id {int(present[-1])}, but there are "
                f"{num_classes} class names"
            )
        counts[present] += 1
    return counts


def drop_rare_classes(entries, class_names, min_images):
    """Removes classes that appear in fewer than ``min_images`` images.

    Their boxes are deleted and the remaining class ids renumbered to stay contiguous in
    the original order; images keep their other boxes, and an image left with none stays
    as a background image.

    Returns:
        ``(entries, kept_class_names, report)``; ``report`` holds ``dropped`` (a list of
        ``{"class_id", "name", "images"}`` with the old ids), ``boxes_removed`` and
        ``images_left_empty`` (images that had boxes and now have none).
    """
    if min_images < 0:
        raise ValueError(f"min_images is {min_images}; expected 0 or more")
    counts = images_per_class(entries, len(class_names))
    keep = counts >= min_images
    new_ids = np.cumsum(keep) - 1  # old id -> new id, valid where keep
    result, boxes_removed, left_empty = [], 0, 0
    for entry in entries:
        mask = keep[entry.classes]
        if mask.all():
            classes = new_ids[entry.classes].astype(np.int64)
            result.append(dataclasses.replace(entry, classes=classes))
            continue
        boxes_removed += int((~mask).sum())
        left_empty += not mask.any()
        result.append(
            dataclasses.replace(
                entry,
                boxes=entry.boxes[mask],
                classes=new_ids[entry.classes[mask]].astype(np.int64),
                difficult=entry.difficult[mask],
            )
        )
    dropped = [
        {"class_id": i, "name": class_names[i], "images": int(counts[i])}
        for i in np.flatnonzero(~keep).tolist()
    ]
    kept_names = [name for name, kept in zip(class_names, keep) if kept]
    report = {"dropped": dropped, "boxes_removed": boxes_removed, "images_left_empty": left_empty}
    return result, kept_names, report


def _split_key(seed, path):
    # A hash of (seed, path) rather than a shuffle: an image's side depends only on the
    # seed and its own path, not on file order, other images or the global random state.
    return hashlib.sha256(f"{seed}\0{path}".encode()).digest()


def split_validation(entries, *, fraction=None, per_class=None, seed=0):
    """Splits entries into training and validation images, deterministically for ``seed``.

    Entries sharing a path are one image and always land on the same side.

    Args:
        entries: list of :class:`yolo3.data.annotations.Entry`.
        fraction: ``0 < fraction < 1``; that share of the images (rounded, at least one on
            each side) goes to validation.
        per_class: ``N``; validation gets ``N`` images containing each class. Rarest
            classes are served first and an image counts for every class in it. No image is
            moved if that would leave one of its classes without training images, so a
            class with fewer than ``N + 1`` images gets fewer; each such class is logged as
            a warning.
        seed: int; a different seed gives a different split.

    Returns:
        ``(train, val)``: lists of entries, each in the original order.
    """
    if (fraction is None) == (per_class is None):
        raise ValueError("give exactly one of fraction= or per_class=")
    groups = collections.defaultdict(list)  # path -> indices into entries
    for index, entry in enumerate(entries):
        groups[entry.path].append(index)
    paths = sorted(groups, key=lambda p: _split_key(seed, p))
    if len(paths) < 2:
        raise ValueError(f"{len(paths)} distinct images cannot be split into train and val")
    if fraction is not None:
        if not 0 < fraction < 1:
            raise ValueError(f"fraction is {fraction}; expected 0 < fraction < 1")
        num_val = min(max(round(fraction * len(paths)), 1), len(paths) - 1)
        val_paths = set(paths[:num_val])
    else:
        val_paths = _pick_per_class(entries, groups, paths, per_class)
    train = [e for e in entries if e.path not in val_paths]
    val = [e for e in entries if e.path in val_paths]
    return train, val


def _pick_per_class(entries, groups, ordered_paths, per_class):
    if per_class < 1:
        raise ValueError(f"per_class is {per_class}; expected 1 or more")
    image_classes = {
        path: {int(c) for i in indices for c in entries[i].classes}
        for path, indices in groups.items()
    }
    train_count, images_of = collections.Counter(), collections.defaultdict(list)
    for path in ordered_paths:
        for class_id in image_classes[path]:
            train_count[class_id] += 1
            images_of[class_id].append(path)
    val_count, val_paths = collections.Counter(), set()
    for class_id in sorted(train_count, key=lambda c: (train_count[c], c)):
        for path in images_of[class_id]:
            if val_count[class_id] >= per_class:
                break
            if path in val_paths or any(train_count[c] <= 1 for c in image_classes[path]):
                continue
            val_paths.add(path)
            for c in image_classes[path]:
                train_count[c] -= 1
                val_count[c] += 1
    for class_id in sorted(train_count):
        if val_count[class_id] < per_class:
            logger.warning(
                "class %d is in %d images; %d go to validation (asked for %d) so that training "
                "keeps at least one",
                class_id,
                val_count[class_id] + train_count[class_id],
                val_count[class_id],
                per_class,
            )
    return val_paths
