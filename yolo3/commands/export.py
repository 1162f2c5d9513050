"""Export a trained detector for deployment: SavedModel, ONNX or TFLite.

    yolo3 export --weights run/last.weights.h5 --format onnx --output model.onnx
    yolo3 export --weights run/last.weights.h5 --format tflite --output model.tflite \\
        --quantize int8 --calibration records/

The artifact is a whole detector (see :mod:`yolo3.inference.export`): uint8 images at the input size
and their original sizes in, boxes in original pixels out, with the score and IoU
thresholds and the detection cap fixed now and recorded in its metadata. Classes, anchors,
masks and input size come from the weights file's metadata, or from the flags. Run any
artifact with ``yolo3 detect --weights PATH`` (``yolo3 evaluate --weights PATH`` scores
it) or :func:`yolo3.inference.runtime.load_detector`.
Exit status 0 on success, 2 on bad flags or inputs.
"""

import sys
import time

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3.cli import (
    ArgumentParser,
    add_detector_arguments,
    add_model_type_argument,
    add_threshold_arguments,
    check_output_path,
    detector_thresholds,
    run_main,
    use_device,
    weights_settings,
)

FORMAT_SUFFIX = {"onnx": ".onnx", "tflite": ".tflite"}


def build_parser():
    from yolo3.inference.export import FORMATS, QUANTIZATIONS  # noqa: PLC0415

    parser = ArgumentParser(description="Export weights as a SavedModel, ONNX or TFLite detector.")
    parser.add_argument("--weights", required=True, help="a .weights.h5 file")
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument(
        "--output", required=True, help="a folder (saved_model), or a .onnx / .tflite file"
    )
    parser.add_argument("--classes", help="classes file (default: the weights' metadata)")
    parser.add_argument("--anchors", help="anchors file (default: the weights' metadata)")
    add_model_type_argument(
        parser, help="default: the weights' metadata, else from the anchor count"
    )
    parser.add_argument(
        "--input-size", type=int, help="a multiple of 32 (default: the weights' metadata)"
    )
    add_detector_arguments(parser)
    add_threshold_arguments(parser, artifacts=False)
    parser.add_argument(
        "--raw", action="store_true", help="export the bare heads (no decoding, no NMS)"
    )
    parser.add_argument("--quantize", choices=QUANTIZATIONS, help="TFLite only")
    parser.add_argument(
        "--calibration",
        help="record set whose validation split calibrates --quantize int8 (yolo3 preprocess)",
    )
    parser.add_argument(
        "--calibration-images", type=int, default=200, help="images drawn for calibration"
    )
    return parser


def _check_args(parser, args):
    if args.quantize and args.format != "tflite":
        parser.error(f"--quantize is for --format tflite, not {args.format}")
    if args.quantize == "int8" and not args.calibration:
        parser.error("--quantize int8 needs --calibration RECORDS (a record set folder)")
    if args.calibration and args.quantize != "int8":
        parser.error("--calibration is only used with --quantize int8")
    suffix = FORMAT_SUFFIX.get(args.format)
    if suffix and not args.output.endswith(suffix):
        parser.error(f"--output {args.output}: a {args.format} file must end with {suffix}")
    try:
        check_output_path(args.output, folder=suffix is None)
    except ValueError as err:
        parser.error(f"--output {err}")
    if args.input_size is not None and (args.input_size < 32 or args.input_size % 32):
        parser.error(f"--input-size {args.input_size} is not a positive multiple of 32")
    if args.calibration_images < 1:
        parser.error("--calibration-images must be at least 1")


def _export(args):
    from yolo3.inference.detector_spec import load_keras_model, spec_for_weights  # noqa: PLC0415
    from yolo3.inference.export import calibration_images, export_detector  # noqa: PLC0415

    use_device(args.device)
    spec = spec_for_weights(
        args.weights,
        **weights_settings(args),
        **detector_thresholds(args),
    )
    images = None
    if args.quantize == "int8":
        images = calibration_images(args.calibration, spec.head.input_hw, args.calibration_images)
    model = load_keras_model(args.weights, spec)
    start = time.perf_counter()
    metadata = export_detector(
        model,
        spec,
        args.output,
        engine=args.format,
        raw=args.raw,
        quantize=args.quantize,
        calibration_images=images,
    )
    print(
        f"wrote {args.output} ({args.format}, outputs: {metadata['outputs']}"
        f"{', ' + args.quantize if args.quantize else ''}) in {time.perf_counter() - start:.1f} s"
    )
    if metadata["outputs"] == "candidates":
        print(
            "TFLite's builtin operators hold no class-wise NMS: the file ends with every "
            "candidate box, and yolo3.inference.runtime applies the NMS"
        )
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, _export, check=_check_args)


if __name__ == "__main__":
    sys.exit(main())
