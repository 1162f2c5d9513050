"""The ``yolo3`` command: ``yolo3 NAME [flags]`` runs the tool ``yolo3/commands/NAME.py``.

    yolo3 train --records rec --gpus 4
    yolo3 detect photos/ --weights run/checkpoints/best.weights.h5 --output out
    yolo3 NAME --help

Each tool is a module here with ``main(argv=None) -> int``; ``python train.py`` and
``python tools/NAME.py`` in a checkout run the same functions. A module is imported only
when its command runs, so ``yolo3 --help`` starts no TensorFlow.
"""

import ast
import importlib
import sys
from pathlib import Path

# Command name -> module in this package, in the order ``yolo3 --help`` lists them: the
# pipeline first, then the helpers around it.
COMMANDS = {
    "demo": "demo",
    "train": "train",
    "preprocess": "preprocess",
    "evaluate": "evaluate",
    "detect": "detect",
    "export": "export",
    "convert": "convert",
    "kmeans": "kmeans",
    "launch": "launch",
    "voc-annotation": "voc_annotation",
    "coco-annotation": "coco_annotation",
    "make-demo-dataset": "make_demo_dataset",
    "quickstart": "quickstart",
}

USAGE = "usage: yolo3 {" + ",".join(COMMANDS) + "} ...\n"


def summary(name):
    """The first line of the command's module docstring, read without importing it (which
    would start TensorFlow for most of them)."""
    path = Path(__file__).with_name(f"{COMMANDS[name]}.py")
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return docstring.split("\n")[0]


def _overview():
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary(name)}" for name in COMMANDS]
    return (
        USAGE
        + "\nYOLOv3 and tiny-YOLOv3 on Keras 3: train, evaluate, detect, export.\n\ncommands:\n"
        + "\n".join(lines)
        + "\n\n'yolo3 NAME --help' describes the flags of one command.\n"
    )


def run_command(name, argv=None):
    """Runs one command as ``yolo3 NAME`` with ``argv`` (default: the rest of sys.argv)."""
    module = importlib.import_module(f"{__name__}.{COMMANDS[name]}")
    return module.main(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        sys.stderr.write(_overview())
        return 2
    if argv[0] in ("-h", "--help"):
        sys.stdout.write(_overview())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        sys.stderr.write(
            USAGE + f"yolo3: error: unknown command {name!r}: choose from {', '.join(COMMANDS)}\n"
        )
        return 2
    # argparse names the program after argv[0]: "yolo3 train: error: ..." in every message.
    sys.argv = [f"yolo3 {name}", *rest]
    return run_command(name, rest)
