"""Which training options go together: the one table of combinations ``yolo3 train``
refuses, which the training guide prints and ``tests/test_combinations.py`` holds against
the real checks.

Every other combination of the options in :data:`OPTIONS` trains, saves its checkpoints and
resumes: the tests train rows of options that hold every pair not refused here, on two
replicas (XLA on one device), for two epochs, one row resumed after the first. A refusal
comes before the first step, as one line naming both sides and what to do instead, exit
status 2. Each check lives where its reason does (the communication's in
:func:`yolo3.comm.schemes.communication_from`, the remat one in :mod:`yolo3.model.remat`,
XLA's in :mod:`yolo3.distributed.devices`); this table says what they refuse, in one place.
"""

import dataclasses

# The options whose pairs are trained, each at a small value that is not its default with
# two replicas: ``{name: flags}``.
OPTIONS = {
    "accumulation": ("--accumulate", "2"),
    "bfloat16 all-reduce": ("--allreduce-dtype", "bfloat16"),
    "PowerSGD": ("--compress", "powersgd", "--rank", "2"),
    "local steps, overlapped": ("--local-steps", "2", "--overlap-sync", "1"),
    "dense warm-up": ("--dense-steps", "1"),
    "multi-scale": ("--multi-scale", "64:96"),
    "remat": ("--remat", "full"),
    "mixed precision": ("--mixed-precision", "bfloat16"),
    "XLA": ("--jit-compile", "on"),
    "freezing": ("--freeze-body", "1", "--freeze-epochs", "1"),
    "sync BN off": ("--sync-bn", "off"),
    "weight average": ("--ema", "0.9", "--ema-warmup", "1"),
    "several anchors per box": ("--iou-thresh", "0.3"),
}


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A combination ``yolo3 train`` refuses before the first step."""

    first: str  # one side, as the user writes it
    second: str  # the other side: a flag, or what a default gives
    why: str
    instead: str
    example: tuple  # flags that meet it (with --cpu-replicas 2 where ``replicas`` is 2)
    replicas: int = 1
    named: tuple = ()  # what the error line names: both sides


REFUSED = (
    Refusal(
        "--compress powersgd",
        "--local-steps H",
        "two answers to one problem: local steps' synchronisations send whole weights",
        "pick one",
        ("--compress", "powersgd", "--local-steps", "2"),
        named=("--local-steps", "--compress powersgd"),
    ),
    Refusal(
        "--dense-steps N",
        "neither --compress powersgd nor --local-steps",
        "the warm-up is the dense phase before one of them takes over",
        "pass one of them too",
        ("--dense-steps", "1", "--accumulate", "2"),
        named=("--dense-steps", "--compress powersgd", "--local-steps"),
    ),
    Refusal(
        "--remat full|large",
        "synchronised batch norm on several replicas (on by default there, except with "
        "--local-steps)",
        "its all-reduces cannot be replayed in the backward pass in one order on every replica",
        "--sync-bn off, or --remat off",
        ("--remat", "full", "--accumulate", "2"),
        replicas=2,
        named=("--remat full", "synchronised batch norm", "--sync-bn off"),
    ),
    Refusal(
        "--jit-compile on",
        "several replicas or workers",
        "XLA compiles the step for one device; the replicas' variables and collectives do not "
        "compile with it",
        "--jit-compile auto (XLA on one GPU alone) or off",
        ("--jit-compile", "on", "--mixed-precision", "bfloat16"),
        replicas=2,
        named=("--jit-compile on", "2 replicas"),
    ),
    Refusal(
        "--local-steps H",
        "--sync-bn on",
        "synchronised batch norm all-reduces in every step, which local steps exist to avoid",
        "--sync-bn off (each synchronisation averages the batch-norm statistics)",
        ("--local-steps", "2", "--sync-bn", "on"),
        replicas=2,
        named=("--sync-bn on", "--local-steps"),
    ),
    Refusal(
        "--compress powersgd",
        "--mixed-precision float16",
        "loss scaling applies the update inside a conditional branch, where PowerSGD's "
        "collectives would run",
        "--mixed-precision bfloat16 or off",
        ("--compress", "powersgd", "--mixed-precision", "float16"),
        named=("--compress powersgd", "float16"),
    ),
    Refusal(
        "--overlap-sync T",
        "no --local-steps",
        "it overlaps local steps' synchronisations",
        "add --local-steps H (T <= H)",
        ("--overlap-sync", "1"),
        named=("--overlap-sync", "--local-steps"),
    ),
    Refusal(
        "--freeze-body 1|2",
        "no --freeze-epochs",
        "the layers would stay frozen for the whole run",
        "add --freeze-epochs E (epochs before unfreezing)",
        ("--freeze-body", "1"),
        named=("--freeze-body", "--freeze-epochs"),
    ),
)


def markdown_table():
    """:data:`REFUSED` as the Markdown table the training guide prints."""
    lines = ["| option | with | refused because | instead |", "| --- | --- | --- | --- |"]
    for refusal in REFUSED:
        cells = (f"`{refusal.first}`", refusal.second, refusal.why, refusal.instead)
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)
