"""Convert between Darknet and Keras weights.

Darknet -> Keras: ``yolo3 convert yolov3.cfg yolov3.weights out``. ``out`` ending
in ``.weights.h5`` gets the weights with their metadata (model type, classes, anchors), for
``yolo3.checkpoint.weights.load_weights``; ``.keras`` gets a full model for
``keras.saving.load_model``. ``-w`` writes weights whatever the suffix, turning ``x.h5`` (the
original keras-yolo3 name) into ``x.weights.h5``.

Keras -> Darknet: ``yolo3 convert --to-darknet model.weights.h5 out.cfg out.weights``
writes a YOLOv3 / tiny-YOLOv3 model trained here as a cfg + weights pair that Darknet and
OpenCV's ``cv2.dnn.readNetFromDarknet`` run. Model type, class count, anchors, anchor masks and
input size come from the weights file's metadata; ``--num-classes`` and ``--anchors`` are
needed for a file without it (the model type then follows from the anchor count, the masks
are the defaults for it, and the [net] size is 416, unless given).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3.checkpoint import darknet, darknet_writer
from yolo3.checkpoint import weights as yolo_weights
from yolo3.cli import (
    ArgumentParser,
    add_head_arguments,
    add_model_type_argument,
    argument_type,
    output_file,
    run_main,
)
from yolo3.model.head import HEAD_FLAG_FIELDS, HeadSpec, flags_given
from yolo3.model.network import MODEL_TYPES, build_head_model
from yolo3.model.resources import (
    DARKNET_INPUT_SIZE,
    model_type_for_anchors,
    parse_size,
    read_anchors,
)

# Settings of --to-darknet, as argparse names them.
EXPORT_FLAGS = ("model_type", "num_classes", "anchors", *HEAD_FLAG_FIELDS, "input_size")


def build_parser():
    parser = ArgumentParser(
        description="Convert Darknet YOLOv3, tiny-YOLOv3 or Darknet-53 weights to Keras, or "
        "(--to-darknet) Keras YOLOv3 / tiny-YOLOv3 weights to Darknet."
    )
    parser.add_argument(
        "config_path",
        help="Darknet .cfg (yolov3, yolov3-tiny or darknet53); with --to-darknet, the one to write",
    )
    parser.add_argument(
        "weights_path", help="Darknet .weights file; with --to-darknet, the one to write"
    )
    parser.add_argument(
        "output_path",
        nargs="?",
        type=output_file,
        help="*.weights.h5 for weights, *.keras for a full model (not with --to-darknet)",
    )
    parser.add_argument(
        "-w",
        "--weights-only",
        action="store_true",
        help="write weights only (x.h5 becomes x.weights.h5)",
    )
    parser.add_argument(
        "--fixed-size",
        action="store_true",
        help="build for the cfg's width x height instead of any multiple of 32",
    )
    # The spellings of earlier releases, kept working for a release, out of --help.
    for old in ("--weights_only", "--fixed_size"):
        parser.add_argument(old, action="store_true", dest=old[2:], help=argparse.SUPPRESS)
    export = parser.add_argument_group(
        "Keras -> Darknet", "the settings default to what the weights file's metadata records"
    )
    export.add_argument(
        "--to-darknet",
        metavar="KERAS_WEIGHTS",
        help="write these weights (.weights.h5, .keras or an original keras-yolo3 .h5) as "
        "config_path and weights_path",
    )
    add_model_type_argument(export)
    export.add_argument(
        "--num-classes", type=int, metavar="N", help="classes the model was trained for"
    )
    export.add_argument(
        "--anchors", metavar="FILE", help="anchors file (w,h pairs in input pixels)"
    )
    add_head_arguments(export)
    export.add_argument(
        "--input-size",
        type=argument_type(parse_size),
        metavar="SIZE",
        help="the cfg's [net] size, 416 or HEIGHTxWIDTH, multiples of 32 (default: 416)",
    )
    return parser


def _check_args(parser, args):
    if args.to_darknet is None:
        if args.output_path is None:
            parser.error("the following arguments are required: output_path")
        given = [flag for flag in EXPORT_FLAGS if getattr(args, flag) is not None]
        if given:
            flags = ", ".join(f"--{flag.replace('_', '-')}" for flag in given)
            parser.error(f"{flags} only apply with --to-darknet")
        return
    if args.output_path is not None:
        parser.error(f"--to-darknet writes config_path and weights_path; drop {args.output_path}")
    if args.weights_only or args.fixed_size:
        parser.error("-w and --fixed-size apply to Darknet -> Keras, not --to-darknet")
    if args.num_classes is not None and args.num_classes < 1:
        parser.error(f"--num-classes {args.num_classes} must be at least 1")


def resolve_output(output_path, weights_only):
    """``(path, kind)`` with kind ``"weights"`` or ``"keras"``; raises on an unusable suffix."""
    if output_path.endswith(".weights.h5"):
        return output_path, "weights"
    if weights_only:
        if output_path.endswith(".keras"):
            raise ValueError(f"--weights-only writes weights, but {output_path} ends with .keras")
        stem = output_path[: -len(".h5")] if output_path.endswith(".h5") else output_path
        return stem + ".weights.h5", "weights"
    if output_path.endswith(".keras"):
        return output_path, "keras"
    raise ValueError(
        f"output {output_path} must end with .weights.h5 (weights) or .keras (full model); "
        "pass -w to write weights to <name>.weights.h5"
    )


def _convert(args):
    if args.to_darknet is not None:
        return _to_darknet(args)
    output_path, kind = resolve_output(args.output_path, args.weights_only)
    if output_path != args.output_path:
        print(f"writing weights to {output_path} (Keras 3 weights files end with .weights.h5)")
    input_size = "cfg" if args.fixed_size else None
    model, info = darknet.convert(args.config_path, args.weights_path, input_size=input_size)
    if kind == "weights":
        darknet.write_weights(model, info, output_path)
    else:
        darknet.write_keras(model, output_path)
    header = info["header"]
    print(
        f"converted {info['model_type']} ({info['num_classes']} classes, "
        f"{model.count_params():,} parameters; Darknet format "
        f"{header['major']}.{header['minor']}, {header['seen']:,} images seen)"
    )
    if info["masks"]:
        anchors = ", ".join(f"{w:g}x{h:g}" for w, h in info["anchors"])
        print(f"anchors {anchors}; masks {info['masks']}")
    print(f"wrote {kind} to {output_path}")
    return 0


def _export_head(args):
    """The :class:`HeadSpec` that ``args.to_darknet`` is exported with: each flag given, else
    the file's metadata, else a default where one is safe; raises naming the flag."""
    source = args.to_darknet
    if not Path(source).exists():
        raise FileNotFoundError(f"weights file {source} does not exist")
    metadata = yolo_weights.stored_metadata(source)
    model_type = args.model_type or metadata.get("model_type")
    if model_type is not None and model_type not in MODEL_TYPES:
        raise ValueError(f"{source} holds a {model_type} model; Darknet export takes yolov3/tiny")
    num_classes = args.num_classes or metadata.get("num_classes")
    if num_classes is None:
        raise ValueError(f"{source} does not record its number of classes; pass --num-classes")
    class_names = metadata.get("classes") or ()
    if len(class_names) != num_classes:  # a Darknet cfg holds no names: number them
        class_names = [str(index) for index in range(int(num_classes))]
    if args.anchors is not None:
        anchors = read_anchors(args.anchors)
    elif metadata.get("anchors"):
        anchors = np.asarray(metadata["anchors"], np.float32)
    else:
        raise ValueError(f"{source} does not record its anchors; pass --anchors FILE")
    model_type = model_type or model_type_for_anchors(len(anchors))
    input_size = args.input_size or metadata.get("input_size")
    if not input_size:
        input_size = (DARKNET_INPUT_SIZE, DARKNET_INPUT_SIZE)
        print(f"{source} does not record its input size; the cfg gets 416x416 (--input-size)")
    given = flags_given(args)
    head = HeadSpec.from_metadata(
        metadata,
        source=source,
        anchors=anchors,
        class_names=class_names,
        model_type=model_type,
        input_hw=input_size,
        **given,
    )
    return yolo_weights.implied_head(head, source, given, metadata)


def _to_darknet(args):
    head = _export_head(args)
    model = build_head_model(head, input_size=(None, None))
    yolo_weights.load_weights(model, args.to_darknet)
    darknet_writer.write_darknet(model, args.config_path, args.weights_path, head)
    height, width = head.input_hw
    masks = [list(level.anchor_indices) for level in head.levels()]
    print(
        f"wrote {head.model_type} ({head.num_classes} classes, "
        f"{model.count_params():,} parameters; masks {masks}; input {height}x{width}) "
        f"to {args.config_path} and {args.weights_path}"
    )
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, _convert, check=_check_args)


if __name__ == "__main__":
    sys.exit(main())
