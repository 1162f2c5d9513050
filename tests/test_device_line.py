"""Where a run trains, said in its opening line, and why TensorFlow sees fewer GPUs than asked.

Every GPU branch is forced on the CPU: the device line and the missing-GPU message are pure
functions of a description, and the queries (TensorFlow, ``nvidia-smi``) are replaced.
"""

import subprocess
from types import SimpleNamespace

import pytest

from yolo3.distributed import devices
from yolo3.distributed.devices import (
    GpuInfo,
    GpuSupport,
    check_gpu_count,
    describe_devices,
    describe_gpus,
    memory_by_name,
    missing_gpus_message,
    parse_driver_gpus,
)
from yolo3.distributed.strategy import WorkerInfo, plan_devices
from yolo3.engine import builders
from yolo3.text import plural

GIB = 2**30
H100 = GpuInfo("/physical_device:GPU:0", "NVIDIA H100 80GB HBM3", (9, 0), 81559 * 2**20)
V100 = GpuInfo("/physical_device:GPU:2", "Tesla V100-SXM2-16GB", (7, 0), 16 * GIB)


def test_plural_says_one_in_the_singular():
    assert plural(1, "replica") == "1 replica"
    assert (plural(0, "replica"), plural(4, "replica")) == ("0 replicas", "4 replicas")
    assert plural(1, "batch", "batches") == "1 batch"
    assert plural(3, "batch", "batches") == "3 batches"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (dict(cores=1), "CPU (1 core)"),
        (dict(cores=16), "CPU (16 cores)"),
        (dict(cores=2, cpu_replicas=4), "4 logical CPU devices on 2 cores"),
        (dict(cores=1, cpu_replicas=1), "1 logical CPU device on 1 core"),
        # 81559 MiB (what nvidia-smi reports for an H100 80GB HBM3) / 1024 = 79.65 GiB.
        (dict(gpus=(H100, H100), cores=8), "2 x NVIDIA H100 80GB HBM3 (79.6 GiB)"),
        (dict(gpus=(H100,), cores=8), "NVIDIA H100 80GB HBM3 (79.6 GiB)"),
        (
            dict(gpus=(H100, V100, H100), cores=8),
            "2 x NVIDIA H100 80GB HBM3 (79.6 GiB), Tesla V100-SXM2-16GB (16.0 GiB)",
        ),
        # Memory unknown (no nvidia-smi): the model alone; no model either: said so.
        (dict(gpus=(GpuInfo("g0", "NVIDIA L4"),) * 2, cores=4), "2 x NVIDIA L4"),
        (dict(gpus=(GpuInfo("g0"),), cores=4), "GPU (model not reported)"),
        (
            dict(gpus=(H100,) * 8, cores=64, num_workers=4),
            "8 x NVIDIA H100 80GB HBM3 (79.6 GiB) on this worker, 4 workers in all",
        ),
        (dict(cores=2, num_workers=2), "CPU (2 cores) on this worker, 2 workers in all"),
    ],
)
def test_device_line(arguments, expected):
    assert describe_devices(**arguments) == expected


def _setup(gpus, replicas, num_workers=1):
    """What the opening line reads of a RunSetup, for a run of ``replicas`` x batch 8."""
    return SimpleNamespace(
        data=SimpleNamespace(input_hw=(416, 416), classes=["person"]),
        head=SimpleNamespace(model_type="yolov3"),
        gpus=gpus,
        replicas=replicas,
        global_batch=replicas * 8,
        communication=SimpleNamespace(describe=lambda body: "float32"),
        steps=1,
        peak_lr=1e-3,
        sync_bn=replicas > 1,
        jit_compile=False,
        precision="mixed_bfloat16",
        scales=None,
        info=WorkerInfo(True, 0, num_workers, replicas),
    )


def test_the_opening_line_names_the_gpus_and_counts_in_the_singular():
    config = SimpleNamespace(
        accumulate=1, batch_size=8, optimizer="sgd", remat="off", cpu_replicas=None
    )
    line = builders._describe(config, _setup((H100, H100), 2), body=None)
    assert line.startswith(
        "yolov3 416x416, 1 class; 2 x NVIDIA H100 80GB HBM3 (79.6 GiB); 2 replicas x 8 = global "
        "batch 16; all-reduce float32; 1 step/epoch;"
    )
    assert line.endswith("worker 1/1")
    one = builders._describe(config, _setup((), 1), body=None)
    assert f"; CPU ({plural(devices.available_cores(), 'core')}); 1 replica x 8 = " in one
    several = builders._describe(config, _setup((H100,) * 4, 8, num_workers=2), body=None)
    assert "4 x NVIDIA H100 80GB HBM3 (79.6 GiB) on this worker, 2 workers in all;" in several


def test_nvidia_smi_output_parsed():
    text = (
        "NVIDIA H200, 143771, [N/A]\n"
        "NVIDIA A100-SXM4-80GB, 81920, Enabled\n"  # split into MIG instances
        "Tesla K80, [N/A], [N/A]\n"
        "\n"
    )
    assert parse_driver_gpus(text) == (
        ("NVIDIA H200", 143771 * 2**20),
        ("NVIDIA A100-SXM4-80GB", None),
        ("Tesla K80", None),
    )
    # A name whose GPUs differ in memory is left unknown: CUDA and the driver may number them
    # differently, so no GPU can be matched to its line.
    listed = [("A", 1), ("A", 1), ("B", 1), ("B", 2), ("C", None)]
    assert memory_by_name(listed) == {"A": 1}
    assert memory_by_name(None) == {}


def test_driver_gpus_runs_nvidia_smi_and_tolerates_its_absence(monkeypatch):
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert devices.driver_gpus() is None
    monkeypatch.setattr(devices.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    asked = []

    def answers(command, **kwargs):
        asked.append(command)
        return subprocess.CompletedProcess(command, 0, "NVIDIA H200, 143771, Disabled\n", "")

    assert devices.driver_gpus(run=answers) == (("NVIDIA H200", 143771 * 2**20),)
    assert asked[0][1] == "--query-gpu=name,memory.total,mig.mode.current"

    def fails(command, **kwargs):
        return subprocess.CompletedProcess(command, 9, "", "NVIDIA-SMI has failed")

    def hangs(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"])

    assert devices.driver_gpus(run=fails) is None
    assert devices.driver_gpus(run=hangs) is None


def test_describe_gpus_adds_the_drivers_memory_by_model(monkeypatch):
    import tensorflow as tf

    found = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(2)]
    details = {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": (9, 0)}
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: found)
    monkeypatch.setattr(tf.config.experimental, "get_device_details", lambda device: details)
    listed = (("NVIDIA H100 80GB HBM3", 81559 * 2**20),) * 2
    described = describe_gpus(driver=listed)
    assert [gpu.memory_bytes for gpu in described] == [81559 * 2**20] * 2
    assert describe_devices(gpus=described, cores=1) == "2 x NVIDIA H100 80GB HBM3 (79.6 GiB)"
    assert describe_gpus(1, driver=()) == (GpuInfo(found[0].name, details["device_name"], (9, 0)),)


# A CUDA build with the driver answering and NVIDIA's wheels installed: each case below
# changes what makes TensorFlow see fewer GPUs.
CUDA = GpuSupport(
    tensorflow_version="2.21.0",
    built_with_cuda=True,
    cuda_version="12.5.1",
    cudnn_version="9",
    driver_gpus=(("NVIDIA H100 80GB HBM3", 80 * GIB),) * 4,
    cuda_wheels=True,
)


@pytest.mark.parametrize(
    ("support", "cause", "fix"),
    [
        (
            GpuSupport("2.21.0", built_with_cuda=False),
            "this TensorFlow was built without CUDA",
            'install GPU support with pip install "keras-yolo3[gpu]" (TensorFlow\'s CUDA '
            "wheels, Linux x86-64) and check nvidia-smi",
        ),
        (
            GpuSupport(**{**vars(CUDA), "cuda_visible_devices": ""}),
            "CUDA_VISIBLE_DEVICES is '', which hides every GPU",
            "list the GPUs to use in CUDA_VISIBLE_DEVICES (e.g. 0,1,2,3), or unset it",
        ),
        (
            GpuSupport(**{**vars(CUDA), "cuda_visible_devices": "-1"}),
            "CUDA_VISIBLE_DEVICES is '-1', which hides every GPU",
            "list the GPUs to use in CUDA_VISIBLE_DEVICES",
        ),
        (
            GpuSupport(**{**vars(CUDA), "cuda_visible_devices": "2,-1,3"}),
            "CUDA_VISIBLE_DEVICES is '2,-1,3', which shows at most 1 GPU",
            "or unset it",
        ),
        (
            # No driver comes first: no CUDA_VISIBLE_DEVICES would show a GPU.
            GpuSupport(**{**vars(CUDA), "driver_gpus": None, "cuda_visible_devices": "0"}),
            "no NVIDIA driver answers: nvidia-smi is missing or fails",
            "install the NVIDIA driver (nvidia-smi lists the GPUs; in a container, start it "
            "with the GPUs, e.g. docker run --gpus all), and pip install",
        ),
        (
            GpuSupport(**{**vars(CUDA), "driver_gpus": CUDA.driver_gpus[:2]}),
            "nvidia-smi lists 2 GPUs on this machine",
            "ask for fewer",
        ),
        (
            GpuSupport(**{**vars(CUDA), "cuda_wheels": False}),
            "nvidia-smi lists 4 GPUs, but TensorFlow found no CUDA 12.5.1 and cuDNN 9 "
            "libraries: NVIDIA's CUDA wheels are not installed",
            'install GPU support with pip install "keras-yolo3[gpu]"',
        ),
        (
            CUDA,
            "nvidia-smi lists 4 GPUs, but TensorFlow could not use them",
            "YOLO3_TF_LOG=1 shows TensorFlow's start-up log, which says why; check nvidia-smi "
            "and that the driver supports CUDA 12.5.1",
        ),
    ],
)
def test_missing_gpus_say_the_cause_and_the_fix(support, cause, fix):
    message = missing_gpus_message(
        "--gpus 4", requested=4, seen=0, support=support, cpu_flag="--gpus 0"
    )
    assert message.startswith(f"--gpus 4: TensorFlow 2.21.0 sees 0 GPUs ({cause}); ")
    assert fix in message
    assert message.endswith(" or run on the CPU with --gpus 0")


def test_a_visible_devices_list_long_enough_is_not_blamed():
    support = GpuSupport(**{**vars(CUDA), "cuda_visible_devices": "0,1,2,3"})
    message = missing_gpus_message(
        "--device gpu:1", requested=2, seen=1, support=support, cpu_flag="--device cpu"
    )
    assert message.startswith("--device gpu:1: TensorFlow 2.21.0 sees 1 GPU (nvidia-smi lists 4")
    assert message.endswith("or run on the CPU with --device cpu")


def test_the_check_reads_what_tensorflow_reports_only_when_short(monkeypatch):
    read = []

    def support():
        read.append(True)
        return GpuSupport("2.21.0", built_with_cuda=False)

    monkeypatch.setattr(devices, "gpu_support", support)
    check_gpu_count("--gpus 2", requested=2, seen=2, cpu_flag="--gpus 0")
    assert not read
    # --gpus N of yolo3 train: the device plan, made before TensorFlow initialises.
    with pytest.raises(ValueError, match=r"^--gpus 2: .* sees 1 GPU \(this TensorFlow was built"):
        plan_devices(["/physical_device:GPU:0"], gpus=2)
    assert read


def test_gpu_support_reads_this_tensorflow():
    import tensorflow as tf

    support = devices.gpu_support()
    assert support.tensorflow_version == tf.__version__
    assert support.built_with_cuda == tf.test.is_built_with_cuda()
    if support.built_with_cuda:
        assert support.cuda_version


def test_the_default_model_is_named_with_how_to_choose_another():
    unset = SimpleNamespace(anchors=None, weights=None, model=None)
    note = builders.default_model_note(unset)
    assert note.startswith(
        "no --model-type, --anchors or --weights: training tiny-YOLOv3 from scratch with "
        "Darknet's COCO anchors ("
    )
    assert "tiny_yolo_anchors.txt); for another, give --model-type yolov3" in note
    assert "--anchors FILE (from yolo3 kmeans), or start from --weights FILE" in note
    yolov3 = builders.default_model_note(
        SimpleNamespace(anchors=None, weights=None, model="yolov3")
    )
    assert yolov3.startswith("no --anchors or --weights: training YOLOv3 from scratch")
    assert "yolo_anchors.txt); for anchors fitted to your boxes, give --anchors FILE" in yolov3
    assert builders.default_model_note(SimpleNamespace(anchors="a.txt", weights=None)) is None
    assert builders.default_model_note(SimpleNamespace(anchors=None, weights="w.h5")) is None
