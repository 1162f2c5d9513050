"""A training run: its settings, the job that lists its steps (``training``), the builders of
those steps (strategy, data, resolved settings, trainer, datasets: ``builders``; callbacks:
``hooks``), the Keras model that runs the step (``trainer``) and how its train function is
assembled (``step``), and the check that a resumed run keeps its saved settings
(``resume``)."""
