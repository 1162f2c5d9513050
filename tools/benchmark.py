"""Benchmarks of the training input and the training step, one subcommand each.

    python tools/benchmark.py io [--images 200] [--repeats 3] [--json io.json]
    python tools/benchmark.py train [--model-type tiny|yolov3] [--input-size 416] [--batch-size 8]
        [--precisions float32 bfloat16] [--xla off on] [--remat off full]
    python tools/benchmark.py scaling [--input-size 128] [--batch-size 8] [--sync-bn auto]
        [--link 100mbit] [--settings 1:float32 8:bfloat16 1:float32:powersgd4 1:bfloat16:local16]
    python tools/benchmark.py detect [--model-types tiny yolov3] [--weights W --records R]
    python tools/benchmark.py predict --collectives 3:1 [--json prediction.json]
    python tools/benchmark.py recipe --settings 'recipe=' 'yolov3=--iou-loss mse --iou-thresh 1'
        --cores 0 1
    python tools/benchmark.py matrix --input-sizes 96 128 192 256 --train-images 1000 4000
        --sides ours peer [ours-at-peer-time] --cores 0 1
    python tools/benchmark.py accuracy --settings 'sync=' 'local32=--local-steps 32'
        [--replicas 2] [--seeds 0 1 2 3] [--link 100mbit] --cores 0 1
    python tools/benchmark.py soak [--epochs 1000] [--flags='--map-every 10'] [--json soak.json]

``io`` (:mod:`benchmarks.io_pipeline`): images/s of the original keras-yolo3 on-the-fly input
against the record-set pipeline as training reads it (uint8 images and boxes; targets are
built in the train step), per core and on all cores, next to the same pipeline building
targets in ``tf.data``, the JPEG-decode ceiling and the offline preprocessing throughput.
About a minute on 2 cores.

``train`` (:mod:`benchmarks.train_step`): images/s of the full training step (targets built
in the step, loss, gradients, update) against the bare network with a trivial loss, on one
in-memory batch; the overhead of targets and loss. The full step again in each of
``--precisions`` with XLA off and on (``--xla``), with the model TFLOP/s achieved (FLOPs
counted from the convolutions) and the MFU where the peak is known, and its peak memory
for each ``--remat`` setting, one process each.

``scaling`` (:mod:`benchmarks.scaling`): images/s of the training step in one process
against two MultiWorkerMirroredStrategy workers on 127.0.0.1, every process pinned to one
core with one thread; the scaling efficiency. ``--link RATE`` runs every process in a
private network namespace whose loopback is rate-limited with tc (root and iproute2;
exit status 2 without them); ``--settings K:DTYPE[:powersgdR|:localH|:overlapH] ...``
compares micro-batches per step, all-reduce dtypes, PowerSGD compression and local steps
(blocking or overlapped) side by side, with the bytes sent per step and the step time a
compute + bytes / rate model predicts. About 3 minutes on 2 cores
at 128 px.

``detect`` (:mod:`benchmarks.detect`): ``detect(images)`` end to end on the Keras model, each
exported artifact (SavedModel, ONNX, TFLite float32 / float16 / int8) and OpenCV dnn on the
same weights written in Darknet format, for tiny and YOLOv3, batch 1 and 8, one core and all
cores: median and p90 latency, images/s, ratios against OpenCV, and with ``--records`` each
engine's mAP@0.5.

``predict`` (:mod:`benchmarks.prediction`): no measurement: the scaling benchmark's link
model applied to W = 16, 64 and 256 GPU machines, each with its own link, for tiny and
YOLOv3 at 416 px, four link rates and two round-trip times, every communication setting
and the best of each cell, from an assumed GPU step time (named in the output) and the
collectives per step the scaling benchmark counted (``--collectives``). Seconds.

``recipe`` (:mod:`benchmarks.recipe`): COCO AP, AP50, AP75 and VOC mAP@0.5 of the demo's
recipe with each setting's ``yolo3 train`` flags, each seed a run of its own pinned to one
of ``--cores``, scored on the original validation images; the mean and half-range over the
seeds. About 5 minutes a run on one idle core at the demo's defaults.

``matrix`` (:mod:`benchmarks.matrix`): the recipe beyond the demo's task: COCO AP of ``yolo3
train`` and of Ultralytics' YOLOv3-tiny (in its own environment,
``benchmarks/make_peer_env.sh``) over input sizes and training-set sizes, each seed a run
pinned to one of ``--cores``, at equal epochs, and (``--sides ours-at-peer-time``) ours at
the peer's wall time. Results kept in ``WORK/matrix.json``; run again, only the missing
runs are made (``--rescore``: none; the runs kept are scored again).

``accuracy`` (:mod:`benchmarks.accuracy`): time to accuracy. Each setting trains the demo's
task with ``--replicas`` replicas and the demo's global batch, once per seed, scoring
mAP@0.5 at every epoch end (off the clock), beside one worker alone: the final mAP@0.5 and
COCO AP against the reference setting's (paired by seed, with standard errors), and the
wall time until the mAP first reaches the target (the reference's less ``--margin``).
Without ``--link`` the replicas share one process and one core (mAP only; about 10 minutes
a run); with ``--link RATE`` they are worker processes over the shaped loopback, one run at
a time.

``soak`` (:mod:`benchmarks.soak`): leaks over long runs. ``yolo3 train`` with its defaults
trains ``--epochs`` one-step epochs of tiny-YOLOv3 on a tiny generated record set while its
RSS, open files and threads are read from ``/proc`` at each epoch's end; a line fitted to
the RSS over the second half gives MB per 100 epochs (goal: under 1), beside the log
folder's growth by kind (only ``history.jsonl`` and event files may grow). About 1 s an
epoch on 2 cores: 1000 epochs in 17 minutes.

Wall-clock figures need an otherwise idle machine; each row also gives the CPU time per
image, which load from other processes disturbs much less.

Each subcommand is a ``_add_<name>(subparsers)`` function that registers its parser and
sets ``handler`` to a function taking the parsed arguments and returning the exit status.

Exit status: 0 on success, 1 when a benchmark process failed, 2 on bad usage.
"""

import argparse
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from yolo3.cli import (  # noqa: E402
    ArgumentParser,
    add_model_type_argument,
    dataclass_from_args,
    start_tensorflow,
)

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back


def _size(text):
    parts = text.lower().split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: use HEIGHTxWIDTH, e.g. 480x640") from None
    if len(sizes) != 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: use HEIGHTxWIDTH, e.g. 480x640")
    return tuple(sizes)


def _measure(run, describe, config, args):
    """Runs one benchmark, ``run(config, ...)``, and prints ``describe(result)``; with
    ``--json`` also writes the result there. Returns the exit status."""
    result = run(config, command=args.command, log=_log)
    print()
    print(describe(result))
    if args.json:
        from yolo3 import fileio  # noqa: PLC0415

        fileio.write_json(args.json, result)
        print(f"\nfigures written to {args.json}")
    return 0


def _log(text):
    print(text, flush=True)


def _run_io(args):
    from benchmarks.io_pipeline import IOConfig, format_io, run_io  # noqa: PLC0415
    from yolo3.model.resources import read_anchors  # noqa: PLC0415

    anchors = read_anchors(args.anchors)
    config = dataclass_from_args(
        IOConfig, args, anchors=tuple(map(tuple, anchors.tolist())), image_hw=args.image_size
    )
    return _measure(run_io, format_io, config, args)


def _add_io(subparsers):
    parser = subparsers.add_parser(
        "io",
        help="original on-the-fly input vs the record-set pipeline, images/s per core",
        description="Images/s of (a) the original keras-yolo3 input, (b) the record-set "
        "pipeline, (c) plain JPEG decoding, and of offline preprocessing.",
    )
    parser.add_argument("--images", type=int, default=200, help="generated source images")
    parser.add_argument(
        "--image-size", type=_size, default=(480, 640), help="source HEIGHTxWIDTH (480x640)"
    )
    parser.add_argument("--input-size", type=int, default=416, help="training size (416)")
    parser.add_argument("--num-classes", type=int, default=80, help="classes in the targets")
    parser.add_argument(
        "--anchors",
        default=str(ROOT / "model_data" / "yolo_anchors.txt"),
        help="anchors file, 9 pairs",
    )
    parser.add_argument("--copies", type=int, default=2, help="augmented copies per image")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--batches", type=int, default=20, help="timed batches of (b) and (c) per repeat"
    )
    parser.add_argument(
        "--original-images",
        type=int,
        default=64,
        help="timed images of (a) per repeat, rounded up to whole batches",
    )
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each measurement")
    parser.add_argument(
        "--workers-list",
        type=int,
        nargs="+",
        default=[1, 2],
        help="preprocessing worker counts to time",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="keep the generated files here (default: a temp dir)")
    parser.add_argument("--json", metavar="PATH", help="also save the figures as JSON")
    parser.set_defaults(handler=_run_io)


def _default_anchors(model):
    name = "yolo_anchors.txt" if model == "yolov3" else "tiny_yolo_anchors.txt"
    return str(ROOT / "model_data" / name)


def _step_config(args, **extra):
    """The :class:`benchmarks.train_step.TrainStepConfig` of the parsed flags: the shared
    model flags, a subcommand's own step flags where it has them, and ``extra``."""
    from benchmarks.train_step import TrainStepConfig  # noqa: PLC0415
    from yolo3.model.resources import read_anchors  # noqa: PLC0415

    anchors = read_anchors(args.anchors or _default_anchors(args.model_type))
    return dataclass_from_args(
        TrainStepConfig,
        args,
        anchors=tuple(map(tuple, anchors.tolist())),
        model=args.model_type,
        **extra,
    )


def _run_train(args):
    from benchmarks.train_step import (  # noqa: PLC0415
        default_precisions,
        format_train,
        run_train,
    )
    from yolo3.distributed.devices import describe_gpus  # noqa: PLC0415

    config = _step_config(
        args, precisions=tuple(args.precisions or default_precisions(describe_gpus()))
    )
    return _measure(run_train, format_train, config, args)


def _add_model_flags(parser, *, input_size, steps, warmup_steps, repeats):
    from yolo3.model.network import MODEL_TYPES  # noqa: PLC0415

    add_model_type_argument(parser, default="tiny", help="the network to measure")
    # --model: the spelling of earlier releases, kept working for a release, out of --help.
    parser.add_argument("--model", dest="model_type", choices=MODEL_TYPES, help=argparse.SUPPRESS)
    parser.add_argument(
        "--anchors", help="anchors file (default: model_data's file for --model-type)"
    )
    parser.add_argument(
        "--input-size", type=int, default=input_size, help=f"square input ({input_size})"
    )
    parser.add_argument("--batch-size", type=int, default=8, help="images per step (8)")
    parser.add_argument("--num-classes", type=int, default=80)
    parser.add_argument("--steps", type=int, default=steps, help="timed steps per repeat")
    parser.add_argument(
        "--warmup-steps", type=int, default=warmup_steps, help="untimed steps first"
    )
    parser.add_argument(
        "--repeats", type=int, default=repeats, help="repeats: rounds (train), windows (scaling)"
    )
    parser.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    parser.add_argument(
        "--jit-compile", choices=("auto", "on", "off"), default="auto", help="XLA, as train.py"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also save the figures as JSON")


def _add_train(subparsers):
    parser = subparsers.add_parser(
        "train",
        help="full train step (targets + loss) vs the bare network; precisions, XLA, "
        "FLOP/s and peak memory",
        description="Images/s of YoloTrainer's train step (targets built in the step, "
        "yolo_loss, gradients, update) against the bare network with a trivial loss, on "
        "one in-memory batch; prints the overhead of targets + loss, the step in each "
        "precision with and without XLA (model TFLOP/s and MFU), and its peak memory per "
        "remat setting.",
    )
    _add_model_flags(parser, input_size=416, steps=1, warmup_steps=2, repeats=15)
    parser.add_argument(
        "--max-boxes", type=int, default=100, help="padded box rows per image (100)"
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=("float32", "bfloat16", "float16"),
        help="precisions of the (a) variants, each timed with every --xla setting; bfloat16 "
        "and float16 are Keras's mixed policies (default: float32 bfloat16, and float16 too "
        "when a GPU is visible: the CPU has no fast float16 kernels)",
    )
    parser.add_argument(
        "--xla",
        nargs="+",
        choices=("off", "on"),
        default=["off", "on"],
        help="jit_compile settings of the (a) variants (default: off on)",
    )
    parser.add_argument(
        "--remat",
        nargs="+",
        choices=("off", "full", "large"),
        default=["off"],
        help="train.py --remat settings; each trains (a) in a process of its own for its peak "
        "memory (default: off)",
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        help="the device's peak TFLOP/s, for the MFU of every row (default: the GPU's data "
        "sheet figure where yolo3.distributed.devices knows it; no MFU on the CPU)",
    )
    parser.set_defaults(handler=_run_train)


def _run_scaling(args):
    from benchmarks.scaling import ScalingConfig, format_scaling, run_scaling  # noqa: PLC0415

    config = dataclass_from_args(ScalingConfig, args, step=_step_config(args))
    return _measure(run_scaling, format_scaling, config, args)


def _add_scaling(subparsers):
    from yolo3.cli import argument_type  # noqa: PLC0415

    parser = subparsers.add_parser(
        "scaling",
        help="1 training process vs 2 workers on 127.0.0.1, one core each",
        description="Images/s of the real training step in one process against "
        "MultiWorkerMirroredStrategy workers on 127.0.0.1, every process pinned to one "
        "core with one thread, the same batch per process; prints the scaling efficiency.",
    )
    _add_model_flags(parser, input_size=128, steps=20, warmup_steps=5, repeats=3)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--rounds", type=int, default=1, help="1 process, then workers, N times")
    parser.add_argument(
        "--sync-bn",
        choices=("auto", "on", "off"),
        default="auto",
        help="synchronized batch norm (auto: on with more than one replica, as train.py)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds for one run, start-up included"
    )
    parser.add_argument(
        "--link",
        type=argument_type(_link_rate),
        default="none",
        metavar="RATE",
        help="limit the loopback to a tc rate (100mbit, 1gbit, ...) in a private network "
        "namespace; none: the machine's own loopback",
    )
    parser.add_argument(
        "--rtt",
        type=argument_type(_round_trip),
        default="none",
        metavar="TIME",
        help="round-trip time between the workers (25ms, 0.1ms, ...): every byte passes a "
        "delay line of half of it each way; none: the loopback's own",
    )
    parser.add_argument(
        "--straggler",
        type=float,
        default=0.0,
        metavar="CORES",
        help="limit the last worker to this share of a core (0.5: half) with a cgroup the "
        "run makes and removes; the one process and the independent ones run unlimited "
        "(0: none)",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        type=argument_type(_setting),
        default=[(1, "float32", 0, 0, False)],
        metavar="K:DTYPE[:powersgdR|:localH|:overlapH[/T]]",
        help="worker runs to compare: K micro-batches per optimizer step (--accumulate), "
        "the all-reduce dtype (float32, bfloat16, float16) and optionally PowerSGD of rank R "
        "(--compress powersgd --rank R) or H local steps between synchronisations "
        "(--local-steps H, plain averaging; --steps must be a multiple of H), overlapH "
        "with --overlap-sync T (default H); default 1:float32",
    )
    parser.set_defaults(handler=_run_scaling)


def _link_rate(text):
    from benchmarks.link import parse_rate  # noqa: PLC0415

    parse_rate(text)
    return text.strip().lower()


def _round_trip(text):
    from benchmarks.link import parse_rtt  # noqa: PLC0415

    parse_rtt(text)
    return text.strip().lower()


def _setting(text):
    from yolo3.comm.allreduce import check_allreduce_dtype  # noqa: PLC0415

    accumulate, _, rest = text.partition(":")
    dtype, _, method = rest.partition(":")
    if not accumulate.isdigit() or int(accumulate) < 1:
        raise ValueError(f"{text!r}: use K:DTYPE, K >= 1 micro-batches, e.g. 8:bfloat16")
    rank = local = 0
    overlap = 0
    for prefix in ("powersgd", "local", "overlap"):
        number, _, delay = method.removeprefix(prefix).partition("/")
        if not (method.startswith(prefix) and number.isdigit() and int(number) >= 1):
            continue
        if prefix == "powersgd" and not delay:
            rank = int(number)
        elif prefix == "local" and not delay:
            local = int(number)
        elif prefix == "overlap" and (
            not delay or (delay.isdigit() and 1 <= int(delay) <= int(number))
        ):
            local, overlap = int(number), int(delay or number)
    if method and not (rank or local):
        raise ValueError(
            f"{text!r}: the third part is powersgdR (PowerSGD of rank R >= 1), localH "
            "(H >= 1 local steps between synchronisations) or overlapH[/T] (the same, each "
            "synchronisation sent during the next H steps), e.g. 1:float32:powersgd4"
        )
    dtype = check_allreduce_dtype(dtype or "float32", local_steps=bool(local))
    return int(accumulate), dtype, rank, local, overlap


def _run_detect(args):
    from benchmarks.detect import DetectConfig, format_detect, run_detect  # noqa: PLC0415

    config = dataclass_from_args(DetectConfig, args, models=tuple(args.model_types))
    return _measure(run_detect, format_detect, config, args)


def _add_detect(subparsers):
    from benchmarks.detect import ENGINES  # noqa: PLC0415

    parser = subparsers.add_parser(
        "detect",
        help="inference end to end on every engine against OpenCV dnn",
        description="detect() end to end (letterbox, network, decode, NMS) on Keras, each "
        "exported artifact and OpenCV dnn on the same weights in Darknet format.",
    )
    from yolo3.model.network import MODEL_TYPES  # noqa: PLC0415

    parser.add_argument("--model-types", nargs="+", choices=MODEL_TYPES, default=["tiny", "yolov3"])
    # --models: the spelling of earlier releases, kept working for a release, out of --help.
    parser.add_argument(
        "--models", nargs="+", dest="model_types", choices=MODEL_TYPES, help=argparse.SUPPRESS
    )
    parser.add_argument("--input-size", type=int, default=416)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 0], help="cores per measurement; 0 = all"
    )
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--calls", type=int, default=40, help="timed calls per batch size")
    parser.add_argument("--large-calls", type=int, default=8, help="--calls for YOLOv3")
    parser.add_argument(
        "--weights",
        help="trained tiny weights with metadata (default: random weights; YOLOv3 always)",
    )
    parser.add_argument(
        "--records", help="record set: each engine's mAP@0.5 on its validation split"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="where artifacts go (default: a temporary folder)")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    parser.set_defaults(handler=_run_detect)


def _run_predict(args):
    from benchmarks.prediction import format_prediction, predict  # noqa: PLC0415

    def run(collectives, *, command, log):
        del log
        return {"command": command, **predict(collectives)}

    return _measure(run, format_prediction, args.collectives, args)


def _collective_counts(text):
    plain, _, local = text.partition(":")
    if not (plain.isdigit() and local.isdigit() and int(plain) >= 1 and int(local) >= 1):
        raise ValueError(
            f"--collectives {text!r}: give N:M, the collectives of a plain all-reduce step "
            "and of a local step, as the scaling benchmark's 'collectives' column counts them"
        )
    return {"all_reduce": int(plain), "local": int(local)}


def _add_predict(subparsers):
    from yolo3.cli import argument_type  # noqa: PLC0415

    parser = subparsers.add_parser(
        "predict",
        help="the link model's efficiency at 16-256 GPU workers (no measurement)",
        description="Predicted scaling efficiency for tiny and YOLOv3 at W = 16, 64, 256 "
        "workers over 100 Mbit/s to 100 Gbit/s links, 25 ms and 0.1 ms round trips, every "
        "communication setting, from the link model the scaling benchmark checks.",
    )
    parser.add_argument(
        "--collectives",
        type=argument_type(_collective_counts),
        required=True,
        metavar="N:M",
        help="collectives in a plain all-reduce step and in a local step (the scaling "
        "benchmark's 'collectives' column)",
    )
    parser.add_argument("--json", metavar="PATH", help="also save the table as JSON")
    parser.set_defaults(handler=_run_predict)


def _run_recipe(args):
    from benchmarks.recipe import RecipeConfig, format_recipe, run_recipe  # noqa: PLC0415

    config = dataclass_from_args(RecipeConfig, args)
    return _measure(run_recipe, format_recipe, config, args)


def _add_recipe(subparsers):
    from benchmarks.recipe import parse_setting  # noqa: PLC0415
    from yolo3.cli import argument_type  # noqa: PLC0415

    parser = subparsers.add_parser(
        "recipe",
        help="COCO AP of training settings on the demo's task, seeds side by side",
        description="Trains the demo's recipe plus each setting's flags, once per seed, "
        "one process per core, and scores each run's last weights on the original "
        "validation images (COCO AP, AP50, AP75, VOC mAP@0.5).",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        type=argument_type(parse_setting),
        default=[("recipe", ())],
        metavar="NAME=FLAGS",
        help="settings to compare, each a name and the yolo3 train flags it adds (quote "
        "it: 'ciou=--iou-loss ciou'); default: the demo's recipe alone",
    )
    _add_demo_task_flags(parser, work="recipe_runs", seeds=[0, 1])
    parser.set_defaults(handler=_run_recipe)


def _run_matrix(args):
    from benchmarks.matrix import MatrixConfig, format_matrix, run_matrix  # noqa: PLC0415

    config = dataclass_from_args(MatrixConfig, args, flags=tuple(args.flags.split()))
    return _measure(run_matrix, format_matrix, config, args)


def _add_matrix(subparsers):
    from benchmarks.matrix import SIDES, MatrixConfig  # noqa: PLC0415

    defaults = MatrixConfig(work="matrix_runs")
    parser = subparsers.add_parser(
        "matrix",
        help="COCO AP of the recipe and of Ultralytics' YOLOv3-tiny over sizes and seeds",
        description="Trains the demo's task made at each input size with each count of "
        "training images, ours and the peer's, once per seed, one process per core, and "
        "scores every run's last weights on the original validation images.",
    )
    parser.add_argument("--work", default=defaults.work, help="folder for data, runs, results")
    parser.add_argument("--input-sizes", type=int, nargs="+", default=defaults.input_sizes)
    parser.add_argument("--train-images", type=int, nargs="+", default=defaults.train_images)
    parser.add_argument("--val-images", type=int, default=defaults.val_images)
    parser.add_argument("--seeds", type=int, nargs="+", default=defaults.seeds)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=defaults.sides)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument(
        "--flags",
        default="",
        metavar="FLAGS",
        help="yolo3 train flags added to our recipe, one quoted string (--flags='--mosaic 0')",
    )
    parser.add_argument(
        "--cores", type=int, nargs="+", default=defaults.cores, help="cores, one run each"
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="train nothing: score the runs WORK/matrix.json holds again, from their folders "
        "(after a change to the scoring)",
    )
    parser.add_argument("--json", metavar="PATH", help="also save the figures as JSON")
    parser.set_defaults(handler=_run_matrix)


def _add_demo_task_flags(parser, *, work, seeds, cores_help=""):
    """The flags of the benchmarks that train the demo's task: its data, seeds and cores."""
    parser.add_argument("--work", default=work, help="folder for data and runs")
    parser.add_argument("--seeds", type=int, nargs="+", default=seeds)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-images", type=int, default=4000)
    parser.add_argument("--val-images", type=int, default=300)
    parser.add_argument("--input-size", type=int, default=96)
    parser.add_argument(
        "--cores",
        type=int,
        nargs="+",
        default=[0],
        help="cores to run on, one run each at a time (e.g. 0 1)" + cores_help,
    )
    parser.add_argument("--json", metavar="PATH", help="also save the figures as JSON")


def _run_accuracy(args):
    from benchmarks.accuracy import AccuracyConfig, format_accuracy, run_accuracy  # noqa: PLC0415

    config = dataclass_from_args(AccuracyConfig, args, alone=not args.no_alone)
    return _measure(run_accuracy, format_accuracy, config, args)


def _add_accuracy(subparsers):
    from benchmarks.recipe import parse_setting  # noqa: PLC0415
    from yolo3.cli import argument_type  # noqa: PLC0415

    parser = subparsers.add_parser(
        "accuracy",
        help="time to accuracy: mAP against wall time of settings with W replicas",
        description="Trains the demo's recipe plus each setting's flags with W replicas "
        "and the demo's global batch, once per seed, scoring mAP@0.5 at every epoch end "
        "(the scoring off the clock), beside one worker alone; reports each setting's final "
        "mAP and COCO AP against the reference's (paired by seed, with standard errors) and "
        "its wall time to the target.",
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        type=argument_type(parse_setting),
        required=True,
        metavar="NAME=FLAGS",
        help="settings to compare, each a name and the yolo3 train flags it adds (quote "
        "it: 'local32=--local-steps 32 --allreduce-dtype bfloat16'); sync= is synchronous "
        "training",
    )
    _add_demo_task_flags(
        parser,
        work="accuracy_runs",
        seeds=[0, 1, 2, 3],
        cores_help="; with --link the workers take cores 0 to W-1",
    )
    parser.add_argument(
        "--replicas", type=int, default=2, help="replicas (or workers with --link) per run (2)"
    )
    parser.add_argument(
        "--global-batch", type=int, default=16, help="images per step over all replicas (16)"
    )
    parser.add_argument(
        "--link",
        type=argument_type(_link_rate),
        default="none",
        metavar="RATE",
        help="run the replicas as worker processes (one core each) over a loopback limited "
        "to this tc rate in a private network namespace, one run at a time (one worker "
        "alone needs no link: its runs, side by side, serve every rate); none: replicas "
        "in one process on one core, runs side by side (mAP only: the clock is no link's)",
    )
    parser.add_argument(
        "--no-alone",
        action="store_true",
        help="do not train one worker alone (global batch on one core) beside the settings",
    )
    parser.add_argument(
        "--reference",
        metavar="NAME",
        help="the setting the others are compared with and whose mean final mAP less "
        "--margin is the target (default: the first; 'alone' is one worker alone)",
    )
    parser.add_argument("--margin", type=float, default=0.02, help="target below the reference")
    parser.add_argument("--target", type=float, help="the target mAP@0.5 itself")
    parser.set_defaults(handler=_run_accuracy)


def _run_soak(args):
    from benchmarks.soak import SoakConfig, format_soak, run_soak  # noqa: PLC0415

    config = dataclass_from_args(SoakConfig, args, flags=tuple(shlex.split(args.flags)))
    return _measure(run_soak, format_soak, config, args)


def _add_soak(subparsers):
    parser = subparsers.add_parser(
        "soak",
        help="RSS, open files and threads over many one-step epochs of yolo3 train",
        description="Trains tiny-YOLOv3 for --epochs one-step epochs with yolo3 train's "
        "defaults (validation, checkpoints and backups every epoch, history.jsonl, "
        "TensorBoard), sampling the process's RSS, open files and threads from /proc; fits "
        "a line to the RSS over the second half (MB per 100 epochs) and lists what the log "
        "folder grew by.",
    )
    parser.add_argument("--epochs", type=int, default=1000, help="one-step epochs (1000)")
    parser.add_argument(
        "--poll",
        type=float,
        default=0.05,
        help="seconds between looks for an epoch's end, where a sample is taken (0.05)",
    )
    parser.add_argument("--train-images", type=int, default=4, help="generated records (4)")
    parser.add_argument("--val-images", type=int, default=2, help="validation records (2)")
    parser.add_argument("--input-size", type=int, default=64, help="square input (64)")
    parser.add_argument("--batch-size", type=int, default=2, help="images per step (2)")
    parser.add_argument(
        "--flags",
        default="",
        metavar="FLAGS",
        help="yolo3 train flags added to the run, one quoted string (--flags='--map-every 10')",
    )
    parser.add_argument("--work", help="keep the records, log folder and log here")
    parser.add_argument("--timeout", type=float, help="seconds before the run is stopped")
    parser.add_argument("--json", metavar="PATH", help="also save the figures and samples")
    parser.set_defaults(handler=_run_soak)


def build_parser():
    parser = ArgumentParser(description="Benchmarks of the training input and step.")
    subparsers = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    _add_io(subparsers)
    _add_train(subparsers)
    _add_scaling(subparsers)
    _add_detect(subparsers)
    _add_predict(subparsers)
    _add_recipe(subparsers)
    _add_matrix(subparsers)
    _add_accuracy(subparsers)
    _add_soak(subparsers)
    return parser


def main(argv=None):
    from yolo3.cli import run_main  # noqa: PLC0415

    argv = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", "tools/benchmark.py", *argv])

    def body(args):
        args.command = command
        return args.handler(args)

    # benchmarks.link.LinkUnavailable is a ValueError: status 2, as bad usage.
    return run_main(build_parser(), argv, body, failures=(RuntimeError,))


if __name__ == "__main__":
    sys.exit(main())
