"""Benchmarks of keras-yolo3, run by ``tools/benchmark.py``: kept beside the ``yolo3`` package,
not installed with it."""
