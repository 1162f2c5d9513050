"""What the training step tells the callbacks after each step."""

import dataclasses


@dataclasses.dataclass
class TrainingStatus:
    """Set by the trainer (:class:`yolo3.engine.trainer.YoloTrainer` ``.status``), read by the
    callbacks it is handed to, so that none of them reads the trainer's attributes.

    Attributes:
        stop_requested: some worker asked the job to stop; every worker sees it after the
            same step (see :class:`yolo3.callbacks.Preemption`), and stops there with a backup.
        dense_phase: the step still all-reduces the whole gradient (``--dense-steps``), before
            PowerSGD or local steps take over; set by the trainer's communication
            (:class:`yolo3.comm.schemes.DenseWarmup`).
    """

    stop_requested: bool = False
    dense_phase: bool = False
