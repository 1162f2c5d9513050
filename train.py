"""``python train.py``: the same as ``yolo3 train`` (yolo3/commands/train.py), from a checkout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from yolo3.commands import run_command  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_command("train"))
