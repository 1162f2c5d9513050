"""Runs tests/train_worker.py as one task of a Slurm step, as ``srun`` starts it.

    srun -n 2 python tests/slurm_worker.py DUMP_DIR -- <train.py flags>

Task k dumps into ``DUMP_DIR/task-<k>/`` (``SLURM_PROCID``; see train_worker.py for what).
The job must come from Slurm alone, so a ``TF_CONFIG`` in the environment is an error.
TensorFlow's own log is on at INFO: it names the strategy and the cluster it built.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import train_worker  # noqa: E402


def main():
    if "TF_CONFIG" in os.environ:
        sys.exit("TF_CONFIG is set: this worker must take its cluster from Slurm alone")
    if "SLURM_PROCID" not in os.environ:
        sys.exit("SLURM_PROCID is not set: start this with srun")
    sys.argv[1] = os.path.join(sys.argv[1], f"task-{os.environ['SLURM_PROCID']}")
    import tensorflow as tf

    tf.get_logger().setLevel("INFO")
    return train_worker.main()


if __name__ == "__main__":
    sys.exit(main())
