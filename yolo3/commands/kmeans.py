"""Anchors for a data set by IoU k-means over its box sizes.

    yolo3 kmeans --annotations data/train.txt -k 9 --output model_data/my_anchors.txt
    yolo3 kmeans --data datasets/parts/data.yaml -k 6 --input-size 416 --output anchors.txt

``--data`` reads a dataset in another layout (as ``yolo3 preprocess --data`` does) and fits
its training split.

Boxes are scaled the way letterboxing to ``--input-size`` will scale them (each image's
size is read from its header, upright per EXIF), so the anchors are in network input
pixels like ``model_data/yolo_anchors.txt``; ``--no-letterbox`` clusters raw pixel sizes
and opens no image. Prints the anchors, their mean best IoU with the boxes, and that of
``--compare`` (default the shipped anchors file, scaled from 416 px to ``--input-size``).
Unreadable images are skipped and counted.
"""

import collections
import sys

from yolo3.cli import ArgumentParser, fail, output_file, run_main
from yolo3.data import formats, kmeans
from yolo3.data.annotations import parse_annotation_files, write_annotations
from yolo3.model.resources import parse_anchors, read_anchors, shipped_anchors

DEFAULT_ANCHORS = {
    9: shipped_anchors("yolov3"),
    6: shipped_anchors("tiny"),
}
# Darknet's anchors files are sized for a 416 x 416 input.
DEFAULT_ANCHORS_INPUT = 416


def build_parser():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--annotations", nargs="+", help="annotation files")
    formats.add_arguments(
        parser,
        group=source,
        data_help="a dataset instead: data.yaml (Ultralytics), .data (Darknet), a COCO JSON "
        "or a VOCdevkit folder; its training split is fitted",
    )
    parser.add_argument("-k", type=int, default=9, help="anchors: 9 for yolov3, 6 for tiny")
    parser.add_argument(
        "--input-size", type=int, default=416, help="network input size in pixels (default 416)"
    )
    parser.add_argument(
        "--no-letterbox", action="store_true", help="cluster original pixel sizes, read no image"
    )
    parser.add_argument(
        "--output", type=output_file, help="anchors file to write (needs -k 6 or 9)"
    )
    parser.add_argument(
        "--compare", help="anchors file to compare with (default the shipped one for -k)"
    )
    parser.add_argument("--image-root", help="base of relative image paths (default: each file's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--restarts", type=int, default=5, help="k-means++ runs; the best is kept")
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--threads", type=int, default=8, help="parallel image header reads")
    return parser


def _report_skipped(rejects, unreadable, outside):
    reasons = collections.Counter(reject.reason for reject in rejects)
    for reason, number in sorted(reasons.items()):
        print(f"  skipped {reason}: {number}")
    for reject in rejects[:5]:
        print(f"  {reject.message}")
    if unreadable:
        print(f"  skipped {len(unreadable)} images that could not be read, e.g.")
        for _, message in unreadable[:5]:
            print(f"    {message}")
    if outside:
        print(f"  skipped {outside} boxes lying wholly outside their image")


def _check_args(parser, args):
    if args.output and args.k not in DEFAULT_ANCHORS:
        parser.error(f"-k {args.k}: anchors files hold 6 (tiny) or 9 (yolov3)")
    if args.input_size < 32 or args.input_size % 32:
        parser.error(f"input size {args.input_size} is not a multiple of 32")


def fit_anchors(args):
    """Clusters the boxes of the annotation files; status 2 when they cannot give k anchors."""
    if args.data:
        dataset = formats.read_dataset(
            args.data, data_format=args.data_format, image_root=args.image_root
        )
        entries, rejects = dataset.splits["train"], dataset.rejects
        counts = {"images": len(entries)}
    else:
        entries, rejects, counts = parse_annotation_files(
            args.annotations, num_classes=None, image_root=args.image_root
        )
    input_hw = None if args.no_letterbox else (args.input_size, args.input_size)
    wh, unreadable, outside = kmeans.letterboxed_sizes(entries, input_hw, threads=args.threads)
    unit = "original pixels" if input_hw is None else f"pixels of a {args.input_size} px input"
    print(f"{len(wh)} boxes from {counts['images']} images, sizes in {unit}")
    _report_skipped(rejects, unreadable, outside)
    if len(wh) < args.k:
        return fail(f"{len(wh)} boxes are too few for {args.k} anchors")
    try:
        anchors, _ = kmeans.iou_kmeans(
            wh, args.k, seed=args.seed, iterations=args.iterations, restarts=args.restarts
        )
    except ValueError as err:
        return fail(err)
    # Report the IoU of the whole-pixel anchors that are printed and written.
    text = kmeans.format_anchors(anchors)
    written = parse_anchors(text) if args.k in DEFAULT_ANCHORS else anchors.round()
    print(f"anchors: {text}")
    print(f"mean best IoU: {kmeans.mean_best_iou(wh, written):.4f}")
    compare = args.compare or DEFAULT_ANCHORS.get(args.k)
    if compare:
        # Only the shipped files are known to be for 416 px; a given file is taken as is.
        scale = 1.0
        if args.compare is None and input_hw is not None:
            scale = args.input_size / DEFAULT_ANCHORS_INPUT
        iou = kmeans.mean_best_iou(wh, read_anchors(compare) * scale)
        print(f"mean best IoU of {compare} (x {scale:g}): {iou:.4f}")
    if args.output:
        write_annotations(args.output, [text])
        print(f"wrote {args.output}")
    return 0


def main(argv=None):
    return run_main(
        build_parser(), argv, fit_anchors, check=_check_args, errors=(OSError, ValueError)
    )


if __name__ == "__main__":
    sys.exit(main())
