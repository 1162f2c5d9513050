"""``--dense-steps N``: ordinary training for N optimizer steps, then PowerSGD or local
steps take over, decided by the optimizer's step counter (so also after a resume)."""

import numpy as np
import pytest
from test_compression import setup as setup  # noqa: F401 (the records fixture)
from test_local_steps import _copies, _fit, _more_steps
from train_helpers import train_args

from yolo3.comm.schemes import communication_from
from yolo3.commands import train


def _assert_same_weights(a, b, atol=2e-6):
    for x, y in zip(a.body.weights, b.body.weights):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0, atol=atol)


def _largest_difference(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(a.body.trainable_weights, b.body.trainable_weights)
    )


@pytest.mark.slow
def test_powersgd_starts_after_the_dense_steps(strategy):
    ordinary, _ = _fit(strategy, None, steps=2)
    options = {"compress": "powersgd", "rank": 1, "dense_steps": 2}
    warmed, _ = _fit(strategy, None, steps=2, options=options)
    # Two steps of the whole gradient: ordinary training, nothing held back for later.
    assert warmed.status.dense_phase
    _assert_same_weights(ordinary, warmed)
    errors = warmed.communication.state.errors
    assert all(not np.any(np.asarray(e)) for e in errors)
    # The step counter has reached 2: the next step is compressed (rank 1 holds back a part
    # of the gradient as error feedback) and training goes on from there.
    _more_steps(ordinary, 1)
    _more_steps(warmed, 1)
    assert not warmed.status.dense_phase
    assert max(float(np.max(np.abs(np.asarray(e)))) for e in errors) > 1e-4
    assert _largest_difference(ordinary, warmed) > 1e-5


@pytest.mark.slow
def test_local_steps_start_after_the_dense_steps(strategy):
    ordinary, _ = _fit(strategy, None, steps=2)
    # A Nesterov outer step would move the weights if the callback synchronised during the
    # dense steps: it must not.
    options = {"outer_lr": 0.7, "outer_momentum": 0.9, "dense_steps": 2}
    warmed, sync = _fit(strategy, 1, steps=2, options=options)
    assert sync.synchronisations == 0
    _assert_same_weights(ordinary, warmed)
    _more_steps(warmed, 2, sync)
    assert sync.synchronisations == 2
    kernel = warmed.body.trainable_weights[0]
    copies = _copies(strategy, kernel)
    for copy in copies[1:]:
        np.testing.assert_array_equal(copy, copies[0])
    _more_steps(ordinary, 2)
    assert _largest_difference(ordinary, warmed) > 1e-5  # the outer momentum acted


def test_dense_steps_alone_are_refused():
    with pytest.raises(ValueError, match="--dense-steps"):
        communication_from(dense_steps=3)
    with pytest.raises(ValueError, match="--dense-steps -1"):
        communication_from(compress="powersgd", dense_steps=-1)


@pytest.mark.parametrize(
    "flags",
    [("--dense-steps", "10"), ("--compress", "powersgd", "--dense-steps", "-1")],
)
def test_dense_steps_flag_rejects_bad_values(setup, tmp_path, capsys, flags):
    records, anchors, _ = setup
    assert train.main(train_args(records, tmp_path, anchors, *flags)) == 2
    assert "--dense-steps" in capsys.readouterr().err
