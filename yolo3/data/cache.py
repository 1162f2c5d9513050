"""The record cache of ``yolo3 train --data``: a dataset to record shards and anchors, once.

``yolo3 train --data PATH`` does what ``yolo3 kmeans`` and ``yolo3 preprocess`` do by
hand, into a folder of the cache named by a key of the dataset's content and the
preprocessing settings:

- the key covers the settings (:meth:`~yolo3.data.preprocess.PreprocessConfig.fingerprint`,
  the dataset's path made absolute), every image's path, size and modification time, and
  every box, class and flag as read: the same command a second time finds the folder
  complete and preprocesses nothing; an edited label file, an image replaced or another
  ``--input-size`` makes another key, and the folder is built anew;
- the folder is an ordinary record set, the one ``yolo3 preprocess`` writes with the same
  settings (byte for byte), so ``--records FOLDER`` trains on it as well; beside its
  manifest, ``anchors-K.txt``: K anchors fitted by IoU k-means to the training split's boxes
  as letterboxing to the input size scales them (what ``yolo3 kmeans`` writes);
- a folder killed half-way resumes shard by shard, as ``yolo3 preprocess`` does.

The cache lives in ``$YOLO3_CACHE``, else ``$XDG_CACHE_HOME/yolo3``, else
``~/.cache/yolo3`` (``--cache-dir`` chooses another); deleting a folder in it, or all of it,
only costs the next run its preprocessing. A job of several workers reads a complete
folder; it does not build one (every worker would write the same shards at once): the
command names ``yolo3 preprocess`` to build it first.
"""

import dataclasses
import hashlib
import json
import os

from yolo3 import fileio
from yolo3.data import kmeans, preprocess
from yolo3.data.annotations import write_annotations
from yolo3.data.records import MANIFEST

CACHE_ENV = "YOLO3_CACHE"
KEY_LENGTH = 16  # hex digits of the key that name a folder: 64 bits


def default_cache_dir(env=None):
    """Where the cache lives by default (see the module's text)."""
    env = os.environ if env is None else env
    if env.get(CACHE_ENV):
        return env[CACHE_ENV]
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "yolo3")


@dataclasses.dataclass(frozen=True)
class CachedData:
    """What a run trains on: ``records`` (a record-set folder), ``anchors`` (an anchors file,
    or None when none was asked for) and ``built`` (whether this run preprocessed)."""

    records: str
    anchors: str | None
    built: bool


def dataset_key(config, dataset):
    """The cache key of ``dataset`` (:func:`yolo3.data.preprocess.load_dataset`'s) read with
    ``config``: hex digits of a SHA-256 over the settings and the content as read."""
    settings = config.fingerprint()
    for name in ("data", "image_root"):
        if settings.get(name):
            settings[name] = os.path.abspath(settings[name])
    for name in ("annotations", "val_annotations"):
        settings[name] = [os.path.abspath(path) for path in settings[name]]
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    digest.update(json.dumps(dataset.classes).encode())
    for split, entries in sorted(dataset.splits.items()):
        for entry in entries:
            try:
                stat = os.stat(entry.path)
                seen = [stat.st_size, stat.st_mtime_ns]
            except OSError:
                seen = None  # a missing image is a reject of the run; still part of the key
            fields = [split, entry.path, seen, entry.boxes.tolist(), entry.classes.tolist()]
            digest.update(json.dumps([*fields, entry.difficult.tolist()]).encode())
    return digest.hexdigest()


def prepare(config, *, cache_dir, num_anchors=None, num_workers=1, workers=None,
            progress="auto", log=print):  # fmt: skip
    """The record set (and anchors) of ``config``'s dataset, from the cache or built into it.

    Args:
        config: a :class:`yolo3.data.preprocess.PreprocessConfig`; its ``output`` is not
            used (the cache chooses the folder).
        cache_dir: the cache's folder.
        num_anchors: anchors to fit (6 for tiny-YOLOv3, 9 for YOLOv3), or None for none.
        num_workers: the job's workers; with more than one a missing folder is an error.
        workers: preprocessing processes (default: every core).
        progress: as :func:`yolo3.data.preprocess.run` takes it.
        log: a callable given each line that says what is done.

    Returns:
        A :class:`CachedData`.

    Raises:
        ValueError: the dataset cannot be read, or several workers find no complete folder.
    """
    log(f"dataset: reading {', '.join(_sources(config))}")
    dataset = preprocess.load_dataset(config)
    folder = os.path.join(os.fspath(cache_dir), dataset_key(config, dataset)[:KEY_LENGTH])
    config = dataclasses.replace(config, output=folder)
    complete = fileio.exists(os.path.join(folder, MANIFEST))
    if complete:
        log(f"records: {folder} holds this dataset with these settings; nothing to preprocess")
    elif num_workers > 1:
        raise ValueError(
            f"records: {folder} is not built, and {num_workers} workers would all build it; "
            "build it on one machine first (the same command without the other workers, or "
            "yolo3 preprocess --data ... --output DIR and then --records DIR)"
        )
    else:
        log(f"records: preprocessing into {folder} (the cache; --cache-dir chooses another)")
        preprocess.run(config, workers=workers, progress=progress, log=log, dataset=dataset)
    anchors = None
    if num_anchors:
        anchors = _anchors(config, dataset, num_anchors, folder, num_workers, log)
    return CachedData(folder, anchors, built=not complete)


def _anchors(config, dataset, num_anchors, folder, num_workers, log):
    """The folder's ``anchors-K.txt``, fitted to the training split when it is missing."""
    path = os.path.join(folder, f"anchors-{num_anchors}.txt")
    if fileio.exists(path):
        log(f"anchors: {path} (fitted before)")
        return path
    if num_workers > 1:
        raise ValueError(f"anchors: {path} is missing; fit it on one machine first")
    wh, _, _ = kmeans.letterboxed_sizes(dataset.splits["train"], tuple(config.input_size))
    if len(wh) < num_anchors:
        raise ValueError(
            f"--data: {len(wh)} boxes in the training split are too few to fit {num_anchors} "
            "anchors; give --anchors FILE or --weights FILE"
        )
    anchors, _ = kmeans.iou_kmeans(wh, num_anchors, seed=config.seed)
    text = kmeans.format_anchors(anchors)
    write_annotations(path, [text])
    height, width = config.input_size
    log(
        f"anchors: {num_anchors} fitted to {len(wh)} boxes at {height}x{width} px by IoU "
        f"k-means: {text} -> {path}"
    )
    return path


def _sources(config):
    return [config.data] if config.data else [*config.annotations, *config.val_annotations]
