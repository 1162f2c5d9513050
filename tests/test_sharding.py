"""Why the loss is per image: one step of the trainer's own train step on 1, 2 and 4 replicas.

With the per-image loss reduced over the global batch (``YoloTrainer.replica_loss``, that
is :func:`yolo3.model.loss.replica_loss`), a data-parallel step gives the same weights as one
device on the same global batch. A scalar mean over each replica's local batch makes the
summed gradient the replica count times too large.
"""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import micro_model, random_boxes, save_problem

GLOBAL_BATCH = 8
STEP_SCRIPT = Path(__file__).with_name("sharding_step.py")
# Slow: every test runs its replica layouts as processes of their own.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    rng = np.random.default_rng(7)
    model = micro_model()
    path = save_problem(
        tmp_path_factory.mktemp("sharding") / "problem.npz",
        model.get_weights(),
        images=rng.uniform(0, 1, (GLOBAL_BATCH, 64, 64, 3)).astype(np.float32),
        boxes=random_boxes(rng, GLOBAL_BATCH, 4, 64, num_classes=2),
    )
    start = [v.numpy() for v in model.trainable_variables]
    return path, start


def _step(problem_path, replicas):
    result = problem_path.with_name(f"result_{replicas}.npz")
    command = [sys.executable, str(STEP_SCRIPT), str(replicas), str(problem_path), str(result)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    data = np.load(result)
    count = len([k for k in data.files if k.startswith("per_image_")])
    return {
        reduction: [data[f"{reduction}_{i}"] for i in range(count)]
        for reduction in ("per_image", "local_mean")
    }


def _max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def one_device(problem):
    return _step(problem[0], 0)


@pytest.mark.parametrize("replicas", [2, 4])
def test_per_image_loss_shards_and_local_mean_does_not(problem, one_device, replicas):
    problem_path, start = problem
    reference = one_device["per_image"]
    # On one device both reductions agree, so any difference below comes from sharding.
    assert _max_difference(one_device["local_mean"], reference) <= 1e-9
    assert _max_difference(reference, start) > 1e-3  # the step really moved the weights

    sharded = _step(problem_path, replicas)
    # Synchronised batch norm on the replicas, plain on one device: equal to rounding.
    assert _max_difference(sharded["per_image"], reference) <= 1e-9

    assert _max_difference(sharded["local_mean"], reference) > 1e-3
    # Plain SGD: the local-mean update is exactly `replicas` times the correct one.
    for initial, wrong, right in zip(start, sharded["local_mean"], reference):
        np.testing.assert_allclose(
            wrong - initial, replicas * (right - initial), rtol=1e-6, atol=1e-9
        )
