"""Choosing and building the ``tf.distribute`` strategy: devices, TF_CONFIG and Slurm.

:func:`choose_strategy_kind` decides, first match wins:

1. ``TF_CONFIG`` whose cluster has more than one chief/worker task, or a Slurm step with more
   than one task (``SLURM_JOB_ID`` set and ``SLURM_STEP_NUM_TASKS``, else ``SLURM_NTASKS``,
   > 1): ``MultiWorkerMirroredStrategy``, one process per worker, with
   :mod:`yolo3.distributed.keras_mwms` applied so that ``model.fit`` works;
2. ``cpu_replicas=N``: ``MirroredStrategy`` over N logical CPUs, the way to run the
   multi-device path without GPUs (:func:`configure_devices` creates them);
3. ``gpus=N``: N > 1 ``MirroredStrategy`` over the first N GPUs; 1 the default strategy, which
   places everything on GPU:0; 0 the default strategy with GPUs hidden (CPU).
   ``gpus=None`` means every visible GPU.

TensorFlow lets a process join one collective group only, so one process cannot build two
mirrored strategies with different replica counts; use a process per configuration.
Device setup must precede TensorFlow's initialisation: call :func:`configure_devices` first.
"""

import contextlib
import dataclasses
import enum
import json
import os
import shutil
import tempfile
from collections.abc import Mapping

import tensorflow as tf

from yolo3.distributed.collectives import all_reduce_by_dtype
from yolo3.distributed.devices import check_gpu_count
from yolo3.text import plural

TRAINING_JOBS = ("chief", "worker")


class StrategyKind(enum.Enum):
    MULTI_WORKER_TF_CONFIG = "multi_worker_tf_config"
    MULTI_WORKER_SLURM = "multi_worker_slurm"
    MIRRORED_GPUS = "mirrored_gpus"
    MIRRORED_CPUS = "mirrored_cpus"
    ONE_GPU = "one_gpu"
    CPU = "cpu"


class WorkerPortError(ValueError):
    """A worker's server could not listen on the port its configuration gives it."""


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """What :func:`make_strategy` builds: the kind, and the devices each process trains on.

    ``num_devices`` counts GPUs per process (0: the CPU alone), or logical CPUs for
    ``MIRRORED_CPUS``.
    """

    kind: StrategyKind
    num_devices: int


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """This process's place in the job; a single process is the chief of a one-worker job."""

    is_chief: bool
    worker_index: int
    num_workers: int
    num_replicas_in_sync: int


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """What :func:`configure_devices` sets: physical GPU names to keep visible (None: all),
    those to grow memory on, and the number of logical CPUs (None: leave the CPU whole)."""

    visible_gpus: tuple | None
    memory_growth: tuple
    logical_cpus: int | None


def plan_devices(gpu_names, *, gpus=None, cpu_replicas=None, memory_growth=True):
    """The :class:`DevicePlan` for the physical GPUs ``gpu_names`` (a pure function).

    Args:
        gpu_names: names of the physical GPUs, in TensorFlow's order.
        gpus: keep only the first ``gpus`` GPUs visible (0 hides all); None keeps them all.
        cpu_replicas: split the CPU into this many logical devices, for
            ``make_strategy(cpu_replicas=...)``.
        memory_growth: allocate GPU memory as needed instead of all of it up front.
    """
    gpu_names = tuple(gpu_names)
    if gpus is not None:
        _check_gpu_count(gpus, gpu_names)
    if cpu_replicas is not None and cpu_replicas < 1:
        raise ValueError(f"cpu_replicas must be >= 1, got {cpu_replicas}")
    visible = gpu_names if gpus is None else gpu_names[:gpus]
    return DevicePlan(
        visible_gpus=None if gpus is None else visible,
        memory_growth=visible if memory_growth else (),
        logical_cpus=cpu_replicas,
    )


def configure_devices(*, gpus=None, cpu_replicas=None, memory_growth=True):
    """Sets device visibility and layout (:func:`plan_devices`); must run before TensorFlow
    initialises."""
    physical_gpus = tf.config.list_physical_devices("GPU")
    plan = plan_devices(
        [device.name for device in physical_gpus],
        gpus=gpus,
        cpu_replicas=cpu_replicas,
        memory_growth=memory_growth,
    )
    by_name = {device.name: device for device in physical_gpus}
    try:
        if plan.visible_gpus is not None:
            tf.config.set_visible_devices([by_name[n] for n in plan.visible_gpus], "GPU")
        for name in plan.memory_growth:
            tf.config.experimental.set_memory_growth(by_name[name], True)
        if plan.logical_cpus is not None:
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(plan.logical_cpus)]
            )
    except RuntimeError as error:
        raise RuntimeError(
            f"configure_devices(gpus={gpus}, cpu_replicas={cpu_replicas}) came after "
            f"TensorFlow initialised its devices ({error}); call it before building any "
            "model or running any op"
        ) from error


def choose_strategy_kind(env, *, gpus, cpu_replicas=None, gpu_names=()):
    """Decides the strategy without building it (building a multi-worker one blocks).

    Args:
        env: environment variables, e.g. ``os.environ``.
        gpus: GPUs per process; None for every visible GPU.
        cpu_replicas: logical CPU replicas for a single process; None when unused.
        gpu_names: names of the visible GPUs, for the count check and its message.
    Returns:
        a :class:`StrategyChoice`.
    """
    if gpus is not None and gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {gpus}")
    if cpu_replicas is not None and cpu_replicas < 1:
        raise ValueError(f"cpu_replicas must be >= 1, got {cpu_replicas}")
    if cpu_replicas is not None and gpus:
        raise ValueError(f"choose gpus={gpus} or cpu_replicas={cpu_replicas}, not both")
    num_gpus = len(gpu_names) if gpus is None else _check_gpu_count(gpus, gpu_names)

    multi_worker = None
    if _tf_config_num_tasks(env) > 1:
        multi_worker = StrategyKind.MULTI_WORKER_TF_CONFIG
    elif _slurm_num_tasks(env) > 1:
        multi_worker = StrategyKind.MULTI_WORKER_SLURM
    if multi_worker is not None:
        if cpu_replicas is not None:
            raise ValueError(
                f"cpu_replicas={cpu_replicas} splits one process; a multi-worker job "
                f"({multi_worker.value}) trains on one CPU or the GPUs of each worker"
            )
        return StrategyChoice(multi_worker, num_gpus)
    if cpu_replicas is not None:
        return StrategyChoice(StrategyKind.MIRRORED_CPUS, cpu_replicas)
    if num_gpus > 1:
        return StrategyChoice(StrategyKind.MIRRORED_GPUS, num_gpus)
    return StrategyChoice(StrategyKind.ONE_GPU if num_gpus else StrategyKind.CPU, num_gpus)


def mirrored_devices(choice):
    """The device names a ``MirroredStrategy`` of ``choice`` replicates over ([] for none)."""
    prefix = {StrategyKind.MIRRORED_CPUS: "/cpu", StrategyKind.MIRRORED_GPUS: "/gpu"}
    if choice.kind not in prefix:
        return []
    return [f"{prefix[choice.kind]}:{index}" for index in range(choice.num_devices)]


SLURM_PORT_BASE_ENV = "YOLO3_SLURM_PORT_BASE"
DEFAULT_SLURM_PORT_BASE = 8888


def default_slurm_port_base(env=None):
    """The Slurm workers' first port: ``$YOLO3_SLURM_PORT_BASE``, else 8888.

    Task k of a node listens on this + k, so two jobs sharing a node need bases at least
    their tasks per node apart (``examples/slurm/train.sbatch`` derives one from the job id).
    """
    text = (os.environ if env is None else env).get(SLURM_PORT_BASE_ENV, "").strip()
    if not text:
        return DEFAULT_SLURM_PORT_BASE
    if not text.isdigit() or not 1024 <= int(text) <= 65535:
        raise ValueError(
            f"{SLURM_PORT_BASE_ENV}={text!r} is not a TCP port in [1024, 65535]; set it to the "
            "first port of this job's workers on each node, or unset it for "
            f"{DEFAULT_SLURM_PORT_BASE}"
        )
    return int(text)


# One MirroredStrategy per device set and process. Each instance numbers its collectives
# from the same first key, and TensorFlow keeps a collective's shape by key for the whole
# process: a second instance's all-reduce meets the first one's shapes ("Shape mismatch in
# the collective instance N", tensorflow#62790) when a notebook or a loop trains twice.
_MIRRORED = {}


def make_strategy(
    *, gpus, cpu_replicas=None, slurm_port_base=8888, gpu_names=None, communication=None
):
    """Builds the strategy :func:`choose_strategy_kind` picks for this process.

    A multi-worker strategy blocks until every worker has started. Under Slurm,
    ``SlurmClusterResolver`` reads ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``,
    ``SLURM_STEP_NODELIST`` and ``SLURM_STEP_TASKS_PER_NODE``, so launch one process per task
    with ``srun``. Task k on a node listens on port ``slurm_port_base + k`` of that node's
    Slurm hostname: those ports must be free and the hostnames reachable from every node
    (two jobs sharing a node need different bases). Its GPU assignment through
    ``CUDA_VISIBLE_DEVICES`` would come after TensorFlow enumerated the GPUs, so it is off;
    give each task its own GPUs with Slurm (``--gpus-per-task``) and each worker trains on
    all the GPUs it sees (or the first ``gpus``).

    Who can reach a worker's port can run operations in it: TensorFlow's server has no
    authentication, and it listens on every interface of the machine (``0.0.0.0``) whatever
    host the cluster names, with no option for another address. Keep the workers on a
    private network or behind firewall rules; on one machine, ``gpus``/``cpu_replicas``
    train in one process with no port at all.

    ``gpu_names`` (default: the visible GPUs) lets a test take a GPU branch on a CPU.
    ``communication``: the ``tf.distribute.experimental.CommunicationOptions`` of a
    multi-worker strategy's collectives (:func:`yolo3.comm.allreduce.communication_options`).
    """
    env = os.environ
    if gpu_names is None:
        gpu_names = [device.name for device in tf.config.get_visible_devices("GPU")]
    choice = choose_strategy_kind(env, gpus=gpus, cpu_replicas=cpu_replicas, gpu_names=gpu_names)
    kind, count = choice.kind, choice.num_devices
    if kind in (StrategyKind.MULTI_WORKER_TF_CONFIG, StrategyKind.MULTI_WORKER_SLURM):
        from yolo3.distributed import keras_mwms

        if kind is StrategyKind.MULTI_WORKER_TF_CONFIG:
            resolver = _tf_config_resolver(env, count)
        else:
            resolver = _slurm_resolver(env, count, slurm_port_base)
        keras_mwms.apply()
        try:
            return tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=communication
            )
        except tf.errors.UnknownError as error:
            if "Could not start gRPC server" not in str(error):
                raise
            raise WorkerPortError(_server_failure(kind, resolver, slurm_port_base)) from error
    if kind is StrategyKind.MIRRORED_CPUS:
        found = len(tf.config.list_logical_devices("CPU"))
        if found < count:
            raise ValueError(
                f"cpu_replicas={count} needs {plural(count, 'logical CPU device')}, found "
                f"{found}: call configure_devices(cpu_replicas={count}) before building any "
                "model"
            )
    if kind in (StrategyKind.MIRRORED_CPUS, StrategyKind.MIRRORED_GPUS):
        devices = tuple(mirrored_devices(choice))
        if devices not in _MIRRORED:
            _MIRRORED[devices] = tf.distribute.MirroredStrategy(list(devices))
        return _MIRRORED[devices]
    if kind is StrategyKind.CPU and gpu_names:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError as error:
            raise RuntimeError(
                "gpus=0 with GPUs already initialised: call configure_devices(gpus=0) before "
                "building any model"
            ) from error
    return tf.distribute.get_strategy()


def worker_info(strategy=None):
    """:class:`WorkerInfo` for ``strategy`` (default: the current one)."""
    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not any(cluster.get(job) for job in TRAINING_JOBS):
        return WorkerInfo(True, 0, 1, strategy.num_replicas_in_sync)
    return worker_info_from_cluster(
        cluster, resolver.task_type, resolver.task_id, strategy.num_replicas_in_sync
    )


def worker_info_from_cluster(cluster, task_type, task_id, num_replicas_in_sync):
    """:class:`WorkerInfo` from a cluster dict ``{"chief": [...], "worker": [...]}``.

    The chief is the ``chief`` task, or worker 0 when there is none; workers are numbered
    after the chief, as TensorFlow does.
    """
    if task_type not in TRAINING_JOBS:
        raise ValueError(f"task type {task_type!r} does not train; expected one of {TRAINING_JOBS}")
    num_chiefs = len(cluster.get("chief", ()))
    if task_type == "chief":
        index = task_id
    else:
        index = num_chiefs + task_id
    return WorkerInfo(
        is_chief=index == 0,
        worker_index=index,
        num_workers=num_chiefs + len(cluster.get("worker", ())),
        num_replicas_in_sync=num_replicas_in_sync,
    )


@contextlib.contextmanager
def chief_only_path(path, info):
    """Yields where this worker saves ``path``: the path itself on the chief, else a temporary
    location deleted on exit.

    Under ``MultiWorkerMirroredStrategy`` a save that reads ``ON_READ`` variables (metrics,
    ``tf.train.Checkpoint``, SavedModel) all-reduces them, so every worker must make it or the
    chief waits forever. Every worker saves through this, and only the chief's file is kept.
    """
    if info.is_chief:
        yield os.fspath(path)
        return
    scratch = tempfile.mkdtemp(prefix=f"worker{info.worker_index}-")
    try:
        yield os.path.join(scratch, os.path.basename(os.fspath(path)))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def common_newest(strategy, candidates, *, slots=2):
    """The largest of ``candidates`` (non-negative ints) that every worker also holds.

    Every worker must call it at the same point with its own candidates (at most
    ``slots``): one all-gather over the job. Returns None when no value is common to all.
    With one worker it returns ``max(candidates)`` (None if empty) and sends nothing.
    """
    candidates = sorted({int(c) for c in candidates}, reverse=True)[:slots]
    if worker_info(strategy).num_workers == 1:
        return candidates[0] if candidates else None
    padded = tf.constant([candidates + [-1] * (slots - len(candidates))], tf.int64)

    @tf.function
    def gather():
        def replica_fn():
            return tf.distribute.get_replica_context().all_gather(tf.identity(padded), axis=0)

        return strategy.run(replica_fn)

    gathered = strategy.experimental_local_results(gather())[0].numpy()
    common = set.intersection(*({int(v) for v in row if v >= 0} for row in gathered))
    return max(common) if common else None


def barrier(strategy):
    """Returns once every worker of the job has called it: one all-reduce of a zero.

    With one worker it returns at once and sends nothing.
    """
    if worker_info(strategy).num_workers == 1:
        return

    @tf.function
    def meet():
        def replica_fn():
            return tf.distribute.get_replica_context().all_reduce("sum", tf.zeros([]))

        return strategy.run(replica_fn)

    meet()


def broadcast_from_chief(strategy, variables):
    """Sets ``variables`` (Keras or tf variables) on every worker to the chief's values.

    Bit for bit: each value travels as integers of its width, the first replica's (on the
    chief) summed with zeros from every other replica. Every worker must call it at the same
    point with the same variables. With one worker it does nothing.
    """
    if worker_info(strategy).num_workers == 1 or not variables:
        return
    handles = [getattr(v, "value", v) for v in variables]
    bits = {tf.float16: tf.int16, tf.bfloat16: tf.int16, tf.float32: tf.int32}
    bits.update({tf.float64: tf.int64, tf.int32: tf.int32, tf.int64: tf.int64})
    for handle in handles:
        if handle.dtype.base_dtype not in bits:
            raise TypeError(f"cannot broadcast {handle.name} of dtype {handle.dtype.name}")

    def as_bits(handle):
        value = tf.identity(handle)  # a tensor on this replica's device
        wide = bits[handle.dtype.base_dtype]
        value = value if value.dtype == wide else tf.bitcast(value, wide)
        # int16 has no collective kernel everywhere: widen the 16-bit kinds losslessly.
        return tf.cast(value, tf.int32) if wide == tf.int16 else value

    @tf.function
    def gather():
        def replica_fn():
            context = tf.distribute.get_replica_context()
            first = tf.equal(context.replica_id_in_sync_group, 0)
            values = [as_bits(h) for h in handles]
            sent = [tf.where(first, v, tf.zeros_like(v)) for v in values]
            return all_reduce_by_dtype(context, sent)

        return strategy.run(replica_fn)

    for handle, value in zip(handles, gather()):
        value = strategy.experimental_local_results(value)[0]
        dtype = handle.dtype.base_dtype
        wide = bits[dtype]
        if wide == tf.int16:
            value = tf.cast(value, tf.int16)
        handle.assign(value if dtype == wide else tf.bitcast(value, dtype))


def tf_config(hosts_ports, index):
    """``TF_CONFIG`` JSON for worker ``index`` of a cluster of ``worker`` tasks.

    ``hosts_ports``: ``"host:port"`` strings or ``(host, port)`` pairs, one per worker.
    Worker 0 is the chief.
    """
    addresses = [
        entry if isinstance(entry, str) else f"{entry[0]}:{entry[1]}" for entry in hosts_ports
    ]
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"worker address {address!r} is not host:port")
    if not 0 <= index < len(addresses):
        raise ValueError(f"worker index {index} is outside the {plural(len(addresses), 'worker')}")
    return json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    )


def _check_gpu_count(gpus, gpu_names):
    """``gpus``, or ValueError saying why TensorFlow sees fewer (``gpu_names``) and the fix."""
    check_gpu_count(f"--gpus {gpus}", requested=gpus, seen=len(gpu_names), cpu_flag="--gpus 0")
    return gpus


def _parse_tf_config(env):
    """(cluster, task, rpc_layer) from ``TF_CONFIG``; empty when it is unset."""
    text = env.get("TF_CONFIG", "").strip()
    if not text:
        return {}, {}, None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}): {text[:200]}") from error
    cluster, task = config.get("cluster") or {}, config.get("task") or {}
    if not isinstance(cluster, Mapping) or not isinstance(task, Mapping):
        raise ValueError(f"TF_CONFIG needs 'cluster' and 'task' objects: {text[:200]}")
    return cluster, task, config.get("rpc_layer")


def num_tasks(env):
    """How many processes the job has, from ``TF_CONFIG`` or Slurm in ``env`` (1: alone),
    before any strategy is built."""
    return max(_tf_config_num_tasks(env), _slurm_num_tasks(env), 1)


def _tf_config_num_tasks(env):
    cluster, task, _ = _parse_tf_config(env)
    if cluster.get("ps"):
        raise ValueError(
            "TF_CONFIG has 'ps' tasks: ParameterServerStrategy is not supported by Keras 3; "
            "use 'chief'/'worker' tasks (MultiWorkerMirroredStrategy)"
        )
    num_tasks = sum(len(cluster.get(job, ())) for job in TRAINING_JOBS)
    if num_tasks > 1 and task.get("type") not in TRAINING_JOBS:
        raise ValueError(
            f"TF_CONFIG task type {task.get('type')!r} is not supported; expected one of "
            f"{TRAINING_JOBS} (every process trains)"
        )
    return num_tasks


def _slurm_num_tasks(env):
    if "SLURM_JOB_ID" not in env:
        return 0
    count = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    try:
        return int(count)
    except ValueError as error:
        raise ValueError(f"Slurm task count {count!r} is not an integer") from error


def _with_gpus(cluster_spec, task_type, task_id, num_gpus, rpc_layer):
    # MultiWorkerMirroredStrategy takes the number of local GPUs from the resolver.
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        cluster_spec,
        task_type=task_type,
        task_id=task_id,
        num_accelerators={"GPU": num_gpus},
        rpc_layer=rpc_layer or "grpc",
    )


def _tf_config_resolver(env, num_gpus):
    cluster, task, rpc_layer = _parse_tf_config(env)
    spec = tf.train.ClusterSpec({job: list(cluster[job]) for job in cluster if cluster[job]})
    return _with_gpus(spec, task["type"], int(task.get("index", 0)), num_gpus, rpc_layer)


def _server_failure(kind, resolver, port_base):
    """What to do when this worker's server could not listen on its port."""
    address = resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id)
    port = address.rpartition(":")[2]
    if kind is StrategyKind.MULTI_WORKER_SLURM:
        return (
            f"Slurm task {resolver.task_id} could not listen on port {port} ({address}): "
            f"the port is taken on this node, perhaps by another job sharing it. Task k of a "
            f"node listens on the port base ({port_base}) + k: give each job on a node its own "
            f"base, at least its tasks per node apart, with --slurm-port-base or "
            f"{SLURM_PORT_BASE_ENV}"
        )
    return (
        f"worker {resolver.task_type}:{resolver.task_id} could not listen on port {port} "
        f"({address} in TF_CONFIG): the port is taken on this machine; give this worker a "
        "free port in TF_CONFIG (yolo3 launch -n picks free ones)"
    )


def _slurm_resolver(env, num_gpus, port_base):
    num_tasks = _slurm_num_tasks(env)
    try:
        # One placeholder GPU per task keeps its port/GPU bookkeeping consistent on CPU
        # nodes (zero GPUs per task makes it step a range by 0); the real count is below.
        slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=port_base, gpus_per_node=num_tasks, gpus_per_task=1, auto_set_gpu=False
        )
        spec = slurm.cluster_spec()
    except RuntimeError as error:
        raise RuntimeError(
            f"{num_tasks} Slurm tasks but the step is incomplete ({error}); start one "
            "process per task with srun"
        ) from error
    return _with_gpus(spec, slurm.task_type, slurm.task_id, num_gpus, slurm.rpc_layer)
