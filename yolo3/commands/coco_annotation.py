"""COCO instances JSON -> a keras-yolo3 annotation file and its classes file.

    yolo3 coco-annotation --annotations annotations/instances_train2017.json \\
        --images train2017 --output data/coco_train.txt --classes-output data/coco_classes.txt

Class ids are contiguous, in the order of the COCO category ids (so for COCO 2017 they match
Darknet's 80-class order and ``model_data/coco_classes.txt``, which spells a few names the
Darknet way). COCO boxes ``[x, y, width, height]`` in fractional pixels become
``x_min, y_min, x_max, y_max`` with each edge rounded to the nearest whole pixel; a box with
no width or height after rounding is skipped. Crowd regions (``iscrowd``) are skipped unless
``--include-crowd``. Images without annotations are written as background images unless
``--skip-empty``. Everything skipped is counted in the summary. Image paths are written
relative to the output file's folder. Lines follow the image ids' order.
"""

import collections
import json
import math
import sys

from yolo3 import fileio
from yolo3.cli import ArgumentParser, run_main
from yolo3.data.annotations import format_line, relative_image_path, write_annotations


def build_parser():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--annotations", required=True, help="COCO instances JSON, e.g. instances_train2017.json"
    )
    parser.add_argument("--images", required=True, help="folder holding the images it lists")
    parser.add_argument("--output", required=True, help="annotation file to write")
    parser.add_argument(
        "--classes-output",
        help="classes file to write (default: the output's name with _classes.txt)",
    )
    parser.add_argument(
        "--include-crowd", action="store_true", help="keep iscrowd regions as boxes"
    )
    parser.add_argument(
        "--skip-empty",
        action="store_true",
        help="leave out images with no boxes instead of writing them as background images",
    )
    return parser


def _pixel(value):
    return math.floor(value + 0.5)


def convert(data, images_dir, output, *, include_crowd=False, skip_empty=False):
    """Annotation lines from a parsed COCO instances JSON.

    Args:
        data: the JSON as a dict with ``images``, ``annotations`` and ``categories``.
        images_dir: folder holding the image files named by ``file_name``.
        output: the annotation file the lines are for (paths are relative to its folder).

    Returns:
        ``(lines, class_names, counts)``; ``counts`` is a Counter with ``images``,
        ``boxes``, ``background_images`` and ``skipped/<reason>`` (``crowd``,
        ``zero_size_box``, ``unknown_image``, ``unknown_category``, ``empty_image``).
    """
    for key in ("images", "annotations", "categories"):
        if key not in data:
            raise ValueError(f"no {key!r} list; is this an instances_*.json file?")
    categories = sorted(data["categories"], key=lambda c: c["id"])
    class_ids = {category["id"]: i for i, category in enumerate(categories)}
    class_names = [category["name"] for category in categories]
    images = {image["id"]: image["file_name"] for image in data["images"]}
    counts = collections.Counter()
    boxes_of = collections.defaultdict(list)
    for annotation in data["annotations"]:
        if annotation["image_id"] not in images:
            counts["skipped/unknown_image"] += 1
            continue
        if annotation["category_id"] not in class_ids:
            counts["skipped/unknown_category"] += 1
            continue
        if annotation.get("iscrowd", 0) and not include_crowd:
            counts["skipped/crowd"] += 1
            continue
        x, y, width, height = (float(v) for v in annotation["bbox"])
        box = (_pixel(x), _pixel(y), _pixel(x + width), _pixel(y + height))
        if box[2] <= box[0] or box[3] <= box[1]:
            counts["skipped/zero_size_box"] += 1
            continue
        boxes_of[annotation["image_id"]].append((box, class_ids[annotation["category_id"]]))
    lines = []
    for image_id in sorted(images):
        objects = boxes_of.get(image_id, [])
        if not objects and skip_empty:
            counts["skipped/empty_image"] += 1
            continue
        path = relative_image_path(fileio.join(images_dir, images[image_id]), output)
        lines.append(format_line(path, [b for b, _ in objects], [c for _, c in objects]))
        counts["images"] += 1
        counts["boxes"] += len(objects)
        counts["background_images"] += not objects
    return lines, class_names, counts


def default_classes_output(output):
    stem = output[: -len(".txt")] if output.endswith(".txt") else output
    return f"{stem}_classes.txt"


def write_lines(args):
    """Converts the COCO json to annotation lines and writes them with the class names."""
    try:
        data = json.loads(fileio.read_bytes(args.annotations))
        lines, class_names, counts = convert(
            data,
            args.images,
            args.output,
            include_crowd=args.include_crowd,
            skip_empty=args.skip_empty,
        )
    except KeyError as err:
        raise ValueError(f"{args.annotations}: a record has no {err} field") from err
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"{args.annotations}: {err}") from err
    print(
        f"{counts['images']} images, {counts['boxes']} boxes in {len(class_names)} classes, "
        f"{counts['background_images']} background images"
    )
    for key, number in sorted(counts.items()):
        if key.startswith("skipped/"):
            print(f"  skipped {key[len('skipped/') :]}: {number}")
    classes_output = args.classes_output or default_classes_output(args.output)
    write_annotations(args.output, lines)
    write_annotations(classes_output, class_names)
    print(f"wrote {len(lines)} lines to {args.output} and the class names to {classes_output}")
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, write_lines, errors=(OSError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
