"""Grappler's graph rewrites off, for the processes whose runs the tests compare.

Grappler rewrites every traced function before its first run (constant folding, layout and
arithmetic passes, fusing ops). For the few-step runs of the tests that is a share of the
time: ``pytest tests/test_dense_steps.py -m slow`` took 87 s with the rewrites and 70 s
without, the four-replica process of tests/sharding_step.py 45.0 s and 41.5 s.

The tests that compare runs number for number (layouts, resumes, reductions) run both sides
in processes set up here, so the comparison is made alike on both. The end-to-end runs of the
real commands (``train.py``, ``tools/launch.py``, ``tools/demo.py``, the Slurm jobs and the
learning test) keep the rewrites, as users run them: both ways are covered.
"""


def skip_graph_rewrites():
    import tensorflow as tf  # noqa: PLC0415

    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
