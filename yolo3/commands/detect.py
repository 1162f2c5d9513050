"""Detect objects in images, folders of images and videos; write annotated copies and JSON.

    yolo3 detect photos/ clip.mp4 --weights model_data/yolo.weights.h5 --output out
    yolo3 detect photos/ --weights model.onnx --output out

``--weights`` takes any detector: a weights file (``.weights.h5``, or an original keras-yolo3
``.h5``), or a SavedModel folder, ONNX or TFLite file written by ``yolo3 export``, told
apart by what the path holds. An exported file fixes its classes, anchors, model type, input
size, letterbox and thresholds: the flags that set them are refused with it. A weights
file's own metadata (model type, classes, anchors, masks, input size, as yolo3 train and
yolo3 convert record them) is used for every flag not given; where the file records none, the
COCO classes and anchors of ``model_data/`` and 416 px, said on stderr.

Writes ``out/<name>`` for each image (boxes drawn), ``out/<video stem>.detections.mp4`` for
each video (every ``--video-stride``-th frame, annotated) and ``out/detections.json``:
``{"images": [{"path", "frame" (videos only), "width", "height", "boxes" ([x_min, y_min,
x_max, y_max] in original pixels), "scores", "class_ids", "labels"}, ...], "errors": [...]}``.

Inputs that are missing or unreadable are reported on stderr and skipped. Exit status: 0
when at least one image or frame was processed, 1 when none was, 2 on bad usage (invalid
flags, unusable weights, anchors or classes).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3 import fileio
from yolo3.cli import (
    ArgumentParser,
    add_detector_arguments,
    add_model_type_argument,
    add_threshold_arguments,
    detector_engine,
    detector_thresholds,
    output_folder,
    refuse_fixed_flags,
    run_main,
    use_device,
    weights_settings,
)
from yolo3.data.image import IMAGE_SUFFIXES, load_rgb
from yolo3.inference.detect import draw_detections
from yolo3.inference.runtime import load_detector
from yolo3.model.resources import DARKNET_INPUT_SIZE, model_data_file, shipped_anchors

VIDEO_SUFFIXES = {".mp4", ".avi", ".mov", ".mkv"}
# For weights that record none: Darknet's COCO files, as the original keras-yolo3 assumed.
FALLBACKS = {
    "classes_path": model_data_file("coco_classes.txt"),
    "anchors_path": shipped_anchors("yolov3"),
    "input_size": DARKNET_INPUT_SIZE,
}


def build_parser():
    parser = ArgumentParser(
        description="Run YOLOv3 on images, folders (searched recursively) and videos."
    )
    parser.add_argument("inputs", nargs="+", help="image files, folders or video files")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--weights",
        help="any detector: a .weights.h5 (or keras-yolo3 .h5) file, or a SavedModel folder, "
        ".onnx or .tflite file written by yolo3 export (which fixes its settings)",
    )
    # --model: the spelling of earlier releases for an exported file, kept working for a
    # release, out of --help.
    source.add_argument("--model", dest="weights", help=argparse.SUPPRESS)
    parser.add_argument(
        "--anchors",
        help=f"anchors file (default: the weights' metadata, else {FALLBACKS['anchors_path']})",
    )
    parser.add_argument(
        "--classes",
        help=f"classes file (default: the weights' metadata, else {FALLBACKS['classes_path']})",
    )
    add_model_type_argument(
        parser, help="default: the weights' metadata, else from the anchor count"
    )
    parser.add_argument(
        "--input-size",
        type=int,
        help=f"a multiple of 32 (default: the weights' metadata, else {FALLBACKS['input_size']})",
    )
    add_detector_arguments(parser)
    add_threshold_arguments(parser)
    parser.add_argument(
        "--output", type=output_folder, required=True, help="folder for annotated files and JSON"
    )
    parser.add_argument("--video-stride", type=int, default=1, help="use every Nth frame")
    parser.add_argument("--batch-size", type=int, default=8, help="images per model call")
    parser.add_argument(
        "--legend",
        action="store_true",
        help="add a band below each annotated image naming the colours of the classes drawn "
        "(images only: video frames keep their size)",
    )
    return parser


def _check_args(parser, args):
    if args.input_size is not None and (args.input_size < 32 or args.input_size % 32):
        parser.error(f"--input-size {args.input_size} is not a positive multiple of 32")
    for flag in ("video_stride", "batch_size"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1")


class Run:
    """What one invocation found and produced: JSON records, errors and output names."""

    def __init__(self, detector, output_dir, batch_size, legend=False):
        self.detector = detector
        self.output_dir = output_dir
        self.batch_size = batch_size
        self.legend = legend
        self.records = []
        self.errors = []
        self.used_names = set()

    def error(self, path, message):
        print(f"error: {path}: {message}", file=sys.stderr)
        self.errors.append({"path": str(path), "error": message})

    def output_name(self, relative):
        """A unique file name under the output folder for ``relative`` (a Path)."""
        candidate, index = relative, 1
        while str(candidate) in self.used_names:
            candidate = relative.with_name(f"{relative.stem}_{index}{relative.suffix}")
            index += 1
        self.used_names.add(str(candidate))
        return self.output_dir / candidate

    def record(self, path, image, detection, frame=None):
        entry = {"path": str(path)}
        if frame is not None:
            entry["frame"] = frame
        entry.update(
            width=int(image.shape[1]),
            height=int(image.shape[0]),
            boxes=[[float(v) for v in box] for box in detection["boxes"]],
            scores=[float(s) for s in detection["scores"]],
            class_ids=[int(c) for c in detection["classes"]],
            labels=list(detection["labels"]),
        )
        self.records.append(entry)

    def images(self, items):
        """Detects on ``(path, output relative path)`` pairs, ``batch_size`` at a time."""
        for start in range(0, len(items), self.batch_size):
            loaded = []
            for path, relative in items[start : start + self.batch_size]:
                try:
                    loaded.append((path, relative, load_rgb(path)))
                except (OSError, ValueError) as err:
                    self.error(path, str(err))
            if not loaded:
                continue
            detections = self.detector.detect([image for _, _, image in loaded])
            for (path, relative, image), detection in zip(loaded, detections, strict=True):
                self.record(path, image, detection)
                if relative.suffix.lower() not in IMAGE_SUFFIXES:
                    relative = relative.with_suffix(".png")
                target = self.output_name(relative)
                target.parent.mkdir(parents=True, exist_ok=True)
                drawn = draw_detections(
                    image, detection, self.detector.class_names, legend=self.legend
                )
                drawn.save(target, quality=95)  # quality applies to JPEG only
                print(f"{path}: {len(detection['boxes'])} detections")

    def video(self, path, stride):
        """Detects on every ``stride``-th frame of a video and writes an annotated video."""
        try:
            import cv2
        except ImportError:
            self.error(path, "reading videos needs OpenCV: pip install opencv-python-headless")
            return
        capture = cv2.VideoCapture(str(path))
        if not capture.isOpened():
            self.error(path, "OpenCV cannot open this video")
            return
        fps = capture.get(cv2.CAP_PROP_FPS)
        fps = fps if fps > 0 else 25.0  # some containers report 0 or NaN
        target = self.output_name(Path(f"{path.stem}.detections.mp4"))
        writer, frames, batch, index = None, 0, [], 0
        try:
            while True:
                ok, frame = capture.read()
                if ok and index % stride == 0:
                    # OpenCV decodes to BGR; the network was trained on RGB.
                    batch.append((index, cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)))
                if batch and (not ok or len(batch) == self.batch_size):
                    writer = writer or self._video_writer(cv2, target, fps / stride, batch)
                    self._video_batch(path, batch, writer, cv2)
                    frames += len(batch)
                    batch = []
                if not ok:  # end of stream (or an undecodable frame, which ends it too)
                    break
                index += 1
        finally:
            capture.release()
            if writer is not None:
                writer.release()
        if frames == 0:
            self.error(path, "no frame could be decoded")
        else:
            print(f"{path}: {frames} frames of {index} -> {target}")

    def _video_writer(self, cv2, target, fps, batch):
        height, width = batch[0][1].shape[:2]
        target.parent.mkdir(parents=True, exist_ok=True)
        writer = cv2.VideoWriter(str(target), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
        if not writer.isOpened():
            raise OSError(f"OpenCV cannot write {target} with the mp4v codec")
        return writer

    def _video_batch(self, path, batch, writer, cv2):
        detections = self.detector.detect([frame for _, frame in batch])
        for (index, frame), detection in zip(batch, detections, strict=True):
            self.record(path, frame, detection, frame=index)
            drawn = draw_detections(frame, detection, self.detector.class_names)
            writer.write(cv2.cvtColor(np.asarray(drawn, dtype=np.uint8), cv2.COLOR_RGB2BGR))


def expand_inputs(inputs, report, output_dir):
    """Image ``(path, output relative path)`` pairs and video paths, in argument order.

    Files under ``output_dir`` are left out of folder searches, so annotated images from an
    earlier run into a folder inside the input are not detected on again.
    """
    images, videos = [], []
    output_dir = output_dir.resolve()
    for raw in inputs:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file()
                and p.suffix.lower() in IMAGE_SUFFIXES
                and output_dir not in p.resolve().parents
            )
            if not found:
                report(path, f"folder holds no image ({', '.join(IMAGE_SUFFIXES)})")
            # Keep the folder structure so equal names in subfolders do not collide.
            images.extend((p, Path(path.name) / p.relative_to(path)) for p in found)
        elif path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES:
            videos.append(path)
        elif path.is_file():
            images.append((path, Path(path.name)))
        else:
            report(path, "no such file or folder")
    return images, videos


def open_detector(args):
    """The detector ``--weights`` names: a weights file with the flags' settings, or an
    exported artifact, which fixes them (the flags it fixes are refused; thresholds other
    than its own too)."""
    source = args.weights
    engine = detector_engine(source)
    use_device(args.device, engine)
    if engine != "keras":
        refuse_fixed_flags(args, source, engine)
        return load_detector(source, **detector_thresholds(args, defaults=False))
    return load_detector(
        source,
        **weights_settings(args),
        **detector_thresholds(args),
        fallbacks=FALLBACKS,
        log=lambda line: print(line, file=sys.stderr),
    )


def detect(args):
    """Runs the detector over the inputs; status 1 when no image or frame could be processed."""
    detector = open_detector(args)
    output_dir = Path(args.output)
    output_dir.mkdir(parents=True, exist_ok=True)
    run = Run(detector, output_dir, args.batch_size, legend=args.legend)
    images, videos = expand_inputs(args.inputs, run.error, output_dir)
    run.images(images)
    for video in videos:
        try:
            run.video(video, args.video_stride)
        except OSError as err:
            run.error(video, str(err))
    fileio.write_json(
        output_dir / "detections.json",
        {
            "weights": str(args.weights),
            "classes": detector.class_names,
            "input_size": list(detector.input_hw),
            "images": run.records,
            "errors": run.errors,
        },
    )
    print(
        f"{len(run.records)} images/frames processed, {len(run.errors)} errors; "
        f"results in {output_dir}",
        file=sys.stderr,
    )
    return 0 if run.records else 1


def main(argv=None):
    # Unreadable weights, anchors or classes files, or ones that do not fit together.
    return run_main(build_parser(), argv, detect, check=_check_args, errors=(OSError, ValueError))


if __name__ == "__main__":
    sys.exit(main())
