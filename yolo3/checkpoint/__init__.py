"""Weights on disk: the project's ``.weights.h5`` files and their metadata (``weights``), the
original keras-yolo3 ``.h5`` files (``legacy``), and Darknet's ``.cfg``/``.weights`` both
ways (``darknet`` reads, ``darknet_writer`` writes)."""
