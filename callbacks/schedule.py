"""Changing what trains and how fast during ``model.fit``: freezing and plateau decay."""

import math

import keras

from yolo3.engine.trainer import set_frozen


class FreezeSchedule(keras.callbacks.Callback):
    """Trains with ``names`` frozen for the first ``epochs`` epochs, then unfreezes them.

    The state follows from the epoch number alone, so a run restored from a backup in
    either stage freezes exactly what an uninterrupted run would. The train function is
    rebuilt when the state changes, because Keras fixes the trainable set when tracing.
    The optimizer must already be built for every variable (see ``yolo3.engine.training``).
    """

    def __init__(self, body, names, epochs, log=None):
        super().__init__()
        self.body = body
        self.names = list(names)
        self.epochs = int(epochs)
        self.frozen = None
        self.log = log

    def _apply(self, epoch):
        frozen = epoch < self.epochs
        if frozen == self.frozen or not self.names:
            return
        set_frozen(self.body, self.names, frozen)
        self.frozen = frozen
        self.model.make_train_function(force=True)
        self.model.make_test_function(force=True)
        if self.log:
            state = "frozen" if frozen else "unfrozen: the whole network trains"
            self.log(f"epoch {epoch + 1}: {len(self.names)} layers {state}")

    def on_train_begin(self, logs=None):
        self._apply(self.params.get("initial_epoch", 0) if self.params else 0)

    def on_epoch_begin(self, epoch, logs=None):
        self._apply(epoch)


class PlateauScale(keras.callbacks.Callback):
    """Multiplies ``scale`` (the trainer's ``lr_scale``) by ``factor`` when ``monitor`` stalls.

    Keras's ReduceLROnPlateau cannot change a learning-rate schedule; this lowers a scale
    the schedule multiplies in, which is saved with the training state.
    """

    def __init__(
        self, scale, *, monitor="val_loss", factor=0.1, patience=3, min_scale=1e-3, log=None
    ):
        super().__init__()
        self.scale = scale
        self.monitor = monitor
        self.factor = factor
        self.patience = patience
        self.min_scale = min_scale
        self.best = math.inf
        self.wait = 0
        self.log = log

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or not math.isfinite(value):
            return
        if value < self.best:
            self.best, self.wait = value, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            current = float(keras.ops.convert_to_numpy(self.scale))
            new = max(current * self.factor, self.min_scale)
            if new < current:
                self.scale.assign(new)
                if self.log:
                    self.log(f"epoch {epoch + 1}: {self.monitor} stalled; lr scale {new:g}")
            self.wait = 0
