"""Every branch a GPU takes, forced on the CPU: precision, XLA, device plans and strategies.

The decisions are pure functions of a device description, so a GPU machine is described
here instead of queried; the strategy branches run in a fresh process where TensorFlow has
not yet initialised (device visibility can only change before that).
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from yolo3.distributed import devices as devices_module
from yolo3.distributed.devices import (
    GpuInfo,
    choose_jit_compile,
    choose_precision,
    describe_gpus,
    peak_tflops,
)
from yolo3.distributed.strategy import (
    StrategyChoice,
    StrategyKind,
    choose_strategy_kind,
    mirrored_devices,
    plan_devices,
)

ROOT = Path(__file__).resolve().parents[1]
A100 = GpuInfo("/physical_device:GPU:0", "NVIDIA A100-SXM4-80GB", (8, 0))
H100 = GpuInfo("/physical_device:GPU:0", "NVIDIA H100 80GB HBM3", (9, 0))
V100 = GpuInfo("/physical_device:GPU:1", "Tesla V100-SXM2-16GB", (7, 0))
T4 = GpuInfo("/physical_device:GPU:0", "Tesla T4", (7, 5))
P100 = GpuInfo("/physical_device:GPU:0", "Tesla P100-PCIE-16GB", (6, 0))
UNREPORTED = GpuInfo("/physical_device:GPU:0")


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ((), "off"),  # the CPU: float32 unless asked (few CPUs have fast 16-bit kernels)
        ((A100,), "bfloat16"),
        ((H100,), "bfloat16"),
        ((V100,), "float16"),
        ((T4,), "float16"),
        ((P100,), "off"),
        ((UNREPORTED,), "off"),
        ((A100, V100), "float16"),  # the oldest GPU decides: every replica the same
    ],
)
def test_auto_precision_follows_the_compute_capability(gpus, expected):
    assert choose_precision("auto", gpus) == expected


def test_an_explicit_precision_is_kept_and_a_bad_one_refused():
    assert choose_precision("float16", ()) == "float16"
    assert choose_precision("off", (A100,)) == "off"
    with pytest.raises(ValueError, match="--mixed-precision 'half'"):
        choose_precision("half", ())


def test_auto_xla_is_on_for_one_gpu_alone():
    assert choose_jit_compile("auto", num_replicas=1, gpus=(A100,)) is True
    assert choose_jit_compile("auto", num_replicas=1, gpus=()) is False
    assert choose_jit_compile("auto", num_replicas=2, gpus=(A100, A100)) is False
    assert choose_jit_compile("off", num_replicas=1, gpus=(A100,)) is False
    assert choose_jit_compile("on", num_replicas=1, gpus=()) is True


def test_xla_on_with_replicas_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="--jit-compile on: 4 replicas.*one\\s+device"):
        choose_jit_compile("on", num_replicas=4, gpus=())


def test_peak_flops_of_known_gpus():
    # float32 on Hopper counts TF32 tensor cores (TensorFlow's default for convolutions).
    assert peak_tflops(H100, "float32") == pytest.approx(494.7)
    assert peak_tflops(H100, "bfloat16") == pytest.approx(989.4)
    assert peak_tflops(V100, "float16") == pytest.approx(125.0)
    assert peak_tflops(V100, "bfloat16") is None
    assert peak_tflops(UNREPORTED, "float32") is None


def test_describe_gpus_reads_name_and_capability(monkeypatch):
    """The one query of TensorFlow, on what it reports for two GPUs (one without details)."""
    import tensorflow as tf

    devices = [
        tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU"),
        tf.config.PhysicalDevice("/physical_device:GPU:1", "GPU"),
    ]
    details = {
        devices[0]: {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)},
        devices[1]: {},
    }
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: devices)
    monkeypatch.setattr(tf.config.experimental, "get_device_details", details.__getitem__)
    monkeypatch.setattr(devices_module, "driver_gpus", lambda: None)  # no nvidia-smi
    assert describe_gpus() == (H100, GpuInfo("/physical_device:GPU:1"))
    assert describe_gpus(1) == (H100,)
    assert choose_precision("auto", describe_gpus(1)) == "bfloat16"
    assert choose_precision("auto", describe_gpus()) == "off"  # one GPU reports nothing


def test_device_plan_for_gpus():
    names = ("/physical_device:GPU:0", "/physical_device:GPU:1")
    every = plan_devices(names)
    assert every.visible_gpus is None and every.memory_growth == names
    first = plan_devices(names, gpus=1)
    assert first.visible_gpus == names[:1] and first.memory_growth == names[:1]
    assert plan_devices(names, gpus=1, memory_growth=False).memory_growth == ()
    hidden = plan_devices(names, gpus=0)
    assert hidden.visible_gpus == () and hidden.memory_growth == ()
    with pytest.raises(ValueError, match="--gpus 3: TensorFlow .* sees 2 GPUs"):
        plan_devices(names, gpus=3)


def test_strategy_kinds_and_devices_for_gpus():
    names = ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    one = choose_strategy_kind({}, gpus=None, gpu_names=names[:1])
    assert one == StrategyChoice(StrategyKind.ONE_GPU, 1)
    both = choose_strategy_kind({}, gpus=None, gpu_names=names)
    assert mirrored_devices(both) == ["/gpu:0", "/gpu:1"]
    assert mirrored_devices(one) == []


def _fresh_process(code):
    completed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed.stdout


def test_make_strategy_gpu_branches_run():
    out = _fresh_process(
        """
        import tensorflow as tf
        from yolo3.distributed.strategy import make_strategy
        names = ["/physical_device:GPU:0", "/physical_device:GPU:1"]
        # --gpus 0 on a GPU machine: the GPUs are hidden before TensorFlow starts.
        cpu = make_strategy(gpus=0, gpu_names=names)
        print("cpu", cpu is tf.distribute.get_strategy(), tf.config.get_visible_devices("GPU"))
        one = make_strategy(gpus=1, gpu_names=names)
        print("one", one is tf.distribute.get_strategy())
        two = make_strategy(gpus=2, gpu_names=names)
        print("two", type(two).__name__, two.num_replicas_in_sync,
              [d.split("/")[-1] for d in two.extended.worker_devices])
        """
    )
    assert "cpu True []" in out
    assert "one True" in out
    assert "two MirroredStrategy 2 ['device:GPU:0', 'device:GPU:1']" in out
