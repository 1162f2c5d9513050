"""Convert Darknet weights to Keras: ``python tools/convert.py yolov3.cfg yolov3.weights out``.

``out`` ending in ``.weights.h5`` gets the weights with their metadata (model type, classes,
anchors), for ``yolo3.weights.load_weights``; ``.keras`` gets a full model for
``keras.saving.load_model``. ``-w`` writes weights whatever the suffix, turning ``x.h5`` (the
original keras-yolo3 name) into ``x.weights.h5``.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from yolo3 import darknet  # noqa: E402
from yolo3.cli import run_main  # noqa: E402


def build_parser():
    parser = argparse.ArgumentParser(
        description="Convert Darknet YOLOv3, tiny-YOLOv3 or Darknet-53 weights to Keras."
    )
    parser.add_argument("config_path", help="Darknet .cfg (yolov3, yolov3-tiny or darknet53)")
    parser.add_argument("weights_path", help="Darknet .weights file")
    parser.add_argument("output_path", help="*.weights.h5 for weights, *.keras for a full model")
    parser.add_argument(
        "-w",
        "--weights_only",
        action="store_true",
        help="write weights only (x.h5 becomes x.weights.h5)",
    )
    parser.add_argument(
        "--fixed_size",
        action="store_true",
        help="build for the cfg's width x height instead of any multiple of 32",
    )
    return parser


def resolve_output(output_path, weights_only):
    """``(path, kind)`` with kind ``"weights"`` or ``"keras"``; raises on an unusable suffix."""
    if output_path.endswith(".weights.h5"):
        return output_path, "weights"
    if weights_only:
        if output_path.endswith(".keras"):
            raise ValueError(f"--weights_only writes weights, but {output_path} ends with .keras")
        stem = output_path[: -len(".h5")] if output_path.endswith(".h5") else output_path
        return stem + ".weights.h5", "weights"
    if output_path.endswith(".keras"):
        return output_path, "keras"
    raise ValueError(
        f"output {output_path} must end with .weights.h5 (weights) or .keras (full model); "
        "pass -w to write weights to <name>.weights.h5"
    )


def _convert(args):
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


def main(argv=None):
    return run_main(build_parser(), argv, _convert)


if __name__ == "__main__":
    sys.exit(main())
