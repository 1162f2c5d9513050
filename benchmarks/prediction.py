"""What the link model predicts beyond this machine: W workers, each a GPU machine with a
link of its own.

:func:`predict` fills a table of predicted scaling efficiency (a step's computation over
its time with the communication) for tiny and the full YOLOv3, at W workers, link rates and
round-trip times, for each communication setting, and names the best setting of each cell.
It is the model :mod:`benchmarks.scaling` checks against measured runs
(:func:`benchmarks.scaling.predicted_seconds`, :func:`benchmarks.scaling.round_trips`) with
one difference: there every byte crosses one shared loopback (2 (W - 1) x a worker's
tensor), here each worker sends 2 (W - 1) / W of it over its own link, as on machines of
their own.

Inputs, and where each comes from:

- bytes per step and per synchronisation: counted here from the models' weights by the
  settings' own code (:meth:`yolo3.comm.schemes.Communication.bytes_per_step`);
- collectives per step: counted in the compiled step by the scaling benchmark (its JSON),
  PowerSGD's two rounds of factors added to the plain step's;
- a GPU's step time: assumed, from published figures (:data:`GPU_STEPS`), named there;
- 2 (W - 1) round trips per ring collective: the model, checked by the scaling benchmark at
  W = 2, 4 and 8 on 1 ms and 25 ms round trips.

    python tools/benchmark.py predict --json docs/data/prediction.json
"""

import dataclasses

from benchmarks.scaling import predicted_seconds, round_trips
from yolo3.comm.schemes import communication_from
from yolo3.model import network

# A GPU's training step, assumed: batch 16 per GPU, a training step taken as 3 x the
# forward pass (forward, and a backward of about twice its cost), the forward time from
# a published figure on a Titan X-class GPU (Pascal, 2016): a modern GPU is faster, which
# only makes the network weigh more (read such a GPU's cells at a proportionally slower link).
GPU_STEPS = {
    "yolov3": {
        "input_size": 416,
        "batch_size": 16,
        "forward_seconds": 0.029,
        "source": "YOLOv3-416: 29 ms per image (Redmon and Farhadi, YOLOv3: An Incremental "
        "Improvement, 2018, table 3)",
    },
    "tiny": {
        "input_size": 416,
        "batch_size": 16,
        "forward_seconds": 1 / 220,
        "source": "YOLOv3-tiny: 220 frames/s (the Darknet YOLO page's table of models)",
    },
}
TRAIN_OVER_FORWARD = 3
WORKERS = (16, 64, 256)
RATES = {"100 Mbit/s": 1e8, "1 Gbit/s": 1e9, "10 Gbit/s": 1e10, "100 Gbit/s": 1e11}
ROUND_TRIPS = {"25 ms": 0.025, "0.1 ms": 0.0001}
# (label, --settings entry as the scaling benchmark reads it: K, dtype, PowerSGD rank,
# local steps H, overlap T), simplest first: a tie goes to the earlier.
SETTINGS = (
    ("plain, float32", (1, "float32", 0, 0, 0)),
    ("plain, bfloat16", (1, "bfloat16", 0, 0, 0)),
    ("--accumulate 8, bfloat16", (8, "bfloat16", 0, 0, 0)),
    ("PowerSGD rank 4, bfloat16", (1, "bfloat16", 4, 0, 0)),
    ("--local-steps 64, bfloat16", (1, "bfloat16", 0, 64, 0)),
    ("--local-steps 64 --overlap-sync 16, bfloat16", (1, "bfloat16", 0, 64, 16)),
)
PERIODS = 100  # epochs of this many periods of local steps: the epoch end's cost is spread
# PowerSGD's step holds the plain step's collectives and two more: its P and its Q factors
# (yolo3.comm.powersgd.PowerSGDState.compress).
POWERSGD_ROUNDS = 2


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model's figures for the model: a GPU step and each setting's bytes."""

    name: str
    step_seconds: float
    bytes_per_step: dict  # setting label -> bytes a worker sends per step (average)
    source: str


def workload(model_type, num_classes=80):
    """The :class:`Workload` of ``model_type`` (its bytes counted from its weights)."""
    gpu = GPU_STEPS[model_type]
    body = network.build_model(model_type, num_classes, input_size=gpu["input_size"])
    sent = {}
    for label, (_, dtype, rank, local, overlap) in SETTINGS:
        scheme = communication_from(
            allreduce_dtype=dtype,
            compress="powersgd" if rank else "none",
            rank=rank or 4,
            local_steps=local or None,
            overlap_sync=overlap or None,
        )
        sent[label] = scheme.bytes_per_step(body)
    step = TRAIN_OVER_FORWARD * gpu["batch_size"] * gpu["forward_seconds"]
    return Workload(model_type, step, sent, gpu["source"])


def efficiency(load, label, *, workers, bits_per_second, rtt, collectives):
    """Predicted images/s of ``workers`` over ``workers`` x one GPU's, for setting ``label``.

    ``collectives``: those a step holds (for plain and accumulated all-reduce and PowerSGD:
    the step's; for local steps: the step's own, their synchronisation being one more).
    """
    accumulate, _, _, local, overlap = dict(SETTINGS)[label]
    compute = accumulate * load.step_seconds
    # Each worker sends and receives 2 (W - 1) / W of the tensor on its own link.
    share = 2 * (workers - 1) / workers
    latency = rtt * round_trips(workers, 1)
    if not local:
        link = 8 * share * load.bytes_per_step[label] / bits_per_second
        step, _ = predicted_seconds(
            steps=2, compute=compute, epoch_compute=compute, link=link + collectives * latency
        )
        return compute / step
    sync = 8 * share * load.bytes_per_step[label] * local / bits_per_second
    steps = PERIODS * local
    per_step = compute + collectives * latency  # the step's own small all-reduce
    _, epoch = predicted_seconds(
        steps=steps,
        compute=per_step,
        epoch_compute=per_step,
        link=sync,
        local_steps=local,
        overlap=overlap,
        latency=latency,
    )
    return steps * compute / epoch


def predict(collectives):
    """The table: for each model, link rate, round trip and W, every setting's predicted
    efficiency and the best (the first of the best within 0.005: the simplest).

    ``collectives``: ``{"all_reduce": n, "local": m}``, counted in compiled steps."""
    rows = []
    loads = {name: workload(name) for name in GPU_STEPS}
    for model_type, load in loads.items():
        for rate_name, bits in RATES.items():
            for rtt_name, rtt in ROUND_TRIPS.items():
                for workers in WORKERS:
                    cells = {}
                    for label, setting in SETTINGS:
                        count = collectives["local" if setting[3] else "all_reduce"]
                        count += POWERSGD_ROUNDS if setting[2] else 0
                        cells[label] = efficiency(
                            load, label, workers=workers, bits_per_second=bits, rtt=rtt,
                            collectives=count,
                        )  # fmt: skip
                    top = max(cells.values())
                    best = next(label for label in cells if cells[label] >= top - 0.005)
                    rows.append({
                        "model": model_type, "link": rate_name, "rtt": rtt_name,
                        "workers": workers, "efficiency": cells, "recommended": best,
                    })  # fmt: skip
    return {
        "rows": rows,
        "assumed": {
            name: {
                "step_seconds": load.step_seconds,
                "source": load.source,
                **{k: v for k, v in GPU_STEPS[name].items() if k != "source"},
            }
            for name, load in loads.items()
        },
        "bytes_per_step": {name: load.bytes_per_step for name, load in loads.items()},
        "collectives_per_step": collectives,
        "train_over_forward": TRAIN_OVER_FORWARD,
    }


def format_prediction(result):
    """The table as text: each model's best setting and its efficiency per cell."""
    lines = []
    for name, assumed in result["assumed"].items():
        lines.append(
            f"{name}: a GPU step of {assumed['step_seconds']:.2f} s assumed "
            f"(batch {assumed['batch_size']}, {TRAIN_OVER_FORWARD} x the forward pass; "
            f"{assumed['source']})"
        )
    header = f"{'model':<8}{'link':<12}{'rtt':<8}" + "".join(
        f"{'W=' + str(w):>12}" for w in WORKERS
    )
    for model_type in result["assumed"]:
        lines += ["", header, "-" * len(header)]
        for rate_name in RATES:
            for rtt_name in ROUND_TRIPS:
                row = [
                    r for r in result["rows"]
                    if (r["model"], r["link"], r["rtt"]) == (model_type, rate_name, rtt_name)
                ]  # fmt: skip
                lines.append(
                    f"{model_type:<8}{rate_name:<12}{rtt_name:<8}"
                    + "".join(f"{r['efficiency'][r['recommended']]:>12.2f}" for r in row)
                )
                lines.append(f"{'':<28}" + "".join(f"{_short(r['recommended']):>12}" for r in row))
    return "\n".join(lines)


def _short(label):
    return {
        "plain, float32": "plain32",
        "plain, bfloat16": "plain16",
        "--accumulate 8, bfloat16": "K=8",
        "PowerSGD rank 4, bfloat16": "PowerSGD4",
        "--local-steps 64, bfloat16": "H=64",
        "--local-steps 64 --overlap-sync 16, bfloat16": "H=64,T=16",
    }[label]
