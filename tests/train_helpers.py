"""Record sets and anchors files for training tests, written into a temporary folder."""

import numpy as np
from helpers import SMALL_ANCHORS
from record_sets import make_examples, write_record_set

SIZE = 64


def write_anchors(path, anchors=SMALL_ANCHORS):
    path.write_text(", ".join(f"{int(w)},{int(h)}" for w, h in anchors) + "\n")
    return str(path)


def small_record_set(directory, *, train=32, val=8, num_shards=2, seed=0):
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    splits = {"train": make_examples(rng, train, size=SIZE)}
    if val:
        splits["val"] = make_examples(rng, val, size=SIZE)
    return write_record_set(directory, splits, num_shards=num_shards)


def train_args(records, log_dir, anchors, *extra):
    return [
        "--records", str(records), "--log-dir", str(log_dir), "--anchors", str(anchors),
        "--batch-size", "4", "--quiet", "--lr", "0.02", "--warmup-epochs", "0", *extra,
    ]  # fmt: skip
