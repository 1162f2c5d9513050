"""Inference end to end on every engine, against OpenCV's dnn module on the same weights.

For each model (tiny, YOLOv3) the weights are exported once to every artifact of
:mod:`yolo3.inference.export` and written back in Darknet format
(:func:`yolo3.checkpoint.darknet_writer.write_darknet`) for ``cv2.dnn.readNetFromDarknet``. Every
engine then runs ``detect(images)`` end to end: letterbox (PIL bicubic, the same for all), network,
decode, letterbox inverse and class-wise NMS with the same thresholds. OpenCV's forward pass
decodes inside its [yolo] layers; its boxes are mapped back and suppressed per class with
``cv2.dnn.NMSBoxesBatched``.

Each (model, engine, threads) runs in its own spawned process, one after the other (a
process per row at once would not fit YOLOv3 eight times in memory), and times ``calls``
calls per batch size after ``warmup`` calls: median and 90th-percentile latency, images/s
from the median, CPU ms per image. With ``records``, each engine's mAP@0.5 on the record
set's validation split (artifacts exported at the mAP threshold) shows what quantisation
costs.
"""

import dataclasses
import os
import statistics
import tempfile
import time

import numpy as np

from benchmarks.harness import load_average, machine_info, run_spawned

ENGINES = (
    "keras",
    "saved_model",
    "onnx",
    "tflite",
    "tflite-float16",
    "tflite-int8",
    "opencv",
)
TFLITE_QUANTIZE = {"tflite": None, "tflite-float16": "float16", "tflite-int8": "int8"}
FLOAT32_ENGINES = ("keras", "saved_model", "onnx", "tflite")
NUM_CLASSES_UNTRAINED = 80
CALIBRATION_IMAGES = 64


@dataclasses.dataclass(frozen=True)
class DetectConfig:
    """``threads`` 0 means all cores; ``large_calls`` replaces ``calls`` for YOLOv3."""

    models: tuple = ("tiny", "yolov3")
    input_size: int = 416
    batch_sizes: tuple = (1, 8)
    threads: tuple = (1, 0)
    engines: tuple = ENGINES
    calls: int = 40
    large_calls: int = 8
    warmup: int = 2
    weights: str = None
    records: str = None
    image_hw: tuple = (576, 768)
    score_threshold: float = 0.3
    seed: int = 0
    work_dir: str = None


def _images(config, count):
    from yolo3.data.synthetic import make_image  # noqa: PLC0415

    rng = np.random.default_rng(config.seed)
    return [
        np.asarray(make_image(rng, config.image_hw, max_objects=6, min_side=40, max_side=200)[0])
        for _ in range(count)
    ]


def _untrained_weights(model_type, input_size, path, seed, image):
    """A model of random weights whose heads give a handful of boxes per image.

    Each head's kernel is scaled so that its outputs on ``image`` (a letterboxed uint8
    input) spread with a standard deviation of 1.5, and the biases leave objectness even
    and class logits at -5.5: a few (box, class) pairs in a thousand pass a 0.3 score.
    """
    import keras  # noqa: PLC0415

    from yolo3.checkpoint import weights as weights_io  # noqa: PLC0415
    from yolo3.model.head import HeadSpec  # noqa: PLC0415
    from yolo3.model.network import build_head_model, head_layer_names  # noqa: PLC0415

    num_anchors = 9 if model_type == "yolov3" else 6
    head = HeadSpec(
        anchors=[[10 * (i + 1), 13 * (i + 1)] for i in range(num_anchors)],
        class_names=[f"class_{i}" for i in range(NUM_CLASSES_UNTRAINED)],
        model_type=model_type,
        input_hw=input_size,
    )
    keras.utils.set_random_seed(seed)
    model = build_head_model(head)
    depth = 5 + NUM_CLASSES_UNTRAINED
    outputs = model(np.asarray(image, np.float32)[np.newaxis] / 255.0)
    for name, output in zip(head_layer_names(model_type), outputs, strict=True):
        layer = model.get_layer(name)
        kernel, bias = layer.get_weights()
        spread = float(np.std(np.asarray(output) - bias))
        bias = np.zeros((3, depth), np.float32)
        bias[:, 5:] = -5.5
        layer.set_weights([kernel * (1.5 / max(spread, 1e-6)), bias.reshape(-1)])
    weights_io.save_weights(model, path, metadata=head.to_metadata())


def prepare(model_type, config, directory, score_threshold, engines):
    """Writes the weights, every artifact and the Darknet pair under ``directory``.

    Returns:
        ``{engine: path}`` (``opencv``: ``(cfg, weights)``), the export seconds per engine,
        and the :class:`yolo3.inference.detector_spec.DetectorSpec` as JSON.
    """
    from yolo3.checkpoint import darknet_writer  # noqa: PLC0415
    from yolo3.data.image import letterbox_image  # noqa: PLC0415
    from yolo3.inference.detector_spec import load_keras_model, spec_for_weights  # noqa: PLC0415
    from yolo3.inference.export import calibration_images, export_detector  # noqa: PLC0415

    os.makedirs(directory, exist_ok=True)
    weights = config.weights if model_type == "tiny" and config.weights else None
    if weights is None:
        weights = os.path.join(directory, f"{model_type}.weights.h5")
        image = letterbox_image(_images(config, 1)[0], (config.input_size, config.input_size))
        _untrained_weights(model_type, config.input_size, weights, config.seed, image)
    # Plain NMS everywhere: OpenCV's has no box merging, and every engine does the same work.
    spec = spec_for_weights(
        weights, input_size=config.input_size, score_threshold=score_threshold, box_merge=False
    )
    model = load_keras_model(weights, spec)
    paths, seconds = {"keras": weights}, {}
    for engine in engines:
        start = time.perf_counter()
        if engine in ("saved_model", "onnx"):
            suffix = "" if engine == "saved_model" else ".onnx"
            paths[engine] = os.path.join(directory, f"{model_type}-{engine}{suffix}")
            export_detector(model, spec, paths[engine], engine=engine)
        elif engine in TFLITE_QUANTIZE:
            quantize = TFLITE_QUANTIZE[engine]
            calibration = None
            if quantize == "int8" and config.records:
                calibration = calibration_images(
                    config.records, spec.head.input_hw, CALIBRATION_IMAGES
                )
            elif quantize == "int8":
                calibration = [
                    letterbox_image(im, spec.head.input_hw) for im in _images(config, 16)
                ]
            paths[engine] = os.path.join(directory, f"{model_type}-{engine}.tflite")
            export_detector(
                model,
                spec,
                paths[engine],
                engine="tflite",
                quantize=quantize,
                calibration_images=calibration,
            )
        elif engine == "opencv":
            cfg = os.path.join(directory, f"{model_type}.cfg")
            darknet_weights = os.path.join(directory, f"{model_type}.weights")
            darknet_writer.write_darknet(model, cfg, darknet_weights, spec.head)
            _set_opencv_threshold(cfg, score_threshold)
            paths[engine] = (cfg, darknet_weights)
        else:
            continue
        seconds[engine] = time.perf_counter() - start
    return paths, seconds, spec.to_json()


def _set_opencv_threshold(cfg, score_threshold):
    """OpenCV zeroes [yolo] class scores below the section's ``thresh`` (0.2 unless set):
    set it to the score threshold every engine applies."""
    with open(cfg, encoding="utf-8") as f:
        text = f.read()
    text = text.replace("[yolo]\n", f"[yolo]\nthresh={score_threshold}\n")
    with open(cfg, "w", encoding="utf-8") as f:
        f.write(text)


class OpenCVDetector:
    """``detect(images)`` on ``cv2.dnn.readNetFromDarknet``, with this library's letterbox
    and the same thresholds, boxes mapped back to each image's pixels."""

    def __init__(self, cfg, weights, spec):
        import cv2  # noqa: PLC0415

        self.cv2 = cv2
        self.net = cv2.dnn.readNetFromDarknet(cfg, weights)
        self.net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
        self.net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
        self.names = self.net.getUnconnectedOutLayersNames()
        self.spec = spec
        self.class_names = list(spec.head.class_names)

    def detect(self, images):
        from yolo3.data.image import letterbox_geometry, letterbox_image  # noqa: PLC0415
        from yolo3.inference.detect import letterbox_batch  # noqa: PLC0415

        input_h, input_w = self.spec.head.input_hw
        inputs, sizes = letterbox_batch(images, lambda im: letterbox_image(im, (input_h, input_w)))
        blob = self.cv2.dnn.blobFromImages(
            list(inputs), 1 / 255.0, (input_w, input_h), swapRB=False, crop=False
        )
        self.net.setInput(blob)
        outputs = self.net.forward(self.names)
        # Each [yolo] output is (N * rows, 5 + C), or (rows, 5 + C) for one image.
        per_image = [np.reshape(out, (len(inputs), -1, out.shape[-1])) for out in outputs]
        rows = np.concatenate(per_image, axis=1)
        results = []
        for index, (height, width) in enumerate(sizes):
            scale_y, scale_x, offset_y, offset_x, _, _ = letterbox_geometry(
                (height, width), (input_h, input_w)
            )
            found = rows[index]
            centre = found[:, 0:2] * (input_w, input_h)
            size = found[:, 2:4] * (input_w, input_h)
            corners = np.concatenate([centre - size / 2, centre + size / 2], axis=1)
            corners = (corners - (offset_x, offset_y, offset_x, offset_y)) / (
                scale_x,
                scale_y,
                scale_x,
                scale_y,
            )
            corners = np.clip(corners, 0, (width, height, width, height))
            scores = found[:, 5:]
            box_index, class_ids = np.nonzero(scores > self.spec.score_threshold)
            pair_scores = scores[box_index, class_ids]
            boxes = corners[box_index]
            xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1)
            keep = self.cv2.dnn.NMSBoxesBatched(
                xywh.tolist(),
                pair_scores.tolist(),
                class_ids.tolist(),
                self.spec.score_threshold,
                self.spec.iou_threshold,
            )
            keep = np.asarray(keep, np.int64).reshape(-1)
            keep = keep[np.argsort(-pair_scores[keep], kind="stable")][: self.spec.max_detections]
            results.append(
                {
                    "boxes": boxes[keep].astype(np.float32),
                    "scores": pair_scores[keep].astype(np.float32),
                    "classes": class_ids[keep].astype(np.int32),
                    "labels": [self.class_names[c] for c in class_ids[keep]],
                }
            )
        return results


def open_detector(engine, path, spec_json, threads):
    """A detector for one engine on ``threads`` cores (None: all)."""
    from yolo3.inference.detector_spec import DetectorSpec  # noqa: PLC0415
    from yolo3.inference.runtime import load_detector  # noqa: PLC0415

    threads = threads or os.cpu_count()
    spec = DetectorSpec.from_json(spec_json)
    if engine == "opencv":
        import cv2  # noqa: PLC0415

        cv2.setNumThreads(threads)
        return OpenCVDetector(*path, spec)
    if engine == "keras":
        return load_detector(
            path,
            input_size=spec.head.input_hw,
            **spec.thresholds,
        )
    return load_detector(path, num_threads=threads)


def measure(engine, path, spec_json, cores, batch_sizes, calls, warmup, images):
    """Runs in a spawned process: latency of ``detect`` per batch size, and what it found."""
    detector = open_detector(engine, path, spec_json, cores)
    figures = {}
    for batch in batch_sizes:
        batch_images = images[:batch]
        for _ in range(warmup):
            found = detector.detect(batch_images)
        latencies = []
        cpu_start = time.process_time()
        for _ in range(calls):
            start = time.perf_counter()
            found = detector.detect(batch_images)
            latencies.append(time.perf_counter() - start)
        cpu = time.process_time() - cpu_start
        median = statistics.median(latencies)
        figures[batch] = {
            "median_ms": 1000 * median,
            "p90_ms": 1000 * float(np.percentile(latencies, 90)),
            "images_per_second": batch / median,
            "cpu_ms_per_image": 1000 * cpu / (calls * batch),
            "detections": [
                {key: np.asarray(value).tolist() for key, value in result.items()}
                for result in found
            ],
        }
    return figures


def mean_ap(engine, path, spec_json, records):
    """Runs in a spawned process: mAP@0.5 of one engine on ``records``' validation split."""
    from yolo3.evaluation.validate import evaluate_detector  # noqa: PLC0415

    detector = open_detector(engine, path, spec_json, None)
    evaluation = evaluate_detector(detector, records, coco=False, gallery_size=0)
    return float(evaluation.voc.mean_ap)


def agreement(found, reference):
    """Fraction of ``reference`` detections that ``found`` matches with a detection of the
    same class at IoU >= 0.5; None when neither found anything (nothing to compare)."""
    from yolo3.evaluation.metrics import box_iou  # noqa: PLC0415

    matched = total = extra = 0
    for got, want in zip(found, reference, strict=True):
        want_boxes = np.asarray(want["boxes"], np.float32).reshape(-1, 4)
        got_boxes = np.asarray(got["boxes"], np.float32).reshape(-1, 4)
        total += len(want_boxes)
        extra += len(got_boxes)
        if len(want_boxes) and len(got_boxes):
            iou = box_iou(want_boxes, got_boxes)
            same = np.asarray(want["classes"])[:, None] == np.asarray(got["classes"])[None, :]
            matched += int(np.sum(np.max(np.where(same, iou, 0.0), axis=1) >= 0.5))
    if total == 0:
        return None if extra == 0 else 0.0
    return matched / total


def run_detect(config, *, command, log):
    """The benchmark: a JSON-able result for :func:`format_detect`."""
    from yolo3.evaluation.validate import MAP_SCORE_THRESHOLD  # noqa: PLC0415

    work_dir = config.work_dir or tempfile.mkdtemp(prefix="detect-benchmark-")
    result = {
        "command": command,
        "machine": machine_info(),
        "load_average_start": load_average(),
        "config": dataclasses.asdict(config),
        "rows": [],
        "map": [],
        "export_seconds": {},
    }
    images = _images(config, max(config.batch_sizes))
    for model_type in config.models:
        log(f"{model_type}: exporting {', '.join(config.engines)}")
        directory = os.path.join(work_dir, model_type)
        paths, seconds, spec_json = run_spawned(
            prepare,
            model_type=model_type,
            config=config,
            directory=directory,
            score_threshold=config.score_threshold,
            engines=config.engines,
        )
        result["export_seconds"][model_type] = seconds
        calls = config.large_calls if model_type == "yolov3" else config.calls
        for threads in config.threads:
            for engine in config.engines:
                figures = run_spawned(
                    measure,
                    threads=threads or None,
                    engine=engine,
                    path=paths[engine],
                    spec_json=spec_json,
                    cores=threads or None,
                    batch_sizes=config.batch_sizes,
                    calls=calls,
                    warmup=config.warmup,
                    images=images,
                )
                row = {
                    "model": model_type,
                    "engine": engine,
                    "threads": threads or os.cpu_count(),
                    "batches": {str(batch): figures[batch] for batch in config.batch_sizes},
                }
                result["rows"].append(row)
                log(
                    f"  {model_type} {engine} threads={row['threads']}: "
                    + ", ".join(
                        f"batch {b} {figures[b]['median_ms']:.1f} ms" for b in config.batch_sizes
                    )
                )
        if config.records and model_type == "tiny":
            log(f"{model_type}: mAP@0.5 of each engine on {config.records}")
            paths, _, spec_json = run_spawned(
                prepare,
                model_type=model_type,
                config=dataclasses.replace(config, input_size=_records_size(config.records)),
                directory=os.path.join(work_dir, f"{model_type}-map"),
                score_threshold=MAP_SCORE_THRESHOLD,
                engines=config.engines,
            )
            for engine in config.engines:
                value = run_spawned(
                    mean_ap,
                    engine=engine,
                    path=paths[engine],
                    spec_json=spec_json,
                    records=config.records,
                )
                result["map"].append({"model": model_type, "engine": engine, "map50": value})
                log(f"  {engine}: mAP@0.5 {value:.4f}")
    result["load_average_end"] = load_average()
    result["ratios"] = _ratios(result, config)
    return result


def _records_size(records_dir):
    from yolo3.data import records  # noqa: PLC0415

    return records.open_record_set(records_dir).input_hw[0]


def _ratios(result, config):
    """Goal lines: the fastest float32 artifact and int8 against OpenCV, int8 against
    TFLite float32, each engine's detections against Keras, and the mAP changes."""
    from benchmarks.harness import FRACTION, SPEEDUP, make_ratio  # noqa: PLC0415

    ratios = []
    rows = {(r["model"], r["engine"], r["threads"]): r for r in result["rows"]}
    for model_type in config.models:
        for threads in config.threads:
            cores = threads or os.cpu_count()
            for batch in config.batch_sizes:
                speed = {
                    engine: rows[(model_type, engine, cores)]["batches"][str(batch)][
                        "images_per_second"
                    ]
                    for engine in config.engines
                    if (model_type, engine, cores) in rows
                }
                where = f"{model_type}, batch {batch}, {cores} core(s)"
                if "opencv" not in speed:
                    continue
                headline = (model_type, batch, cores) == ("tiny", 1, 1)

                def add(label, faster, slower, goal=None, where=where, speed=speed):
                    value = speed[faster] / speed[slower]
                    ratios.append(make_ratio(f"{label}, {where}", value, None, goal, SPEEDUP))

                artifacts = [e for e in FLOAT32_ENGINES if e in speed and e != "keras"]
                if artifacts:
                    best = max(artifacts, key=speed.get)
                    label = f"fastest float32 artifact ({best}) / OpenCV dnn"
                    add(label, best, "opencv", 1.0 if headline else None)
                if "keras" in speed:
                    add("Keras Detector / OpenCV dnn", "keras", "opencv")
                if "tflite-int8" in speed:
                    add(
                        "TFLite int8 / OpenCV dnn",
                        "tflite-int8",
                        "opencv",
                        3.0 if headline else None,
                    )
                    if "tflite" in speed:
                        add("TFLite int8 / TFLite float32", "tflite-int8", "tflite")
        cores = config.threads[0] or os.cpu_count()
        batch = str(max(config.batch_sizes))
        reference = rows.get((model_type, "keras", cores))
        if reference:
            for engine in config.engines:
                if engine == "keras" or (model_type, engine, cores) not in rows:
                    continue
                value = agreement(
                    rows[(model_type, engine, cores)]["batches"][batch]["detections"],
                    reference["batches"][batch]["detections"],
                )
                if value is None:
                    log_none = f"{model_type} {engine}: no detections by either, nothing to match"
                    ratios.append(make_ratio(log_none, float("nan"), None, None, FRACTION))
                    continue
                goal = 1.0 if engine in FLOAT32_ENGINES + ("opencv",) else None
                ratios.append(
                    make_ratio(
                        f"{model_type} {engine}: Keras detections matched (batch {batch})",
                        value,
                        None,
                        goal,
                        FRACTION,
                    )
                )
    maps = {(m["model"], m["engine"]): m["map50"] for m in result["map"]}
    for (model_type, engine), value in maps.items():
        if engine == "keras" or (model_type, "keras") not in maps:
            continue
        drop = maps[(model_type, "keras")] - value
        goal = 0.02 if engine == "tflite-int8" else None
        ratios.append(
            make_ratio(
                f"{model_type} {engine}: mAP@0.5 drop from Keras", drop, None, goal, "overhead"
            )
        )
    return ratios


def format_detect(result):
    """The result as text: one table per model (latency and images/s per batch size)."""
    from benchmarks.harness import format_load  # noqa: PLC0415

    config = result["config"]
    batches = [str(b) for b in config["batch_sizes"]]
    lines = [
        f"command: {result['command']}",
        f"machine: {result['machine']['cores']} cores, {result['machine']['cpu']}",
        f"load average: {format_load(result['load_average_start'])} at the start, "
        f"{format_load(result['load_average_end'])} at the end",
        f"images: {config['image_hw'][1]}x{config['image_hw'][0]}, input "
        f"{config['input_size']}, score > {config['score_threshold']}; detect() end to end "
        f"(letterbox, network, decode, NMS)",
        "",
    ]
    header = (
        "| model | engine | cores | "
        + " | ".join(f"batch {b}: median ms | p90 ms | images/s" for b in batches)
        + " |"
    )
    lines += [header, "|" + " --- |" * (3 + 3 * len(batches))]
    for row in result["rows"]:
        cells = []
        for batch in batches:
            figures = row["batches"][batch]
            cells += [
                f"{figures['median_ms']:.1f}",
                f"{figures['p90_ms']:.1f}",
                f"{figures['images_per_second']:.1f}",
            ]
        lines.append(
            f"| {row['model']} | {row['engine']} | {row['threads']} | " + " | ".join(cells) + " |"
        )
    if result["map"]:
        lines += ["", "| model | engine | mAP@0.5 |", "| --- | --- | --- |"]
        lines += [f"| {m['model']} | {m['engine']} | {m['map50']:.4f} |" for m in result["map"]]
    lines += [
        "",
        "export seconds: "
        + "; ".join(
            f"{model}: " + ", ".join(f"{e} {v:.1f}" for e, v in seconds.items())
            for model, seconds in result["export_seconds"].items()
        ),
        "",
    ]
    for ratio in result["ratios"]:
        verdict = (
            ""
            if ratio["passed"] is None
            else (" (goal met)" if ratio["passed"] else " (goal missed)")
        )
        goal = "" if ratio["goal"] is None else f", goal {ratio['goal']:g}"
        value = f"{ratio['value']:.2f}" + ("x" if ratio["kind"] == "speedup" else "")
        lines.append(f"{ratio['label']}: {value}{goal}{verdict}")
    return "\n".join(lines)
