"""Writes small packed record sets for pipeline tests: plain images with solid boxes."""

import io

import numpy as np
from PIL import Image

from yolo3 import fileio
from yolo3.data import records

CLASSES = ("circle", "square")


def make_examples(rng, count, size=64, max_boxes=3, num_classes=2):
    """``count`` (image, boxes, classes): a grey image with each box filled in its own colour.

    Boxes are integer pixel corners (so flips and targets are exact), each at least 4 px;
    some images have no boxes.
    """
    examples = []
    for _ in range(count):
        image = np.full((size, size, 3), 100, np.uint8)
        boxes, classes = [], []
        for _ in range(rng.integers(0, max_boxes + 1)):
            w, h = rng.integers(4, size // 2, size=2)
            x0, y0 = rng.integers(0, size - w), rng.integers(0, size - h)
            image[y0 : y0 + h, x0 : x0 + w] = rng.integers(0, 256, 3)
            boxes.append([x0, y0, x0 + w, y0 + h])
            classes.append(rng.integers(num_classes))
        examples.append(
            (image, np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(classes, np.int64))
        )
    return examples


def encode(image, image_format):
    if image_format == "raw":
        return image.tobytes()
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def write_record_set(
    directory, splits, *, image_format="raw", num_shards=2, classes=CLASSES, **manifest_extra
):
    """Writes ``splits`` ({name: examples}) as a record set in ``directory``.

    ``manifest_extra`` adds keys to the manifest.
    Each split's examples go round-robin into ``num_shards`` shards, so shard ``s`` holds
    examples ``s, s + num_shards, ...``. Returns ``directory`` as a string.
    """
    directory = str(directory)
    entries = {}
    for split, examples in splits.items():
        size = examples[0][0].shape[:2]
        entries[split] = []
        for shard in range(num_shards):
            serialized = [
                records.serialize_example(
                    {
                        "image": encode(image, image_format),
                        "format": image_format,
                        "height": image.shape[0],
                        "width": image.shape[1],
                        "boxes": boxes,
                        "classes": class_ids,
                        "source": f"{split}/{index}.png",
                        "line": index + 1,
                        "copy": 0,
                    }
                )
                for index, (image, boxes, class_ids) in enumerate(examples)
                if index % num_shards == shard
            ]
            path = f"{directory}/{records.shard_name(split, shard, num_shards)}"
            entries[split].append(records.write_shard(path, serialized))
    manifest = records.make_manifest(
        classes=classes,
        input_size=size,
        image_format=image_format,
        splits=entries,
        **manifest_extra,
    )
    fileio.write_json(f"{directory}/{records.MANIFEST}", manifest)
    return directory
