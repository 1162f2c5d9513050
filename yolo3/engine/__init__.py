"""A training run: its settings and the builder that wires strategy, data, model,
communication, callbacks and ``fit`` together (``training``), the Keras model that runs the
step (``trainer``), and the check that a resumed run keeps its saved settings (``resume``)."""
