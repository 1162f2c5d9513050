"""``python tools/make_demo_dataset.py`` in a checkout: the same as ``yolo3 make-demo-dataset``.

The tool itself is yolo3/commands/make_demo_dataset.py.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from yolo3.commands import run_command  # noqa: E402

if __name__ == "__main__":
    sys.exit(run_command("make-demo-dataset"))
