"""Strategy choice, worker roles, and a real two-worker MultiWorkerMirroredStrategy run.

The multi-worker tests start two processes on 127.0.0.1 (tests/mwms_worker.py); each wait has
a timeout after which both are killed, so a stuck collective fails the test instead of
hanging it.
"""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import initial_weights, save_problem

from yolo3.commands import launch
from yolo3.distributed import keras_mwms, ports
from yolo3.distributed import strategy as distribute
from yolo3.distributed.strategy import StrategyKind, choose_strategy_kind

WORKER_SCRIPT = Path(__file__).with_name("mwms_worker.py")
WORKER_TIMEOUT_S = 120
NUM_SAMPLES = 48  # 6 global batches of 8 per epoch


TWO_WORKERS = {"worker": ["host0:2222", "host1:2222"]}


def _tf_config(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _local_env():
    """This environment without the cluster variables of a job the tests may run inside."""
    return {
        name: value
        for name, value in os.environ.items()
        if name != "TF_CONFIG" and not name.startswith("SLURM_")
    }


# --- choosing the strategy -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "gpu_names", "kind", "num_devices"),
    [
        (0, ["GPU:0", "GPU:1"], StrategyKind.CPU, 0),
        (1, ["GPU:0", "GPU:1"], StrategyKind.ONE_GPU, 1),
        (2, ["GPU:0", "GPU:1"], StrategyKind.MIRRORED_GPUS, 2),
        (None, ["GPU:0", "GPU:1", "GPU:2"], StrategyKind.MIRRORED_GPUS, 3),
        (None, [], StrategyKind.CPU, 0),
    ],
)
def test_local_choice_follows_gpus(gpus, gpu_names, kind, num_devices):
    choice = choose_strategy_kind({}, gpus=gpus, gpu_names=gpu_names)
    assert (choice.kind, choice.num_devices) == (kind, num_devices)


def test_cpu_replicas_choose_mirrored_cpus():
    choice = choose_strategy_kind({}, gpus=0, cpu_replicas=4)
    assert (choice.kind, choice.num_devices) == (StrategyKind.MIRRORED_CPUS, 4)


def test_more_gpus_than_visible_says_what_tensorflow_sees():
    # The causes and fixes: tests/test_device_line.py.
    names = ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    with pytest.raises(ValueError, match=r"--gpus 3: TensorFlow \S+ sees 2 GPUs \(.*--gpus 0$"):
        choose_strategy_kind({}, gpus=3, gpu_names=names)
    with pytest.raises(ValueError, match=r"--gpus 1: TensorFlow \S+ sees 0 GPUs"):
        choose_strategy_kind({}, gpus=1, gpu_names=[])


def test_tf_config_with_two_workers_is_multi_worker():
    env = {"TF_CONFIG": _tf_config(TWO_WORKERS, index=1)}
    choice = choose_strategy_kind(env, gpus=None, gpu_names=["GPU:0"])
    assert (choice.kind, choice.num_devices) == (StrategyKind.MULTI_WORKER_TF_CONFIG, 1)
    # A chief plus one worker is two training tasks too.
    env = {"TF_CONFIG": _tf_config({"chief": ["c:1"], "worker": ["w:1"]}, "chief")}
    assert choose_strategy_kind(env, gpus=0).kind is StrategyKind.MULTI_WORKER_TF_CONFIG


def test_tf_config_with_one_task_stays_local():
    env = {"TF_CONFIG": _tf_config({"worker": ["host0:2222"]})}
    choice = choose_strategy_kind(env, gpus=2, gpu_names=["GPU:0", "GPU:1"])
    assert choice.kind is StrategyKind.MIRRORED_GPUS


def test_tf_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="TF_CONFIG is not valid JSON"):
        choose_strategy_kind({"TF_CONFIG": "{cluster"}, gpus=0)
    parameter_servers = _tf_config({**TWO_WORKERS, "ps": ["ps0:2222"]}, "ps")
    with pytest.raises(ValueError, match="ParameterServerStrategy is not supported"):
        choose_strategy_kind({"TF_CONFIG": parameter_servers}, gpus=0)
    with pytest.raises(ValueError, match="cpu_replicas=2 splits one process"):
        choose_strategy_kind({"TF_CONFIG": _tf_config(TWO_WORKERS)}, gpus=0, cpu_replicas=2)


@pytest.mark.parametrize(
    ("env", "kind"),
    [
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, StrategyKind.MULTI_WORKER_SLURM),
        ({"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "2"}, StrategyKind.MULTI_WORKER_SLURM),
        ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"}, StrategyKind.CPU),
        ({"SLURM_NTASKS": "4"}, StrategyKind.CPU),  # no job: a stale variable, not a job
    ],
)
def test_slurm_variables(env, kind):
    assert choose_strategy_kind(env, gpus=0).kind is kind


def test_tf_config_wins_over_slurm():
    env = {"TF_CONFIG": _tf_config(TWO_WORKERS), "SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}
    assert choose_strategy_kind(env, gpus=0).kind is StrategyKind.MULTI_WORKER_TF_CONFIG


def test_slurm_resolver_ports_and_task(monkeypatch):
    # Two tasks on node01, one on node02; this process is task 2.
    for name, value in {
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "2",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_STEP_NODELIST": "node[01-02]",
        "SLURM_STEP_TASKS_PER_NODE": "2,1",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    resolver = distribute._slurm_resolver(os.environ, 0, port_base=9000)
    assert resolver.cluster_spec().as_dict() == {
        "worker": ["node01:9000", "node01:9001", "node02:9000"]
    }
    assert (resolver.task_type, resolver.task_id) == ("worker", 2)
    assert resolver.num_accelerators() == {"GPU": 0}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ  # auto_set_gpu is off


def test_slurm_outside_a_step_says_to_use_srun(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="srun"):
        distribute._slurm_resolver(os.environ, 0, port_base=9000)


@pytest.fixture
def local_env(monkeypatch):
    for name in _local_env().keys() ^ os.environ.keys():
        monkeypatch.delenv(name)


def test_make_strategy_on_one_cpu_is_the_default_strategy(local_env):
    strategy = distribute.make_strategy(gpus=0)
    assert strategy is tf.distribute.get_strategy()
    assert distribute.worker_info(strategy) == distribute.WorkerInfo(True, 0, 1, 1)


def test_make_strategy_cpu_replicas_needs_the_logical_devices(local_env):
    from conftest import NUM_LOGICAL_CPUS

    wanted = 2 * NUM_LOGICAL_CPUS
    with pytest.raises(ValueError, match=rf"needs {wanted} logical .* found {NUM_LOGICAL_CPUS}"):
        distribute.make_strategy(gpus=0, cpu_replicas=wanted)


def test_a_second_run_in_one_process_gets_the_strategy_whose_collectives_work(local_env, strategy):
    """Two trainings in one process (a notebook, a loop) build the strategy twice; each
    MirroredStrategy instance numbers its collectives from the same key, so the second one's
    all-reduce of another shape failed (tensorflow#62790)."""
    from conftest import NUM_LOGICAL_CPUS

    def all_reduce(strategy, size):
        def replica_fn():
            context = tf.distribute.get_replica_context()
            value = tf.fill([size], tf.cast(context.replica_id_in_sync_group, tf.float32))
            return context.all_reduce("sum", value)

        return strategy.experimental_local_results(tf.function(lambda: strategy.run(replica_fn))())

    first_run = distribute.make_strategy(gpus=0, cpu_replicas=NUM_LOGICAL_CPUS)
    assert first_run is strategy  # the tests' own, built the same way
    all_reduce(first_run, 3)
    second_run = distribute.make_strategy(gpus=0, cpu_replicas=NUM_LOGICAL_CPUS)
    summed = all_reduce(second_run, 5)  # another shape at the same place in the sequence
    np.testing.assert_array_equal(summed[-1], np.full(5, sum(range(NUM_LOGICAL_CPUS))))


def test_configure_devices_after_initialisation_says_when_to_call_it():
    tf.config.list_logical_devices("CPU")  # makes sure the runtime is up
    with pytest.raises(RuntimeError, match="before building any model"):
        distribute.configure_devices(cpu_replicas=3)


# --- worker roles ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "task_type", "task_id", "expected"),
    [
        ({"worker": ["a", "b"]}, "worker", 0, (True, 0, 2)),
        ({"worker": ["a", "b"]}, "worker", 1, (False, 1, 2)),
        ({"chief": ["c"], "worker": ["a", "b"]}, "chief", 0, (True, 0, 3)),
        ({"chief": ["c"], "worker": ["a", "b"]}, "worker", 0, (False, 1, 3)),
    ],
)
def test_chief_is_the_chief_task_else_worker_zero(cluster, task_type, task_id, expected):
    info = distribute.worker_info_from_cluster(cluster, task_type, task_id, 4)
    assert (info.is_chief, info.worker_index, info.num_workers) == expected
    assert info.num_replicas_in_sync == 4


def test_chief_only_path(tmp_path):
    target = tmp_path / "model.weights.h5"
    with distribute.chief_only_path(target, distribute.WorkerInfo(True, 0, 2, 2)) as path:
        assert path == str(target)
    with distribute.chief_only_path(target, distribute.WorkerInfo(False, 1, 2, 2)) as path:
        assert Path(path).name == target.name and Path(path).parent != tmp_path
        Path(path).write_text("scratch")
    assert not Path(path).exists() and not Path(path).parent.exists()


def test_free_ports_miss_the_ephemeral_range_and_are_free():
    # The kernel gives an outgoing connection a port of its ephemeral range; one chosen
    # there may be taken before the worker listens on it (a Slurm job failed so).
    low, high = ports.ephemeral_range()
    for _ in range(20):
        chosen = ports.free_ports(3)
        assert len(set(chosen)) == 3
        assert all(ports.LOWEST <= port <= 65535 and not low <= port <= high for port in chosen)
        base = ports.free_ports(8, consecutive=True)[0]
        assert not any(low <= port <= high for port in range(base, base + 8))
        for port in chosen + [base]:
            with socket.socket() as sock:
                sock.bind(("", port))
    # The launcher's local workers get such ports.
    local = launch.cluster_addresses(launch.build_parser().parse_args(["-n", "4", "--", "x"]))
    assert len(set(local)) == 4
    assert all(not low <= int(address.split(":")[1]) <= high for address in local), local
    # Only what lies outside a range is drawn: a block of 4 within 64000-65535 here.
    blocks = {ports.free_ports(4, consecutive=True, ephemeral=(1024, 63999))[0] for _ in range(30)}
    assert blocks <= set(range(64000, 65532)), sorted(blocks)
    with socket.socket() as held:
        held.bind(("", 65535))
        drawn = {ports.free_ports(1, ephemeral=(1024, 65533))[0] for _ in range(10)}
    assert drawn == {65534}
    with pytest.raises(OSError, match="no 2 consecutive ports .* outside the ephemeral range"):
        ports.free_ports(2, consecutive=True, ephemeral=(1024, 65534))


def test_tf_config_builder():
    port = ports.free_port()
    config = json.loads(distribute.tf_config([("127.0.0.1", port), "127.0.0.1:1234"], 1))
    assert config == {
        "cluster": {"worker": [f"127.0.0.1:{port}", "127.0.0.1:1234"]},
        "task": {"type": "worker", "index": 1},
    }
    with pytest.raises(ValueError, match="worker index 2 is outside the 2 workers"):
        distribute.tf_config(["a:1", "b:2"], 2)
    with pytest.raises(ValueError, match="'a' is not host:port"):
        distribute.tf_config(["a"], 0)


# --- the Keras patch -------------------------------------------------------------------------


def test_patch_fingerprints_match_installed_keras():
    assert keras.__version__ in keras_mwms.TESTED_KERAS_VERSIONS
    assert keras_mwms.source_fingerprints() == keras_mwms.EXPECTED_SOURCE_SHA256
    keras_mwms.check_compatible()


def test_untested_keras_is_refused_unless_overridden(monkeypatch):
    monkeypatch.setattr(keras, "__version__", "3.99.0")
    monkeypatch.delenv(keras_mwms.UNTESTED_OVERRIDE_ENV, raising=False)
    with pytest.raises(RuntimeError, match="tested with Keras 3.15.1; Keras 3.99.0"):
        keras_mwms.check_compatible()
    monkeypatch.setenv(keras_mwms.UNTESTED_OVERRIDE_ENV, "1")
    keras_mwms.check_compatible()  # the sources still match, so the override is enough


def test_changed_upstream_source_is_refused_even_with_override(monkeypatch):
    monkeypatch.setenv(keras_mwms.UNTESTED_OVERRIDE_ENV, "1")
    expected = dict(keras_mwms.EXPECTED_SOURCE_SHA256, reduce_per_replica="0" * 64)
    monkeypatch.setattr(keras_mwms, "EXPECTED_SOURCE_SHA256", expected)
    with pytest.raises(RuntimeError, match="reduce_per_replica: expected 000000000000"):
        keras_mwms.check_compatible()


# --- training in processes of their own ------------------------------------------------------


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    from mwms_worker import build_model

    rng = np.random.default_rng(3)
    keras.utils.set_random_seed(3)  # the same starting weights in every run
    weights = build_model().get_weights()
    return save_problem(
        tmp_path_factory.mktemp("mwms") / "problem.npz",
        weights,
        images=rng.uniform(0, 1, (NUM_SAMPLES, 8, 8, 3)).astype(np.float32),
        targets=rng.normal(size=(NUM_SAMPLES, 1)).astype(np.float32),
    )


def _run(commands, logs):
    """Runs the processes to completion, or kills them all at the deadline."""
    processes = []
    for command, log_path in zip(commands, logs):
        with open(log_path, "w") as log:
            processes.append(
                subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=_local_env())
            )
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    try:
        for process in processes:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, log in zip(processes, logs):
        assert process.returncode == 0, f"{log}:\n{log.read_text()[-3000:]}"


def _run_workers(mode, problem_path, out_dir, suffix):
    """Runs a two-worker job on 127.0.0.1; returns the workers' result paths."""
    out_dir.mkdir(exist_ok=True)
    addresses = ",".join(str(port) for port in ports.free_ports(2))
    results = [out_dir / f"worker{index}.{suffix}" for index in range(2)]
    script = [sys.executable, str(WORKER_SCRIPT), mode, str(problem_path)]
    commands = [
        script + [str(result), str(index), addresses] for index, result in enumerate(results)
    ]
    _run(commands, [out_dir / f"worker{index}.log" for index in range(2)])
    return results


def _assert_matches_reference(result, reference):
    reference_weights, reference_epochs, reference_steps, reference_eval = reference
    weights = [result[f"weight_{i}"] for i in range(len(reference_weights))]
    for got, want in zip(weights, reference_weights):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # Logged losses are global: the single process's values. Step logs go through
    # reduce_per_replica, epoch and evaluation logs through the metrics' variables.
    np.testing.assert_allclose(result["batch_losses"], reference_steps, rtol=1e-5)
    np.testing.assert_allclose(result["epoch_losses"], reference_epochs, rtol=1e-5)
    np.testing.assert_allclose(result["eval_loss"], reference_eval, rtol=1e-5)


@pytest.fixture(scope="module")
def reference(problem):
    """The same two epochs in this process, without a strategy, on the same global batches."""
    from mwms_worker import train

    model, epoch_losses, batch_losses, eval_loss = train(dict(np.load(problem)))
    return model.get_weights(), epoch_losses, batch_losses, eval_loss


@pytest.fixture(scope="module")
def initial_loss(problem):
    """The loss of the starting weights on the training data, before any step."""
    from mwms_worker import build_model, compile_model, make_dataset

    loaded = dict(np.load(problem))
    model = build_model()
    model.set_weights(initial_weights(loaded))
    compile_model(model)
    return model.evaluate(make_dataset(loaded), verbose=0)


def test_two_workers_match_one_process(problem, reference, initial_loss, tmp_path):
    paths = _run_workers("train", problem, tmp_path / "train", "npz")
    chief, other = (dict(np.load(path)) for path in paths)

    for worker in (chief, other):
        assert bool(worker["multi_worker"])
        assert int(worker["num_workers"]) == 2 and int(worker["num_replicas_in_sync"]) == 2
        assert bool(worker["apply_idempotent"])
        assert "pass a tf.data.Dataset" in str(worker["numpy_rejected"])
        _assert_matches_reference(worker, reference)
    for name in ("batch_losses", "epoch_losses", "eval_loss"):
        np.testing.assert_array_equal(chief[name], other[name])
    # Training did something: the loss over the data fell. (Not the first epoch's running
    # mean against the second's: on these noise targets that can go either way.)
    assert reference[3] < initial_loss

    assert (bool(chief["is_chief"]), int(chief["worker_index"])) == (True, 0)
    assert (bool(other["is_chief"]), int(other["worker_index"])) == (False, 1)
    # Both saved; only the chief's file is left, at the real path.
    assert bool(chief["wrote"]) and bool(other["wrote"])
    assert str(chief["save_path"]) == str(tmp_path / "train" / "final.weights.h5")
    assert bool(chief["kept"]) and not bool(other["kept"])


def test_cpu_replicas_with_the_patch_applied_match_one_process(problem, reference, tmp_path):
    result_path = tmp_path / "mirrored.npz"
    command = [sys.executable, str(WORKER_SCRIPT), "mirrored", str(problem), str(result_path)]
    _run([command + ["2"]], [tmp_path / "mirrored.log"])
    result = dict(np.load(result_path))
    assert bool(result["mirrored"]) and int(result["num_replicas_in_sync"]) == 2
    assert bool(result["is_chief"]) and int(result["num_workers"]) == 1
    _assert_matches_reference(result, reference)


def test_upstream_keras_still_fails_without_the_patch(problem, tmp_path):
    """Canary: when this fails, upstream fixed MultiWorkerMirroredStrategy and the patch in
    yolo3/distributed/keras_mwms.py can go."""
    paths = _run_workers("unpatched", problem, tmp_path / "unpatched", "json")
    for path in paths:
        errors = json.loads(path.read_text())
        assert "PerReplica" in errors["fit"], errors
        assert "reduction dimension 0" in errors["reduce_per_replica"], errors


def test_logs_are_averaged_over_the_replicas_a_dtype_at_a_time(four_replicas):
    # Several replicas per worker (several GPUs on each machine) hand the reduction
    # per-replica values, stacked here replica by replica; on the test's logical CPUs the
    # mirrored strategy's reduce stands in for the multi-worker one.
    def replica():
        index = tf.distribute.get_replica_context().replica_id_in_sync_group
        value = tf.cast(index, tf.float32)
        return {
            "loss": value,
            "terms": (2.0 * value, value * value),
            "wait": tf.cast(index, tf.float64),
        }

    @tf.function
    def step():
        return keras_mwms._mean_over_replicas(four_replicas.run(replica), four_replicas)

    logs = step()
    assert float(logs["loss"]) == 1.5 and float(logs["wait"]) == 1.5
    assert [float(term) for term in logs["terms"]] == [3.0, 3.5]
    assert logs["wait"].dtype == tf.float64
