"""What the accelerators are, and the settings chosen for them: precision, XLA, peak FLOP/s.

Every choice that depends on the GPUs is a pure function of a :class:`GpuInfo` tuple, so
each branch a GPU takes is tested on a CPU by passing a description; only
:func:`describe_gpus` asks TensorFlow (and ``nvidia-smi``, for each GPU's memory), and only
:func:`gpu_support` reads why TensorFlow might see fewer GPUs than asked for.

- The device line (:func:`describe_devices`) names where a run trains: ``CPU (2 cores)``,
  ``4 logical CPU devices on 2 cores`` or ``2 x NVIDIA H100 80GB HBM3 (79.6 GiB)``.
- Too few GPUs (:func:`missing_gpus_message`): one message for ``--gpus N`` and
  ``--device gpu:N`` that says what TensorFlow sees, the likely cause (a build without
  CUDA, no driver, ``CUDA_VISIBLE_DEVICES``, fewer GPUs, NVIDIA's CUDA libraries missing)
  and the fix.
- ``--mixed-precision auto``: bfloat16 where every GPU in use has compute capability 8.0 or
  newer (Ampere, Hopper: bfloat16 tensor cores, float32's range, no loss scaling), float16
  with loss scaling on 7.x (Volta, Turing: float16 tensor cores only), off on older GPUs,
  on GPUs that report no capability, and on the CPU (most CPUs have no fast 16-bit
  kernels; where one has, ``--mixed-precision bfloat16`` asks for it).
- ``--jit-compile auto``: XLA on for one GPU with no strategy, as Keras decides; off on the
  CPU and under every multi-replica strategy. ``on`` is refused where it cannot compile:
  XLA compiles a step for one device, so ``MirroredStrategy``'s replicas on several devices
  fail ("Trying to access resource ... located in device CPU:1 from device CPU:0"), and the
  multi-worker strategy's collectives have no XLA implementation on the CPU ("Collectives
  are not yet implemented for CPU devices when compiling with XLA").
"""

import dataclasses
import importlib.metadata
import os
import shutil
import subprocess

from yolo3.text import plural

MIXED_PRECISION_CHOICES = ("auto", "off", "float16", "bfloat16")
JIT_COMPILE_CHOICES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as TensorFlow describes it; ``compute_capability`` None when unreported,
    ``memory_bytes`` (its total memory, from the driver) None when unknown."""

    name: str
    device_name: str = ""
    compute_capability: tuple | None = None
    memory_bytes: int | None = None


def available_cores():
    """The CPU cores this process may use (taskset, container cpusets), not all of the
    machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def describe_gpus(count=None, *, driver=None):
    """The visible GPUs (the first ``count`` when given), with their model, capability and
    memory.

    TensorFlow reports no total memory before or after it initialises a GPU, so the memory
    comes from the driver's list (``driver``, default :func:`driver_gpus`), matched by model
    name: known where every GPU of that name has the same memory, else None.
    """
    import tensorflow as tf  # noqa: PLC0415 - the pure functions here need no TensorFlow

    found = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        capability = details.get("compute_capability")
        found.append(
            GpuInfo(
                name=device.name,
                device_name=details.get("device_name", ""),
                compute_capability=tuple(capability) if capability else None,
            )
        )
    found = found if count is None else found[:count]
    if found:
        memory = memory_by_name(driver_gpus() if driver is None else driver)
        found = [
            dataclasses.replace(gpu, memory_bytes=memory.get(gpu.device_name)) for gpu in found
        ]
    return tuple(found)


def driver_gpus(run=subprocess.run):
    """``(name, memory in bytes)`` of every GPU the NVIDIA driver lists (``nvidia-smi``, which
    ignores ``CUDA_VISIBLE_DEVICES``), or None where ``nvidia-smi`` is missing or fails."""
    command = shutil.which("nvidia-smi")
    if command is None:
        return None
    query = [command, f"--query-gpu={DRIVER_QUERY}", "--format=csv,noheader,nounits"]
    try:
        completed = run(query, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if completed.returncode != 0:
        return None
    return parse_driver_gpus(completed.stdout)


DRIVER_QUERY = "name,memory.total,mig.mode.current"


def parse_driver_gpus(text):
    """``nvidia-smi --query-gpu=name,memory.total,mig.mode.current --format=csv,noheader,
    nounits`` output (``NVIDIA H200, 143771, [N/A]`` a line, memory in MiB) as ``(name,
    bytes)`` pairs. Memory is None where the driver says ``[N/A]``, and on a GPU split into
    MIG instances, whose CUDA devices each hold a slice of it."""
    found = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.rsplit(",", 2)]
        if len(fields) != 3 or not fields[0]:
            continue
        name, mebibytes, mig = fields
        known = mebibytes.isdigit() and mig != "Enabled"
        found.append((name, int(mebibytes) * 2**20 if known else None))
    return tuple(found)


def memory_by_name(listed):
    """``{name: bytes}`` of the driver's ``(name, bytes)`` list, for the names whose GPUs all
    report the same memory (the driver and CUDA may number GPUs differently)."""
    sizes = {}
    for name, memory in listed or ():
        sizes.setdefault(name, set()).add(memory)
    return {name: next(iter(s)) for name, s in sizes.items() if len(s) == 1 and None not in s}


def describe_devices(*, gpus=(), cores, cpu_replicas=None, num_workers=1):
    """Where a process trains, for the line that opens its log (a pure function).

    Args:
        gpus: the :class:`GpuInfo` of its GPUs (empty: the CPU); equal ones are grouped.
        cores: the CPU cores it may use (:func:`available_cores`).
        cpu_replicas: the logical CPU devices it splits the CPU into, or None.
        num_workers: the job's processes; with several, the line is this worker's.

    ``CPU (2 cores)``, ``4 logical CPU devices on 2 cores``,
    ``2 x NVIDIA H100 80GB HBM3 (79.6 GiB)``, ``NVIDIA H200 (140.4 GiB) on this worker, 4
    workers in all``.
    """
    if gpus:
        counts = {}
        for gpu in gpus:
            label = gpu.device_name or "GPU (model not reported)"
            if gpu.memory_bytes:
                label += f" ({gpu.memory_bytes / 2**30:.1f} GiB)"
            counts[label] = counts.get(label, 0) + 1
        where = ", ".join(label if n == 1 else f"{n} x {label}" for label, n in counts.items())
    elif cpu_replicas:
        where = f"{plural(cpu_replicas, 'logical CPU device')} on {plural(cores, 'core')}"
    else:
        where = f"CPU ({plural(cores, 'core')})"
    if num_workers > 1:
        where += f" on this worker, {num_workers} workers in all"
    return where


@dataclasses.dataclass(frozen=True)
class GpuSupport:
    """What decides whether TensorFlow sees the GPUs, as :func:`gpu_support` reads it."""

    tensorflow_version: str
    built_with_cuda: bool
    cuda_version: str | None = None  # the CUDA and cuDNN this TensorFlow was built for
    cudnn_version: str | None = None
    cuda_visible_devices: str | None = None  # the variable; None when unset
    driver_gpus: tuple | None = None  # (name, bytes) per GPU nvidia-smi lists; None: no driver
    cuda_wheels: bool = False  # NVIDIA's CUDA wheels (tensorflow[and-cuda]) are installed


def gpu_support():
    """The :class:`GpuSupport` of this process: TensorFlow's build, ``CUDA_VISIBLE_DEVICES``,
    the driver's GPUs and NVIDIA's CUDA wheels."""
    import tensorflow as tf  # noqa: PLC0415

    build = tf.sysconfig.get_build_info()
    try:
        importlib.metadata.distribution("nvidia-cudnn-cu12")
        wheels = True
    except importlib.metadata.PackageNotFoundError:
        wheels = False
    return GpuSupport(
        tensorflow_version=tf.__version__,
        built_with_cuda=tf.test.is_built_with_cuda(),
        cuda_version=build.get("cuda_version"),
        cudnn_version=build.get("cudnn_version"),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        driver_gpus=driver_gpus(),
        cuda_wheels=wheels,
    )


GPU_INSTALL = 'pip install "keras-yolo3[gpu]" (TensorFlow\'s CUDA wheels, Linux x86-64)'


def _listed_by_cuda_visible_devices(value):
    """How many GPUs ``CUDA_VISIBLE_DEVICES=value`` lets CUDA see at most: CUDA stops at
    the first entry that names no device (``-1``, empty)."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


def _cause_and_fix(requested, support):
    """Why TensorFlow may see fewer than ``requested`` GPUs, and what to do about it (None:
    nothing beyond running on fewer or on the CPU)."""
    if not support.built_with_cuda:
        return (
            "this TensorFlow was built without CUDA",
            f"install GPU support with {GPU_INSTALL} and check nvidia-smi",
        )
    listed = support.driver_gpus
    if listed is None:
        return (
            "no NVIDIA driver answers: nvidia-smi is missing or fails",
            "install the NVIDIA driver (nvidia-smi lists the GPUs; in a container, start it "
            f"with the GPUs, e.g. docker run --gpus all), and {GPU_INSTALL}",
        )
    visible = support.cuda_visible_devices
    shown = None if visible is None else _listed_by_cuda_visible_devices(visible)
    if shown is not None and shown < requested:
        hides = f"shows at most {plural(shown, 'GPU')}" if shown else "hides every GPU"
        return (
            f"CUDA_VISIBLE_DEVICES is {visible!r}, which {hides}",
            "list the GPUs to use in CUDA_VISIBLE_DEVICES (e.g. "
            f"{','.join(str(i) for i in range(requested))}), or unset it",
        )
    if len(listed) < requested:
        return f"nvidia-smi lists {plural(len(listed), 'GPU')} on this machine", None
    libraries = f"CUDA {support.cuda_version or '?'} and cuDNN {support.cudnn_version or '?'}"
    if not support.cuda_wheels:
        return (
            f"nvidia-smi lists {plural(len(listed), 'GPU')}, but TensorFlow found no "
            f"{libraries} libraries: NVIDIA's CUDA wheels are not installed",
            f"install GPU support with {GPU_INSTALL}",
        )
    return (
        f"nvidia-smi lists {plural(len(listed), 'GPU')}, but TensorFlow could not use them",
        "YOLO3_TF_LOG=1 shows TensorFlow's start-up log, which says why; check nvidia-smi "
        f"and that the driver supports CUDA {support.cuda_version or '?'}",
    )


def missing_gpus_message(flag, *, requested, seen, support, cpu_flag):
    """The one message for a flag that asks for more GPUs than TensorFlow sees (a pure
    function of what :func:`gpu_support` read).

    Args:
        flag: the flag as given, e.g. ``"--gpus 4"`` or ``"--device gpu:1"``.
        requested: how many GPUs it needs; ``seen``: how many TensorFlow sees.
        support: a :class:`GpuSupport`.
        cpu_flag: the same command's way to run on the CPU, e.g. ``"--gpus 0"``.
    """
    cause, fix = _cause_and_fix(requested, support)
    fix = f"{fix}; or" if fix else "ask for fewer, or"
    return (
        f"{flag}: TensorFlow {support.tensorflow_version} sees {plural(seen, 'GPU')} "
        f"({cause}); {fix} run on the CPU with {cpu_flag}"
    )


def check_gpu_count(flag, *, requested, seen, cpu_flag, support=None):
    """ValueError with :func:`missing_gpus_message` when ``requested`` GPUs are more than the
    ``seen`` ones; ``support`` is read (:func:`gpu_support`) only then."""
    if requested > seen:
        support = gpu_support() if support is None else support
        raise ValueError(
            missing_gpus_message(
                flag, requested=requested, seen=seen, support=support, cpu_flag=cpu_flag
            )
        )


def choose_precision(setting, gpus):
    """``--mixed-precision`` resolved: ``"off"``, ``"float16"`` or ``"bfloat16"``.

    Args:
        setting: one of ``MIXED_PRECISION_CHOICES``; anything but ``auto`` is returned as is.
        gpus: the :class:`GpuInfo` of the GPUs training uses (empty: the CPU).
    """
    if setting not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"--mixed-precision {setting!r}: use one of {MIXED_PRECISION_CHOICES}")
    if setting != "auto":
        return setting
    capabilities = [gpu.compute_capability for gpu in gpus]
    if not capabilities or any(c is None for c in capabilities):
        return "off"
    oldest = min(capabilities)
    if oldest >= (8, 0):
        return "bfloat16"
    if oldest >= (7, 0):
        return "float16"
    return "off"


def choose_jit_compile(setting, *, num_replicas, gpus):
    """``--jit-compile`` resolved to a bool for a process training ``num_replicas`` replicas
    in all (every worker's) on ``gpus`` (its :class:`GpuInfo`, empty on the CPU)."""
    if setting not in JIT_COMPILE_CHOICES:
        raise ValueError(f"--jit-compile {setting!r}: use one of {JIT_COMPILE_CHOICES}")
    single = num_replicas == 1
    if setting == "auto":
        return single and bool(gpus)
    if setting == "on" and not single:
        raise ValueError(
            f"--jit-compile on: {num_replicas} replicas; XLA compiles the train step for one "
            "device, and a strategy's replicas and collectives do not compile with it. Use "
            "--jit-compile auto (XLA on one GPU alone) or off"
        )
    return setting == "on"


# Dense peak TFLOP/s per precision (no sparsity), from the vendors' data sheets.
PEAK_TFLOPS = {
    "H200": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4},
    "H100 80GB HBM3": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4},
    "H100 PCIe": {"float32": 51.2, "tf32": 378.0, "bfloat16": 756.0, "float16": 756.0},
    "A100": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
    "L4": {"float32": 30.3, "tf32": 60.0, "bfloat16": 121.0, "float16": 121.0},
    "A10": {"float32": 31.2, "tf32": 62.5, "bfloat16": 125.0, "float16": 125.0},
    "V100": {"float32": 15.7, "float16": 125.0},
    "T4": {"float32": 8.1, "float16": 65.0},
}


def peak_tflops(gpu, precision):
    """The dense peak of ``gpu`` (a :class:`GpuInfo`) at ``precision`` (``"float32"``,
    ``"float16"``, ``"bfloat16"``), or None for a GPU not in ``PEAK_TFLOPS``.

    float32 on Ampere and newer counts TF32 tensor cores, which TensorFlow uses for float32
    convolutions by default. The longest table key found in the device name wins.
    """
    matches = [key for key in PEAK_TFLOPS if key in gpu.device_name]
    if not matches:
        return None
    table = PEAK_TFLOPS[max(matches, key=len)]
    if precision == "float32" and "tf32" in table:
        return table["tf32"]
    return table.get(precision)
