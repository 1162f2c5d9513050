"""What a training run is made of: its settings (``config``), the builders of its steps
(strategy, data, resolved settings, trainer, datasets: ``builders``), the Keras model that
runs the step (``trainer``) and how its train function is assembled (``step``), and the
check that a resumed run keeps its saved settings (``resume``). The job that lists the steps
and wires in the callbacks is :mod:`yolo3.training`, above both this package and
:mod:`yolo3.callbacks`."""
