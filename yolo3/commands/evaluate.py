"""Measure a model's mAP (VOC and COCO) on a record set, an annotation file or a dataset.

    yolo3 evaluate --weights logs/run/checkpoints/best.weights.h5 --records rec
    yolo3 evaluate --weights logs/run/checkpoints/last.weights.h5 --annotations val.txt
    yolo3 evaluate --weights logs/run/checkpoints/last.weights.h5 --data rf --split test
    yolo3 evaluate --weights yolov3.weights.h5 --annotations val.txt \\
        --classes model_data/coco_classes.txt
    yolo3 evaluate --weights yolov3.weights.h5 \\
        --coco-json annotations/instances_val2017.json --images val2017
    yolo3 evaluate --weights model-int8.tflite --records rec
    yolo3 evaluate --watch logs/run --device gpu:3

``--weights`` takes a weights file (``.weights.h5``, or an original keras-yolo3 ``.h5``) or a
SavedModel folder, ONNX or TFLite file written by ``yolo3 export``, told apart by what the
path holds. The weights file's own metadata (model type, classes, anchors, masks, input
size, as yolo3 train and yolo3 convert record them) is used for every flag not given; a record set
fixes the classes and the input size it was made for. A file that records no input size is
run at 416 px, said on stderr. An exported file fixes all of these and its thresholds: it
takes ``--records``, ``--annotations`` or ``--data``, and refuses the flags that set what it
fixes.

``--data PATH`` scores one split (``--split``: ``val`` by default, ``test``, ``train``) of a
dataset in any format :mod:`yolo3.data.formats` reads, on its original images, as an
annotation file is scored: the split is written to ``annotations.txt`` in the report folder
(keras-yolo3 lines, the images' absolute paths; ``--annotations`` reads it back) and scored
from there. The class names are the dataset's; weights that record another number of classes
are refused, other names for as many classes are a warning (classes are scored by id). A
VOC dataset, which names its classes but not their order, takes ``--classes``, else the
weights' classes. What the reader rejected in the split is counted in one line.

Prints the per-class table and writes ``metrics.json``, ``table.txt``, a precision-recall
curve per class (``pr/``) and ``gallery.png`` (found true boxes green, missed ones dashed
magenta, detections in class colours, false positives dashed; a legend below) to
``--output``.

``--coco-json`` scores the way published COCO figures are scored: detections on the
original images, with the file's image and category ids, by pycocotools against the
unmodified annotation file (crowd regions ignored, segmentation areas for small, medium and
large). It writes ``metrics.json`` and ``coco_results.json``, a results file the COCO
evaluation server accepts (rename it as the server asks, ``detections_<set>_<name>_results.json``).

``--watch LOG_DIR`` follows a training run: each time ``checkpoints/last.weights.h5``
holds a new epoch it is evaluated on the run's validation records, the figures go to
TensorBoard under ``LOG_DIR/eval``, the best weights by mAP are kept as
``checkpoints/best_map.weights.h5``, and the watcher stops after the run's last epoch.
Run it as a separate process on a device of its own (``--device gpu:N``).

``--mlflow`` logs an evaluation to an MLflow run (``pip install "keras-yolo3[mlflow]"``): by
default the run that ``yolo3 train --mlflow`` recorded in the weights' log folder
(``mlflow_run.json``), else ``--mlflow-run-id``. Its figures become the metrics
``evaluate/mAP50``, ``evaluate/mAP50_voc07``, ``evaluate/AP50/<class>`` and the COCO ones, at
the step of the weights' epoch, and the report folder the artifacts ``evaluate/<weights
name>/``. The server is asked before any detection: one that cannot be reached is one line.

Exit status: 0 on success, 2 on bad usage or input.
"""

import argparse
import dataclasses
import os
import shutil
import sys
import time

from yolo3.cli import start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back

from yolo3 import fileio
from yolo3.checkpoint.weights import read_metadata
from yolo3.cli import (
    ArgumentParser,
    add_detector_arguments,
    add_model_type_argument,
    add_progress_arguments,
    add_threshold_arguments,
    detector_engine,
    detector_thresholds,
    output_folder,
    progress_setting,
    refuse_fixed_flags,
    run_main,
    use_device,
    weights_settings,
)
from yolo3.data import formats, records
from yolo3.data.annotations import format_line, write_annotations
from yolo3.data.limits import excerpt
from yolo3.evaluation import validate
from yolo3.evaluation.metrics import AP_BY_IOU, COCO_METRICS
from yolo3.fileio import atomic_write
from yolo3.inference.detector_spec import load_keras_model, spec_for_weights
from yolo3.inference.runtime import load_detector
from yolo3.model.resources import DARKNET_INPUT_SIZE, read_classes
from yolo3.progress import counter


def build_parser():
    parser = ArgumentParser(description=__doc__.split("\n")[0])
    _add_weights_arguments(parser)
    _add_source_arguments(parser)
    _add_model_arguments(parser)
    add_detector_arguments(parser)
    _add_scoring_arguments(parser)
    add_progress_arguments(parser)
    _add_watch_arguments(parser)
    _add_tracking_arguments(parser)
    return parser


def _add_weights_arguments(parser):
    """The detector to score: ``--weights`` and its former spelling ``--model``."""
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument(
        "--weights",
        help="the detector to score: a .weights.h5 (or keras-yolo3 .h5) file, or a "
        "SavedModel folder, .onnx or .tflite file from yolo3 export (export it with "
        "--score 0.01 for figures comparable with its weights file)",
    )
    # --model: the spelling of earlier releases for an exported file, kept working for a
    # release, out of --help.
    weights.add_argument("--model", dest="weights", help=argparse.SUPPRESS)


def _add_source_arguments(parser):
    """What is scored: one of a record set, an annotation file, a COCO file or a dataset,
    with the COCO file's images and the split."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--records", help="record set; its --split is evaluated")
    source.add_argument("--annotations", help="annotation file (keras-yolo3 lines)")
    source.add_argument("--coco-json", help="COCO annotation file, scored as published figures are")
    formats.add_arguments(
        parser,
        data_help="a dataset in another format (a data.yaml or its folder, a Darknet .data, "
        "COCO JSON, a VOCdevkit); its --split is scored on the original images",
        group=source,
    )
    parser.add_argument("--images", help="--coco-json: the folder of its images")
    parser.add_argument(
        "--split",
        default="val",
        help="the split of --records or --data to score: val, test, or train (default: val)",
    )


def _add_model_arguments(parser):
    """What the weights' metadata says unless given: classes, anchors, model type, input size."""
    parser.add_argument(
        "--classes",
        help="classes file (default: the weights' metadata; a record set has its own)",
    )
    parser.add_argument("--anchors", help="anchors file (default: the weights' metadata)")
    add_model_type_argument(
        parser, help="default: the weights' metadata, else from the anchor count"
    )
    parser.add_argument(
        "--input-size",
        type=int,
        help="network input for annotation files and --coco-json (default: the weights' "
        f"metadata, else {DARKNET_INPUT_SIZE}; a record set has its own)",
    )


def _add_scoring_arguments(parser):
    """How the images are read and scored, and what the report holds and where it goes."""
    parser.add_argument("--image-root", help="folder relative image paths start from")
    parser.add_argument(
        "--output", type=output_folder, help="report folder (default: beside the weights)"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--limit", type=int, help="evaluate only the first N images")
    parser.add_argument("--no-coco", action="store_true", help="skip the COCO metrics")
    add_threshold_arguments(parser, flags=("--iou", "--box-merge"))
    parser.add_argument("--gallery", type=int, default=16, help="images in gallery.png")


def _add_watch_arguments(parser):
    """``--watch``: following a training run, and how often and how long to look."""
    parser.add_argument("--watch", metavar="LOG_DIR", help="evaluate each new checkpoint")
    parser.add_argument("--poll", type=float, default=10.0, help="--watch: seconds between looks")
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=3600.0,
        help="--watch: give up after this long without a new checkpoint",
    )


def _add_tracking_arguments(parser):
    """Experiment tracking: ``--mlflow`` and the run and server it logs to."""
    tracking = parser.add_argument_group("experiment tracking (MLflow)")
    tracking.add_argument(
        "--mlflow",
        action="store_true",
        help="log the figures and the report to an MLflow run (needs pip install "
        '"keras-yolo3[mlflow]")',
    )
    tracking.add_argument(
        "--mlflow-run-id",
        metavar="RUN_ID",
        help="with --mlflow: the run (default: the one yolo3 train --mlflow recorded in the "
        "weights' log folder)",
    )
    tracking.add_argument(
        "--mlflow-tracking-uri",
        metavar="URI",
        help="with --mlflow: the tracking server (default: $MLFLOW_TRACKING_URI, else the URI "
        "the run was recorded with, else MLflow's own)",
    )


def _check(parser, args):
    if args.data_format and not args.data:
        parser.error("--data-format goes with --data")
    if not args.mlflow and (args.mlflow_run_id or args.mlflow_tracking_uri):
        flag = "--mlflow-run-id" if args.mlflow_run_id else "--mlflow-tracking-uri"
        parser.error(f"{flag} needs --mlflow")
    if args.mlflow and args.watch:
        parser.error(
            "--mlflow logs one evaluation, not --watch's; for every epoch's mAP in MLflow, "
            "train with yolo3 train --mlflow --map-every K"
        )


def _spec(args, weights, *, class_names=None, anchors_path=None, input_size=None, log=print):
    """The :class:`yolo3.inference.detector_spec.DetectorSpec` that ``weights`` are scored with:
    each flag when given, else what the source fixes (``class_names``, ``input_size``: a record
    set's), else the weights' metadata, else 416 px (said through ``log``)."""
    settings = {**weights_settings(args), **detector_thresholds(args)}
    settings.update(
        classes_path=None if class_names is not None else args.classes,
        anchors_path=args.anchors or anchors_path,
        input_size=input_size or args.input_size,
    )
    return spec_for_weights(
        weights,
        **settings,
        class_names=class_names,
        fallbacks={"input_size": DARKNET_INPUT_SIZE},
        log=lambda line: log(f"note: {line}"),
    )


def _source_spec(args, weights, source, anchors_path=None, log=print):
    """:func:`_spec` for a record set (its classes and input size), a dataset split (its
    classes) or an annotation file."""
    if isinstance(source, records.RecordSet):
        return _spec(
            args, weights, class_names=source.classes, anchors_path=anchors_path,
            input_size=source.input_hw, log=log,
        )  # fmt: skip
    if isinstance(source, DatasetSplit):
        return _spec(args, weights, class_names=source.classes, anchors_path=anchors_path, log=log)
    return _spec(args, weights, anchors_path=anchors_path, log=log)


@dataclasses.dataclass(frozen=True)
class DatasetSplit:
    """One split of a ``--data`` dataset as it is scored: ``annotations`` (the annotation file
    it was written to: boxes in original image pixels), ``classes`` (the dataset's class
    names, in class id order) and ``num_images``."""

    annotations: str
    classes: list
    num_images: int


def dataset_split(args, weights, output, log=print):
    """Reads ``args.split`` of ``--data`` and writes it to ``output/annotations.txt``.

    ``weights`` (a weights file's path, or an exported detector) tells the classes the
    detector predicts: the dataset must name as many, and a VOC dataset without ``--classes``
    takes them as its own (its files name classes but not their order).

    Raises:
        ValueError: one line, for a split the dataset lacks
            (:func:`yolo3.data.formats.read_split`) or a class count the weights were not
            trained for.
    """
    predicted, weights_name = _predicted_classes(weights)
    data_format = args.data_format or formats.detect_format(args.data)
    classes = read_classes(args.classes) if args.classes else None
    if classes is None and formats.registered(data_format).takes_classes:
        classes = predicted
    dataset = formats.read_split(
        args.data, args.split, data_format=data_format, classes=classes, image_root=args.image_root
    )
    _check_classes(dataset.classes, predicted, f"--data {args.data}", weights_name, log)
    entries = dataset.splits[args.split]
    path = os.path.join(output, "annotations.txt")
    os.makedirs(output, exist_ok=True)
    # Absolute paths: the file lies in the report folder, not beside the images.
    lines = [format_line(os.path.abspath(e.path), e.boxes, e.classes, e.difficult) for e in entries]
    write_annotations(path, lines)
    log(f"{args.data} ({data_format}): the {args.split} split, {len(entries)} images -> {path}")
    if dataset.rejects:
        log(
            f"note: the reader rejected {dataset.counts['rejected_lines']} images or lines and "
            f"{dataset.counts['rejected_boxes']} boxes of the {args.split} split; the first: "
            f"{excerpt(dataset.rejects[0].message, 300)}"
        )
    return DatasetSplit(path, list(dataset.classes), len(entries))


def _predicted_classes(weights):
    """``(class names or None, name)`` of what ``weights`` predict: a weights file's metadata
    (None where it records none), an exported detector's own."""
    if isinstance(weights, str):
        return (read_metadata(weights) or {}).get("classes"), weights
    return list(weights.class_names), "the exported model"


def _check_classes(names, predicted, data, weights, log):
    """ValueError when the dataset's ``names`` and the weights' ``predicted`` (None: not
    recorded) differ in number; a warning through ``log`` when only names differ (scoring
    goes by class id)."""
    if predicted is None or list(names) == list(predicted):
        return
    shown = [excerpt(", ".join(listed), 200) for listed in (names, predicted)]
    if len(names) != len(predicted):
        raise ValueError(
            f"{data} names {len(names)} classes ({shown[0]}) but {weights} predicts "
            f"{len(predicted)} ({shown[1]}); score a dataset of the weights' classes"
        )
    log(
        f"warning: {data} names its classes {shown[0]}, {weights} {shown[1]}: scored by class "
        "id, reported by the dataset's names"
    )


def evaluate_once(args, weights, source, output, anchors_path=None, log=print):
    spec = _source_spec(args, weights, source, anchors_path, log)
    head = spec.head
    height, width = head.input_hw
    log(f"{head.model_type} {height}x{width}, {head.num_classes} classes: {weights}")
    with _detecting(args, source) as bar:
        evaluation = validate.evaluate_model(
            load_keras_model(weights, spec),
            source.annotations if isinstance(source, DatasetSplit) else source,
            head=head,
            resampling=spec.resampling,
            iou_threshold=spec.iou_threshold,
            box_merge=spec.box_merge,
            **_evaluation_options(args, bar),
        )
    return _report(args, evaluation, output, log)


def _evaluation_options(args, bar):
    """The keyword arguments of :func:`yolo3.evaluation.validate.evaluate_detector` the flags set;
    ``bar`` (from :func:`_detecting`) counts the images done."""
    return {
        "split": args.split,
        "batch_size": args.batch_size,
        "coco": not args.no_coco,
        "gallery_size": args.gallery,
        "limit": args.limit,
        "image_root": args.image_root,
        "progress": _advance(bar),
    }


def _detecting(args, source):
    """The progress display of detecting on ``source`` (a bar, plain lines or nothing)."""
    total = None
    if isinstance(source, records.RecordSet) and source.has_split(args.split):
        total = source.num_records(args.split)
    elif isinstance(source, DatasetSplit):
        total = source.num_images
    if args.limit:
        total = min(total, args.limit) if total else None
    return counter(total, what="evaluate", unit="images", progress=progress_setting(args))


def _advance(bar):
    """A ``progress(done)`` callable (images done so far) that moves ``bar`` along."""
    done = 0

    def advance(count):
        nonlocal done
        bar.update(count - done)
        done = count

    return advance


def _report(args, evaluation, output, log):
    table = validate.write_report(evaluation, output, gallery=args.gallery > 0)
    log(table)
    if evaluation.coco:
        _log_coco(evaluation.coco, log)
    for message in evaluation.skipped:
        log(f"skipped: {message}")
    log(f"{evaluation.num_images} images; report in {output}")
    return evaluation


def _log_coco(metrics, log):
    """The COCO headline figures, then AP at each IoU threshold (how tight the boxes are)."""
    log("COCO " + "  ".join(f"{name} {_figure(metrics.get(name))}" for name in COCO_METRICS[:6]))
    by_iou = metrics.get(AP_BY_IOU) or {}
    if by_iou:
        log("COCO AP at IoU " + "  ".join(f"{t} {_figure(ap)}" for t, ap in by_iou.items()))


def _figure(value):
    return "n/a" if value is None or value != value else f"{value:.3f}"  # NaN: no such boxes


def exported(args, engine, log=print, tracked=None):
    """Scores an exported ``engine`` artifact (``--weights``) on a record set, an
    annotation file or a dataset split; logs it to ``tracked`` (an MLflow run) when given."""
    if args.coco_json:
        raise ValueError(
            f"--coco-json scores a weights file; {args.weights} is an exported {engine} model "
            f"(score it with --records, --annotations or --data)"
        )
    refuse_fixed_flags(args, args.weights, engine)
    detector = load_detector(args.weights, **detector_thresholds(args, defaults=False))
    if detector.spec.score_threshold > validate.MAP_SCORE_THRESHOLD:
        log(
            f"note: {args.weights} drops detections scoring below "
            f"{detector.spec.score_threshold}, which lowers mAP; export with --score "
            f"{validate.MAP_SCORE_THRESHOLD} for figures comparable with its weights file"
        )
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.weights)), "eval")
    if args.data:
        source = dataset_split(args, detector, output, log)
    else:
        source = records.open_record_set(args.records) if args.records else args.annotations
    with _detecting(args, source) as bar:
        evaluation = validate.evaluate_detector(
            detector,
            source.annotations if isinstance(source, DatasetSplit) else source,
            **_evaluation_options(args, bar),
        )
    _report(args, evaluation, output, log)
    _track(tracked, output, args.weights, engine, evaluation=evaluation)
    return 0


def single(args):
    if not args.weights or not (args.records or args.annotations or args.data or args.coco_json):
        raise ValueError(
            "give --weights and --records, --annotations, --data or --coco-json (or --watch "
            "LOG_DIR)"
        )
    engine = detector_engine(args.weights)
    use_device(args.device, engine)
    # Before any detection: an MLflow server that cannot be reached is one line now.
    tracked = _open_tracking(args)
    if engine != "keras":
        return exported(args, engine, tracked=tracked)
    if args.coco_json:
        return coco_json(args, tracked=tracked)
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.weights)), "eval")
    # A record set's manifest, or the dataset, is read here once and handed on.
    if args.data:
        source = dataset_split(args, args.weights, output)
    else:
        source = records.open_record_set(args.records) if args.records else args.annotations
    evaluation = evaluate_once(args, args.weights, source, output)
    _track(tracked, output, args.weights, engine, evaluation=evaluation)
    return 0


def _open_tracking(args):
    """With ``--mlflow``: the MLflow run to log to (yolo3.callbacks.mlflow_tracking), else None."""
    if not args.mlflow:
        return None
    from yolo3.callbacks import mlflow_tracking  # noqa: PLC0415 - only with --mlflow

    return mlflow_tracking.open_run(
        args.mlflow_run_id, tracking_uri=args.mlflow_tracking_uri, near=args.weights
    )


def _figures(evaluation):
    """An evaluation's headline figures and the AP@0.5 of each class (``AP50/<class>``)."""
    from yolo3.callbacks.evaluation import class_tags  # noqa: PLC0415

    figures = evaluation.summary()
    for tag, ap in zip(class_tags(evaluation.class_names), evaluation.voc.ap):
        figures[f"AP50/{tag}"] = ap
    return figures


def _track(tracked, output, weights, engine, *, evaluation=None, figures=None):
    """Logs the figures of ``evaluation`` (or ``figures``, name: number) and the report folder
    ``output`` to ``tracked`` (None: nothing), at the step of the epoch a weights file records
    (0 for others)."""
    if tracked is None:
        return
    if evaluation is not None:
        figures = _figures(evaluation)
    from yolo3.callbacks import mlflow_tracking  # noqa: PLC0415 - only with --mlflow

    name = os.path.basename(os.path.normpath(weights))
    step = 0
    if engine == "keras":
        step = int((read_metadata(weights) or {}).get("epoch", 0))
        name = name.removesuffix(".weights.h5")
    mlflow_tracking.log_evaluation(
        tracked, figures, step=step, report_dir=output, name=os.path.splitext(name)[0]
    )


def coco_json(args, log=print, tracked=None):
    """``--coco-json``: detection on the original images, scored by pycocotools."""
    if not args.images:
        raise ValueError("--coco-json needs --images, the folder of the annotation file's images")
    data = validate.read_coco_file(args.coco_json)  # read once, handed on
    class_names = None  # --classes, read by _spec
    if not args.classes:  # the file's categories in order of id, as coco_annotation.py numbers
        class_names = [c["name"] for c in sorted(data["categories"], key=lambda c: c["id"])]
    spec = _spec(args, args.weights, class_names=class_names, log=log)
    model = load_keras_model(args.weights, spec)
    total = min(len(data.get("images", ())), args.limit or len(data.get("images", ())))
    with counter(total, what="evaluate", unit="images", progress=progress_setting(args)) as bar:
        results, metrics, num_images = validate.evaluate_coco_json(
            model,
            args.coco_json,
            args.images,
            head=spec.head,
            resampling=spec.resampling,
            iou_threshold=spec.iou_threshold,
            box_merge=spec.box_merge,
            batch_size=args.batch_size,
            limit=args.limit,
            data=data,
            progress=_advance(bar),
        )
    output = args.output or os.path.join(os.path.dirname(os.path.abspath(args.weights)), "eval")
    os.makedirs(output, exist_ok=True)
    fileio.write_json(os.path.join(output, "coco_results.json"), results, indent=None)
    summary = {
        "annotation_file": os.path.abspath(args.coco_json),
        "num_images": num_images,
        "num_detections": len(results),
        "coco": metrics,
    }
    fileio.write_json(os.path.join(output, "metrics.json"), validate.json_safe(summary))
    if metrics is None:
        log(f"{args.coco_json} has no annotations: detections written, not scored")
    else:
        _log_coco(metrics, log)
        for note in metrics["notes"]:
            log(f"note: {note}")
        figures = {f"coco_{name}": metrics[name] for name in COCO_METRICS}
        _track(tracked, output, args.weights, "keras", figures=figures)
    log(f"{num_images} images, {len(results)} detections; results in {output}")
    return 0


def watch(args, log=print):
    """Evaluates every new epoch of a run until its last one (see the module docstring)."""
    import tensorflow as tf  # noqa: PLC0415

    from yolo3.training.job import read_config  # noqa: PLC0415

    use_device(args.device)
    log_dir = args.watch
    config = read_config(os.path.join(log_dir, "config.json"))
    checkpoint = os.path.join(log_dir, "checkpoints", "last.weights.h5")
    source = records.open_record_set(config.val_records or config.records)
    writer = tf.summary.create_file_writer(os.path.join(log_dir, "eval"))
    best, last_epoch, last_change = -1.0, 0, time.monotonic()
    while True:
        epoch = _checkpoint_epoch(checkpoint)
        if epoch > last_epoch:
            # Copy first: training may replace the file while it is being read.
            snapshot = os.path.join(log_dir, "eval", f"epoch-{epoch:04d}.weights.h5")
            os.makedirs(os.path.dirname(snapshot), exist_ok=True)
            with atomic_write(snapshot) as temp:
                shutil.copyfile(checkpoint, temp)
            epoch = read_metadata(snapshot)["epoch"]
            output = os.path.join(log_dir, "eval", f"epoch-{epoch:04d}")
            log(f"epoch {epoch}: evaluating {snapshot}")
            evaluation = evaluate_once(args, snapshot, source, output, config.anchors, log)
            with writer.as_default(step=epoch):
                for name, value in evaluation.summary().items():
                    tf.summary.scalar(name, value)
            writer.flush()
            if evaluation.map50 > best:
                best = evaluation.map50
                best_path = os.path.join(log_dir, "checkpoints", "best_map.weights.h5")
                with atomic_write(best_path) as temp:
                    shutil.copyfile(snapshot, temp)
                log(f"epoch {epoch}: best mAP@0.5 so far, {best:.4f} -> {best_path}")
            os.remove(snapshot)
            last_epoch, last_change = epoch, time.monotonic()
            if epoch >= config.epochs:
                log(f"the run's last epoch ({config.epochs}) is evaluated; best mAP {best:.4f}")
                return 0
        elif time.monotonic() - last_change > args.idle_timeout:
            log(f"no new checkpoint in {args.idle_timeout:g} s; stopping at epoch {last_epoch}")
            return 0
        time.sleep(args.poll)


def _checkpoint_epoch(path):
    if not os.path.exists(path):
        return 0
    try:
        return int(read_metadata(path).get("epoch", 0))
    except OSError:  # replaced while being opened; look again next time
        return 0


def main(argv=None):
    return run_main(
        build_parser(), argv, lambda args: watch(args) if args.watch else single(args), check=_check
    )


if __name__ == "__main__":
    sys.exit(main())
