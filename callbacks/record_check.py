"""The record sets a run reads, checked against their manifests at every epoch's end."""

import keras

from yolo3 import faults


class RecordSetCheck(keras.callbacks.Callback):
    """Ends a run whose record shards changed on disk under it, naming the shard.

    A shard cut short inside a record fails the read at once; one cut at a record's end,
    or replaced by another of a different size, still reads, and the run would go on with
    data the manifest does not describe. At each epoch's end (before the backup and the
    checkpoints) every shard's size is compared with the manifest, one ``stat`` a shard,
    and a change ends the run with :class:`yolo3.faults.DamagedRecord`: one line,
    exit status 1, the last backup kept.

    Args:
        record_sets: the :class:`yolo3.data.records.RecordSet` objects the run reads.
    """

    def __init__(self, record_sets):
        super().__init__()
        self.record_sets = list(record_sets)

    def on_epoch_end(self, epoch, logs=None):
        faults.check_record_sets(self.record_sets)
