"""Pascal VOC (VOCdevkit) -> one keras-yolo3 annotation file.

    yolo3 voc-annotation --devkit VOCdevkit --sets 2007:trainval 2012:trainval \\
        --output data/voc_train.txt

Reads ``VOC<year>/ImageSets/Main/<set>.txt`` and each listed ``Annotations/<id>.xml``; the
image is ``JPEGImages/<id>.jpg``. Image paths are written relative to the output file's
folder, so the annotation file and the devkit can move together. Box edges given as
fractions ("273.5") are rounded to the nearest pixel. Objects of classes not in
``--classes``, boxes with no area and missing or unreadable XML files are skipped, counted
and reported; an image left with no objects is written as a background image, as the
original did. Objects marked difficult are kept with the annotation line's difficult flag
(``--difficult flag``, the default), so that training leaves them out and VOC mAP neither
requires nor penalises them, as the devkit does; ``skip`` drops them (the original's
behaviour), ``include`` keeps them as ordinary objects.
"""

import collections
import sys

from yolo3 import fileio
from yolo3.cli import ArgumentParser, fail, run_main
from yolo3.data.annotations import format_line, relative_image_path, write_annotations
from yolo3.data.formats.voc import read_voc_objects
from yolo3.model.resources import model_data_file, read_classes

# What happens to objects marked difficult (see the module docstring).
DIFFICULT_MODES = ("flag", "skip", "include")


def build_parser():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devkit", required=True, help="folder holding VOC2007/, VOC2012/, ...")
    parser.add_argument(
        "--sets",
        nargs="+",
        default=["2007:trainval", "2012:trainval"],
        metavar="YEAR:SET",
        help="image sets to convert, all into one output (default 2007:trainval 2012:trainval)",
    )
    parser.add_argument(
        "--classes",
        default=model_data_file("voc_classes.txt"),
        help="classes file; objects of other classes are skipped (default the 20 VOC classes)",
    )
    parser.add_argument(
        "--difficult",
        choices=DIFFICULT_MODES,
        default="flag",
        help="objects marked difficult: flag (default: kept, not trained on, ignored by VOC "
        "mAP), skip (the original's choice) or include (as ordinary objects)",
    )
    parser.add_argument("--output", required=True, help="annotation file to write")
    parser.add_argument("--classes-output", help="also write the classes used to this file")
    parser.add_argument(
        "--strict", action="store_true", help="a missing or unreadable XML file is an error"
    )
    return parser


def parse_sets(specs):
    """``["2007:trainval"]`` -> ``[("2007", "trainval")]``; raises ValueError on bad syntax."""
    pairs = []
    for spec in specs:
        year, _, image_set = spec.partition(":")
        if not year or not image_set:
            raise ValueError(f"--sets entry {spec!r} is not YEAR:SET, e.g. 2007:trainval")
        pairs.append((year, image_set))
    return pairs


def convert(devkit, sets, class_names, output, *, difficult="flag"):
    """Annotation lines for the image sets, with image paths relative to ``output``.

    ``difficult`` is one of :data:`DIFFICULT_MODES` (see the module docstring).

    Returns:
        ``(lines, counts, problems)``: lines for :func:`yolo3.data.annotations.write_annotations`;
        a Counter with ``images``, ``boxes``, ``boxes/<class>``, ``background_images`` and
        ``skipped/<reason>``; a list of messages about missing or unreadable XML files.
    """
    if difficult not in DIFFICULT_MODES:
        raise ValueError(f"difficult={difficult!r}; expected one of {DIFFICULT_MODES}")
    class_ids = {name: i for i, name in enumerate(class_names)}
    lines, counts, problems = [], collections.Counter(), []
    for year, image_set in sets:
        voc = fileio.join(devkit, f"VOC{year}")
        list_path = fileio.join(voc, "ImageSets", "Main", f"{image_set}.txt")
        if not fileio.exists(list_path):
            raise FileNotFoundError(f"image set {list_path} does not exist; check --sets")
        with fileio.open_file(list_path, "r") as f:
            image_ids = [line.split()[0] for line in f if line.strip()]
        for image_id in image_ids:
            xml_path = fileio.join(voc, "Annotations", f"{image_id}.xml")
            try:
                objects = read_voc_objects(fileio.read_bytes(xml_path), xml_path)
            except FileNotFoundError:
                counts["skipped/missing_xml"] += 1
                problems.append(f"{xml_path} does not exist")
                continue
            except ValueError as err:
                counts["skipped/unreadable_xml"] += 1
                problems.append(str(err))
                continue
            boxes, classes, flags = [], [], []
            for class_name, is_difficult, edges in objects:
                if class_name not in class_ids:
                    counts[f"skipped/unknown_class/{class_name}"] += 1
                elif is_difficult and difficult == "skip":
                    counts["skipped/difficult"] += 1
                elif edges is None or edges[2] <= edges[0] or edges[3] <= edges[1]:
                    counts["skipped/bad_box"] += 1
                else:
                    boxes.append(edges)
                    classes.append(class_ids[class_name])
                    flags.append(is_difficult and difficult == "flag")
                    counts[f"boxes/{class_name}"] += 1
                    counts["difficult_boxes"] += flags[-1]
            image = fileio.join(voc, "JPEGImages", f"{image_id}.jpg")
            line = format_line(relative_image_path(image, output), boxes, classes, flags)
            lines.append(line)
            counts["images"] += 1
            counts["boxes"] += len(boxes)
            counts["background_images"] += not boxes
    return lines, counts, problems


def print_summary(counts, class_names, problems):
    print(
        f"{counts['images']} images, {counts['boxes']} boxes, "
        f"{counts['background_images']} images without boxes, "
        f"{counts['difficult_boxes']} boxes flagged difficult",
    )
    for name in class_names:
        print(f"  {name:>16}: {counts[f'boxes/{name}']}")
    skipped = {key[len("skipped/") :]: n for key, n in counts.items() if key.startswith("skipped/")}
    for reason, number in sorted(skipped.items()):
        print(f"  skipped {reason}: {number}")
    for message in problems[:10]:
        print(f"  {message}")
    if len(problems) > 10:
        print(f"  ... and {len(problems) - 10} more")


def write_lines(args):
    """Converts the VOC sets to annotation lines; status 1 for missing XML with --strict."""
    sets = parse_sets(args.sets)
    class_names = read_classes(args.classes)
    lines, counts, problems = convert(
        args.devkit,
        sets,
        class_names,
        args.output,
        difficult=args.difficult,
    )
    print_summary(counts, class_names, problems)
    if problems and args.strict:
        return fail(f"{len(problems)} XML files missing or unreadable (--strict)")
    write_annotations(args.output, lines)
    print(f"wrote {len(lines)} lines to {args.output}")
    if args.classes_output:
        write_annotations(args.classes_output, class_names)
        print(f"wrote {len(class_names)} class names to {args.classes_output}")
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, write_lines, errors=(OSError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
