"""Ultralytics' YOLOv3-tiny trained from scratch with its own recipe, then its detections on our
validation images: the worker of :func:`benchmarks.peer.start_training`.

Runs in the peer environment (``.venv-ultralytics``: ``benchmarks/make_peer_env.sh``), never in
ours; imports nothing of ``yolo3``. Everything Ultralytics defaults to is its recipe and stays:
its augmentation (mosaic, HSV, flips, scale and translation), optimizer choice, warm-up and
schedule, loss, EMA, per-epoch validation and NMS IoU. Set here: the model (``yolov3-tiny.yaml``,
no pretrained weights), the data, image size, epochs, batch, seed, CPU with one thread, no
dataloader workers, deterministic algorithms, and no plots (they change nothing trained, and
would fetch a font).

Writes into ``--output``: Ultralytics' run folder ``train/`` (its ``results.csv``, ``args.yaml``
and ``weights/last.pt``), and ``detections.json``::

    {"train_seconds": 41.2, "epochs": 6, ...,
     "images": [{"path": "/abs/val/00000.png", "boxes": [[x_min, y_min, x_max, y_max], ...],
                 "scores": [...], "classes": [...]}, ...]}

boxes in the original image's pixels, one entry per line of ``--val-images``, in its order. The
detections are ``last.pt``'s, as the recipe scores ``last.weights.h5``: the weights training
ended with (Ultralytics' EMA, saved in half precision), not its ``best.pt``.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Before Ultralytics is imported: its import checks whether it is online.
os.environ.setdefault("YOLO_OFFLINE", "1")

import torch  # noqa: E402
import ultralytics  # noqa: E402
from ultralytics import YOLO  # noqa: E402

MODEL = "yolov3-tiny.yaml"


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="the data.yaml of benchmarks.peer")
    parser.add_argument("--val-images", required=True,
                        help="file of original validation image paths, one a line")  # fmt: skip
    parser.add_argument("--imgsz", type=int, required=True, help="training and predicting size")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="folder for train/ and detections.json")
    parser.add_argument("--conf", type=float, required=True,
                        help="lowest score kept (ours for scoring: 0.01)")  # fmt: skip
    parser.add_argument("--max-det", type=int, required=True,
                        help="most detections per image (ours for scoring: 100)")  # fmt: skip
    parser.add_argument("--time-seconds", type=float, default=None,
                        help="train this long instead (Ultralytics' time)")  # fmt: skip
    return parser


def one_thread(_):
    """Ultralytics' ``select_device`` sets torch's threads to ``min(8, cpus - 1)``, counting the
    machine's CPUs rather than the process's pinned core: set back to one after it."""
    torch.set_num_threads(1)


def train(args, output):
    """Trains; ``(seconds the train call took, epochs run, last.pt path, run folder)``."""
    model = YOLO(MODEL)
    model.add_callback("on_pretrain_routine_start", one_thread)
    options = {"time": args.time_seconds / 3600} if args.time_seconds else {}
    started = time.perf_counter()
    model.train(
        data=args.data, imgsz=args.imgsz, epochs=args.epochs, batch=args.batch, seed=args.seed,
        pretrained=False, device="cpu", workers=0, deterministic=True, plots=False,
        project=str(output), name="train", exist_ok=True, verbose=False, **options,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    trainer = model.trainer
    return seconds, trainer.epoch + 1, Path(trainer.last), Path(trainer.save_dir)


def detect(weights, paths, args):
    """Detections of ``weights`` on ``paths`` (original images, letterboxed by Ultralytics to
    ``--imgsz``), boxes mapped back to each image's pixels."""
    model = YOLO(str(weights))
    model.add_callback("on_predict_start", lambda _: torch.set_num_threads(1))
    images = []
    results = model.predict(
        source=paths, imgsz=args.imgsz, conf=args.conf, max_det=args.max_det, device="cpu",
        stream=True, verbose=False, save=False,
    )  # fmt: skip
    for path, result in zip(paths, results, strict=True):
        boxes = result.boxes
        images.append({
            "path": path,
            "boxes": boxes.xyxy.tolist(),
            "scores": boxes.conf.tolist(),
            "classes": [int(c) for c in boxes.cls.tolist()],
        })  # fmt: skip
    return images


def main(argv=None):
    args = build_parser().parse_args(argv)
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    output = Path(args.output).resolve()
    paths = [line for line in Path(args.val_images).read_text().splitlines() if line]
    seconds, epochs_run, last, run_dir = train(args, output)
    images = detect(last, paths, args)
    result = {
        "train_seconds": seconds,
        "epochs": epochs_run,
        "epochs_asked": args.epochs,
        "time_seconds": args.time_seconds,
        "model": MODEL,
        "imgsz": args.imgsz,
        "batch": args.batch,
        "seed": args.seed,
        "conf": args.conf,
        "max_det": args.max_det,
        "weights": str(last),
        "results_csv": str(run_dir / "results.csv"),
        "torch_threads": torch.get_num_threads(),
        "cores": sorted(os.sched_getaffinity(0)),
        "versions": {"ultralytics": ultralytics.__version__, "torch": torch.__version__},
        "images": images,
    }
    temp = output / "detections.json.tmp"
    temp.write_text(json.dumps(result) + "\n")
    os.replace(temp, output / "detections.json")  # never a half-written file
    print(f"trained {epochs_run} epochs in {seconds:.1f} s; {len(images)} images -> "
          f"{output / 'detections.json'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
