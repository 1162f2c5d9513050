"""What the accelerators are, and the settings chosen for them: precision, XLA, peak FLOP/s.

Every choice that depends on the GPUs is a pure function of a :class:`GpuInfo` tuple, so
each branch a GPU takes is tested on a CPU by passing a description; only
:func:`describe_gpus` asks TensorFlow.

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
import os

MIXED_PRECISION_CHOICES = ("auto", "off", "float16", "bfloat16")
JIT_COMPILE_CHOICES = ("auto", "on", "off")


@dataclasses.dataclass(frozen=True)
class GpuInfo:
    """One GPU as TensorFlow describes it; ``compute_capability`` None when unreported."""

    name: str
    device_name: str = ""
    compute_capability: tuple | None = None


def available_cores():
    """The CPU cores this process may use (taskset, container cpusets), not all of the
    machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def describe_gpus(count=None):
    """The visible GPUs (the first ``count`` when given), with their model and capability."""
    import tensorflow as tf

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
    return tuple(found if count is None else found[:count])


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
