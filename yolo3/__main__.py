"""``python -m yolo3 NAME ...``: the ``yolo3`` command without the console script."""

import sys

from yolo3.commands import main

sys.exit(main())
