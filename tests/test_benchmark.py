"""The benchmarks: their tables, their arithmetic, and the faithfulness of the original input
that the io benchmark times."""

import colorsys
import dataclasses
import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import load_tool, make_head

from benchmarks import harness, link, original_input, scaling, train_step
from yolo3.distributed import devices
from yolo3.model.resources import read_anchors
from yolo3.model.targets import build_targets

ROOT = Path(__file__).resolve().parents[1]
IO_ROWS = (
    r"\(a\) original on the fly, 1 thread \(targets on the host",
    r"\(b\) record set pipeline, 1 thread \(targets left to the train step\)",
    r"\(b\) record set pipeline, all \d+ cores \(targets left to the train step\)",
    r"\(b'\) same, targets built in tf\.data, 1 thread",
    r"\(c\) JPEG decode only \(ceiling\), 1 thread",
    r"preprocess\.run, 1 worker",
)
TRAIN_ROWS = (
    r"\(a\) train step: uint8 \+ boxes in",
    r"\(b\) same, targets prebuilt",
    r"\(c\) bare network",
)
SCALING_ROWS = (
    r"1 process, 1 core, 1 thread",
    r"2 independent processes at once \(no communication\)",
    r"2 workers \(MultiWorkerMirroredStrategy\), K=1, float32",
    r"2 workers \(MultiWorkerMirroredStrategy\), K=1, bfloat16, local steps H=2, overlapped",
)
CAN_SHAPE = os.geteuid() == 0 and bool(shutil.which("ip")) and bool(shutil.which("tc"))
CANNOT_SHAPE = "a rate-limited loopback needs root and iproute2 (ip, tc)"
# Settings small enough for a smoke test: tiny at 64 px, a few steps.
SMALL_STEP = ["--input-size", "64", "--batch-size", "2", "--steps", "2", "--warmup-steps", "1"]
SMALL_STEP += ["--repeats", "1", "--num-classes", "3"]


def _check_rows(output, patterns):
    """Every row is printed, its figures finite and positive (min and max of one run are -)."""
    for pattern in patterns:
        line = re.search(rf"^{pattern}.*$", output, re.MULTILINE)
        assert line, f"no row {pattern!r} in\n{output}"
        figures = [float(v) for v in re.findall(r"\s(\d+\.\d+)", line.group(0))]
        assert len(figures) >= 3 and all(math.isfinite(v) and v > 0 for v in figures), line


def _check_json(path, keys):
    saved = json.loads(path.read_text())
    assert set(saved["rows"]) == set(keys)
    for row in saved["rows"].values():
        assert row["images_per_second"] > 0 and math.isfinite(row["images_per_second"])
        assert row["cpu_ms_per_image"] > 0 and math.isfinite(row["cpu_ms_per_image"])
    for ratio in saved["ratios"].values():
        assert math.isfinite(ratio["value"]) and math.isfinite(ratio["cpu_value"])
    return saved


@pytest.mark.slow
def test_io_prints_every_row_with_finite_positive_figures(tmp_path, capsys):
    json_path = tmp_path / "io.json"
    argv = ["io", "--images", "6", "--image-size", "96x128", "--input-size", "64"]
    argv += ["--copies", "1", "--batch-size", "4", "--batches", "2", "--original-images", "4"]
    argv += ["--repeats", "2", "--workers-list", "1", "--json", str(json_path)]
    assert load_tool("benchmark").main(argv) == 0

    output = capsys.readouterr().out
    assert "command:  python tools/benchmark.py io --images 6" in output
    assert "tensorflow" in output and "cores" in output
    _check_rows(output, IO_ROWS)
    for ratio in (r"\(b\)/\(a\)", r"\(b\)/\(c\)", r"\(b'\)/\(a\)"):
        assert re.search(rf"^{ratio}, 1 thread each.*(PASS|MISS)$", output, re.MULTILINE)

    keys = ("original", "records_1", "records_all", "records_targets_1", "decode_1")
    saved = _check_json(json_path, (*keys, "preprocess_1"))
    assert len(saved["rows"]["records_1"]["runs"]) == 2
    assert all(ratio["value"] > 0 for ratio in saved["ratios"].values())


def _check_speed(row, train_flops, config):
    """Step time, model FLOP/s and MFU agree with the row's images/s, the FLOPs per image and
    the peak (on the CPU only a given one)."""
    assert row["step_ms"] == pytest.approx(1000 * config["batch_size"] / row["images_per_second"])
    assert row["achieved_tflops"] == pytest.approx(train_flops * row["images_per_second"] / 1e12)
    assert row["achieved_tflops"] > 0
    peak = config["peak_tflops"]
    assert row["peak_tflops"] == peak
    assert row["mfu"] == (None if peak is None else pytest.approx(row["achieved_tflops"] / peak))


def _check_train(output, saved, variants, remat):
    """Every table of the train benchmark is printed and saved, with consistent figures."""
    _check_rows(output, TRAIN_ROWS)
    assert re.search(r"^overhead of targets \+ loss, .* <= 15% +(PASS|MISS)$", output, re.M)
    # The full step trained on real targets: its loss is a finite positive number.
    assert all(0 < run["loss"] < math.inf for run in saved["rows"]["full"]["runs"])
    config, flops = saved["config"], saved["flops"]
    # tiny at 64 px: 0.129 GFLOPs forward per image (tiny at 416 scaled by (64 / 416)^2,
    # the heads a little smaller with 3 classes); the train step 3 times that.
    assert 0.1e9 < flops["forward_per_image"] < 0.14e9
    assert flops["train_step_per_image"] == 3 * flops["forward_per_image"]
    assert f"{flops['forward_per_image'] / 1e9:.3f} GFLOPs forward per image" in output
    for row in saved["rows"].values():
        _check_speed(row, flops["train_step_per_image"], config)
    assert set(saved["variants"]) == set(variants)
    for key, row in saved["variants"].items():
        assert "error" not in row, row
        assert key == f"{row['precision']}_xla_{row['xla']}"
        _check_speed(row, flops["train_step_per_image"], config)
        _check_rows(output, [re.escape(row["label"])])
    # The float32 variant at (a)'s XLA setting is (a) itself.
    assert saved["variants"]["float32_xla_off"]["runs"] == saved["rows"]["full"]["runs"]
    assert set(saved["memory"]) == set(remat)
    for remat_setting, row in saved["memory"].items():
        _check_speed(row, flops["train_step_per_image"], config)
        assert row["peak_rss_bytes"] > row["rss_before_steps_bytes"] > 0
        assert row["rss_growth_bytes"] == row["peak_rss_bytes"] - row["rss_before_steps_bytes"]
        line = re.search(rf"^remat {remat_setting} .*$", output, re.M).group(0)
        assert f"{row['peak_rss_bytes'] / 2**20:.0f}" in line.split()


@pytest.mark.slow
def test_train_prints_the_steps_variants_flops_and_memory(tmp_path, capsys):
    # One run for every table: each precision against a given peak (XLA's variants are
    # the same code with jit_compile; XLA itself: tests/test_xla.py), and the peak memory of
    # a remat setting in a process of its own (one: every setting's round is the same code
    # with its --remat; remat's own numbers: tests/test_remat.py).
    json_path = tmp_path / "train.json"
    argv = ["train", *SMALL_STEP, "--precisions", "float32", "float16", "--xla", "off"]
    argv += ["--remat", "full", "--peak-tflops", "2"]
    assert load_tool("benchmark").main([*argv, "--json", str(json_path)]) == 0

    output = capsys.readouterr().out
    saved = _check_json(json_path, ("full", "loss_only", "bare"))
    variants = [f"{p}_xla_off" for p in ("float32", "float16")]
    _check_train(output, saved, variants, ("full",))
    assert saved["rows"]["full"]["mfu"] > 0
    assert "MFU against 2 TFLOP/s (--peak-tflops)" in output
    # Without a peak (the CPU's, with no --peak-tflops: test_speed_figures_and_mfu_by_hand)
    # the report says there is no MFU.
    for row in (*saved["rows"].values(), *saved["variants"].values()):
        row["peak_tflops"] = None
    assert "unknown: no MFU (--peak-tflops)" in train_step.format_train(saved)


def _memory_rounds(config):
    """Three memory rounds in a fresh process: two reading CPU:0's allocator, one without."""
    return [
        train_step._memory_round(config, "large", 0, device="CPU:0"),
        train_step._memory_round(config, "large", 1, device="CPU:0"),
        train_step._memory_round(config, "large", 2),
    ]


def test_memory_round_reads_the_accelerator_allocator(monkeypatch):
    """The branch a GPU takes, forced with the CPU's allocator (which reports zeros).

    The CPU allocator keeps statistics only as TensorFlow's BFC allocator, whose default
    depends on the CPU (on here with some x86 CPUs, off with others): the rounds run in a
    process that asks for it before TensorFlow starts.
    """
    anchors = tuple(map(tuple, read_anchors(ROOT / "model_data" / "tiny_yolo_anchors.txt")))
    config = train_step.TrainStepConfig(
        anchors=anchors, input_size=64, batch_size=2, num_classes=3, steps=1, warmup_steps=1
    )
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "true")
    first, second, third = harness.run_spawned(_memory_rounds, config=config)
    for figures in (first, second):
        assert figures["gpu_peak_bytes"] >= 0 and figures["gpu_in_use_bytes"] >= 0
        assert figures["peak_rss_bytes"] >= figures["rss_before_steps_bytes"] > 0
    assert 0 < second["loss"] < math.inf
    # Without a device (the CPU's default) there are no allocator figures.
    assert "gpu_peak_bytes" not in third


def test_speed_figures_and_mfu_by_hand():
    config = train_step.TrainStepConfig(anchors=((10, 14),) * 6, batch_size=8)
    h100 = devices.GpuInfo("/physical_device:GPU:0", "NVIDIA H100 80GB HBM3", (9, 0))
    speed = train_step._peak(config, (h100,), "bfloat16") | {"train_flops": 16.7e9}
    assert speed["peak_tflops"] == 989.4
    row = {"images_per_second": 4000.0}
    train_step._add_speed(row, config, speed)
    # 8 images at 4000/s: 2 ms a step; 16.7 GFLOPs x 4000/s = 66.8 TFLOP/s, 6.75% of 989.4.
    assert row["step_ms"] == pytest.approx(2.0)
    assert row["achieved_tflops"] == pytest.approx(66.8)
    assert row["mfu"] == pytest.approx(66.8 / 989.4)
    # A given peak wins over the data sheet; the CPU has none.
    given = dataclasses.replace(config, peak_tflops=100.0)
    assert train_step._peak(given, (h100,), "float32")["peak_tflops"] == 100.0
    assert train_step._peak(config, (), "float32") == {
        "peak_tflops": None,
        "peak_source": None,
    }


def test_format_train_shows_gpu_memory_and_a_variant_that_failed():
    config = train_step.TrainStepConfig(anchors=((10, 14),) * 6, batch_size=2)
    speed = {"peak_tflops": 10.0, "peak_source": "--peak-tflops", "train_flops": 5e9}
    run = {"images_per_second": 200.0, "cpu_ms_per_image": 9.0, "loss": 1.0}
    memory = {"peak_rss_bytes": 3 * 2**30, "rss_before_steps_bytes": 2**30}
    memory |= {"gpu_peak_bytes": 5 * 2**30, "gpu_in_use_bytes": 2**30}

    def row(label, extra=None):
        summary = harness.summarize(label, [run | (extra or {})], 2)
        train_step._add_speed(summary, config, speed)
        return summary

    rows = {kind: row(f"({kind})") for kind in train_step.KINDS}
    failed = {"precision": "float16", "xla": "on", "label": "float16, XLA on"}
    result = {
        "command": "benchmark train",
        "machine": {"cores": 2, "cpu": "cpu", "gpus": ["GPU:0"], "python": "3", "tensorflow": "2"},
        "load_average_start": None,
        "load_average_end": None,
        "config": dataclasses.asdict(config),
        "flops": {"forward_per_image": 5e9 / 3, "train_step_per_image": 5e9},
        "rows": rows,
        "jit_compile": True,
        "ratios": {},
        "variants": {
            "float32_xla_on": {"precision": "float32", "xla": "on", **row("float32, XLA on")},
            "float16_xla_on": failed | {"error": "InternalError: no kernel"},
        },
        "memory": {"off": row("remat off", memory)},
    }
    result["machine"] |= {"keras": "3", "numpy": "2", "pillow": "1"}
    result["flops"]["train_step_factor"] = 3
    result["memory"]["off"] |= memory | {"rss_growth_bytes": 2 * 2**30}
    text = train_step.format_train(result)
    # 200 images/s x 5 GFLOPs = 1 TFLOP/s, 10% of the given 10; batch 2 at 200/s: 10 ms.
    assert re.search(r"^float32, XLA on +200\.0 +- +- +10\.0 +1 +10%$", text, re.M)
    assert re.search(r"^float16, XLA on +failed", text, re.M)
    assert "  float16, XLA on: InternalError: no kernel" in text
    assert "MFU against 10 TFLOP/s (--peak-tflops)" in text
    # MiB: peak RSS 3072, growth 2048, GPU peak 5120, in use before the steps 1024.
    assert re.search(r"^remat off +200\.0 +10\.0 +1 +3072 +2048 +5120 +1024$", text, re.M)


def test_precisions_default_to_float16_only_with_a_gpu():
    gpu = devices.GpuInfo("/physical_device:GPU:0", "NVIDIA A100-SXM4-40GB", (8, 0))
    assert train_step.default_precisions(()) == ("float32", "bfloat16")
    assert train_step.default_precisions((gpu,)) == ("float32", "bfloat16", "float16")


@pytest.mark.slow
@pytest.mark.skipif(not CAN_SHAPE, reason=CANNOT_SHAPE)
def test_scaling_on_a_shaped_link_compares_settings(tmp_path, capsys):
    # Two settings run: the plain all-reduce and overlapped local steps (the model's two
    # formulas). The figures of the others (accumulation in bfloat16, PowerSGD) come from the
    # same worker code: test_scaling_traffic_of_every_setting.
    json_path = tmp_path / "scaling.json"
    argv = ["scaling", *SMALL_STEP, "--json", str(json_path)]
    # Epochs of 4 steps, H = 2, T = 1: the first period's change sent in step 3, the second
    # period's synchronised at the epoch's end.
    argv += ["--steps", "4", "--link", "1gbit", "--settings", "1:float32", "1:bfloat16:overlap2/1"]
    argv += ["--rtt", "2ms"]  # the workers reach each other through the delay line
    assert load_tool("benchmark").main(argv) == 0

    output = capsys.readouterr().out
    _check_rows(output, SCALING_ROWS)
    assert re.search(r"^scaling efficiency, 2 workers .*K=1, float32 .* >= 90% +(PASS|MISS)$",
                     output, re.M)  # fmt: skip
    keys = ("single", "independent", "workers_1_float32", "workers_1_bfloat16_overlap2t1")
    saved = _check_json(json_path, keys)
    assert saved["ratios"]["ceiling"]["passed"] is None  # informative
    assert saved["sync_bn_workers"] is True and saved["sync_bn_single"] is False
    plain = saved["communication"]["workers_1_float32"]
    local = saved["communication"]["workers_1_bfloat16_overlap2t1"]
    # What the workers counted is what the same setting's trainer counts here.
    assert plain == {**plain, **_figures_of((1, "float32", 0, 0, False), plain, steps=4)}
    assert local == {**local, **_figures_of((1, "bfloat16", 0, 2, 1), local, steps=4)}
    assert plain["sync_bn"] is True and local["sync_bn"] is False
    # Counted in the compiled steps: the plain step's gradient all-reduce, its synchronised
    # batch norms' gathers and reduces and its logs' all-reduce; local steps' logs only.
    assert plain["collectives_per_step"] > local["collectives_per_step"] >= 1
    assert plain["round_trip_seconds"] == 0.002 and len(plain["peak_rss_mib"]) == 2
    assert min(plain["peak_rss_mib"]) > 100  # MiB: TensorFlow and the model are in there
    assert "2ms apart" in output
    assert "local steps H=2, overlapped over 1 step" in local["label"]
    assert plain["predicted_step_seconds"] > plain["compute_seconds"] > 0
    assert local["measured_step_seconds"] > 0
    for figures in (plain, local):  # whole epochs: the epoch end's synchronisation included
        assert figures["measured_epoch_seconds"] > 3 * figures["measured_step_seconds"]
        assert figures["predicted_epoch_seconds"] > 0 and figures["wall_of_ceiling"] > 0
    assert re.search(r"^by wall time, 2 workers .*overlapped over 1 step .* >= 90% +(PASS|MISS)$",
                     output, re.M)  # fmt: skip
    assert link.RateLimitedLoopback("1gbit").name not in _namespaces_left()


def _figures_of(setting, measured=None, steps=2):
    """The communication figures of ``setting`` for 2 workers at SMALL_STEP (epochs of
    ``steps``) on a 1 Gbit/s link, from the workers' own code (their trainer, its traffic,
    the link model), with ``measured``'s compute, step and epoch seconds (made up when
    None)."""
    step = train_step.TrainStepConfig(
        anchors=tuple(map(tuple, read_anchors(ROOT / "model_data/tiny_yolo_anchors.txt"))),
        input_size=64, batch_size=2, num_classes=3, steps=2, warmup_steps=1, repeats=1,
    )  # fmt: skip
    config = scaling.ScalingConfig(step=step, link="1gbit", settings=(setting,))
    job = scaling._job(config.settings[0])
    trainer, _, _ = scaling._build_worker_step(config, job, replicas=2)
    traffic = {**scaling._traffic(trainer, job, 2), "sync_bn": scaling._sync_bn_channels(
        trainer.body) > 0}  # fmt: skip
    measured = measured or {"compute_seconds": 0.1, "measured_step_seconds": 0.2}
    figures = scaling._communication(
        traffic, workers=2, images_per_step=2 * step.batch_size * job["accumulate"],
        compute_seconds=measured["compute_seconds"],
        measured_seconds=measured["measured_step_seconds"], bits_per_second=1e9,
        rtt=measured.get("round_trip_seconds", 0.0),
        collectives=measured.get("collectives_per_step", 0), local_steps=job["local_steps"],
        overlap=job["overlap_sync"], steps=steps,
        epoch_compute_seconds=measured.get("epoch_compute_seconds"),
        measured_epoch_seconds=measured.get("measured_epoch_seconds"),
    )  # fmt: skip
    del figures["synchronisation"]  # timed by the workers alone
    return figures


def test_scaling_traffic_of_every_setting():
    plain = _figures_of((1, "float32", 0, 0, False))
    tuned = _figures_of((2, "bfloat16", 0, 0, False))
    compressed = _figures_of((1, "float32", 2, 0, False))
    local = _figures_of((1, "bfloat16", 0, 2, 1))
    # bfloat16 halves the gradient; two micro-batches per step halve it again per image.
    assert tuned["gradient_bytes"] * 2 == plain["gradient_bytes"]
    assert tuned["bytes_per_image"] < plain["bytes_per_image"] / 3.5
    # Rank 2 factors in place of tiny's kernels: far fewer bytes, the same batch-norm bytes.
    assert compressed["gradient_bytes"] < plain["gradient_bytes"] / 50
    assert compressed["batch_norm_bytes"] == plain["batch_norm_bytes"] > 0
    # Every weight (batch-norm statistics too) in bfloat16 once per two steps, and no
    # synchronised batch norm.
    assert plain["gradient_bytes"] / 4 < local["gradient_bytes"] < plain["gradient_bytes"] / 3
    assert local["batch_norm_bytes"] == 0 and local["sync_bn"] is False
    for figures in (plain, tuned, compressed):
        assert figures["predicted_step_seconds"] > figures["compute_seconds"] > 0
    # An epoch of 2 steps with H = 2: one period, which the epoch end synchronises in full
    # (2 steps' worth of bytes); no chunk travels beside a step.
    on_link, compute = 8 * local["bytes_on_link_per_step"] / 1e9, local["compute_seconds"]
    assert local["predicted_step_seconds"] == compute
    assert local["predicted_epoch_seconds"] == pytest.approx(2 * compute + 2 * on_link)
    # The report's labels.
    assert scaling._setting_text((1, "float32", 2, 0, False)) == ", PowerSGD rank 2"
    assert scaling._setting_text((1, "bfloat16", 0, 2, 1)) == (
        ", local steps H=2, overlapped over 1 step"
    )


def test_the_link_model_of_whole_epochs():
    # Hand-derived: epochs of 8 steps, 0.1 s of computation a step in the window (0.12 s a
    # step over a whole epoch), 0.3 s of link time for a step's all-reduce or for one
    # synchronisation of local steps.
    times = dict(steps=8, compute=0.1, epoch_compute=0.12, link=0.3)
    # All-reduce: each step computes, then sends.
    assert scaling.predicted_seconds(**times) == pytest.approx((0.4, 8 * 0.42))
    # H = 4, blocking: 2 synchronisations, the first within the window of 7 steps, the
    # second at the epoch's end.
    step, epoch = scaling.predicted_seconds(**times, local_steps=4)
    assert (step, epoch) == pytest.approx((0.1 + 0.3 / 7, 0.96 + 0.6))
    # Overlapped over T = 2: the second period's first 2 steps each carry half of the first
    # period's change, 0.15 s of link beside 0.1 s of computation (0.05 s waited each); the
    # epoch's end synchronises in full.
    step, epoch = scaling.predicted_seconds(**times, local_steps=4, overlap=2)
    assert (step, epoch) == pytest.approx((0.1 + 0.1 / 7, 0.96 + 0.1 + 0.3))
    # Over T = 4, each chunk's 0.075 s hides behind its step's computation.
    step, epoch = scaling.predicted_seconds(**times, local_steps=4, overlap=4)
    assert (step, epoch) == pytest.approx((0.1, 0.96 + 0.3))


def test_the_link_model_counts_round_trips():
    # Hand-derived: 4 workers 10 ms apart, so a ring collective waits 2 x 3 round trips,
    # 0.06 s; a step of 0.1 s of computation whose bytes take 0.3 s (on the one shaped
    # loopback: 2 x 3 x 6.25 MB at 1 Gbit/s) and which holds 2 collectives.
    assert scaling.round_trips(4, 1) == 6 and scaling.round_trips(2, 3) == 6
    traffic = {"gradient_bytes": 6.25e6, "batch_norm_bytes": 0}
    common = dict(workers=4, images_per_step=8, compute_seconds=0.1, measured_seconds=0.5,
                  bits_per_second=1e9, rtt=0.01, collectives=2, steps=8,
                  epoch_compute_seconds=0.12)  # fmt: skip
    plain = scaling._communication(traffic, **common)
    assert plain["predicted_step_seconds"] == pytest.approx(0.1 + 0.3 + 2 * 0.06)
    assert plain["predicted_epoch_seconds"] == pytest.approx(8 * (0.12 + 0.3 + 2 * 0.06))
    # Local steps, H = 4, blocking, the step's own collective its logs': each step waits
    # one collective's round trips; each synchronisation sends 4 steps' bytes in one.
    local = scaling._communication(traffic, **{**common, "collectives": 1}, local_steps=4)
    sync = 4 * 0.3 + 0.06
    assert local["predicted_step_seconds"] == pytest.approx(0.1 + 0.06 + sync / 7)
    assert local["predicted_epoch_seconds"] == pytest.approx(8 * (0.12 + 0.06) + 2 * sync)
    # Overlapped over T = 2: each chunk step takes its chunk's bytes and round trips.
    overlapped = scaling._communication(
        traffic, **{**common, "collectives": 1}, local_steps=4, overlap=2
    )
    waits = 2 * (4 * 0.3 / 2 + 0.06 - 0.16)
    assert overlapped["predicted_step_seconds"] == pytest.approx(0.16 + waits / 7)


def test_more_workers_than_cores_share_them_in_turn():
    cores = sorted(os.sched_getaffinity(0))
    plan = scaling._cores(2 * len(cores) + 1)
    assert plan == (cores * 3)[: 2 * len(cores) + 1]  # W / C to a core, the first one more


def test_workers_reach_each_other_a_round_trip_apart():
    import socket  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    payload = np.random.default_rng(0).bytes(300_000)
    with link.RateLimitedLoopback("none", "100ms").cluster(2) as addresses:
        # Each worker's own entry is its server's port; the other's, a relay port.
        ports = [[int(a.rpartition(":")[2]) for a in listed] for listed in addresses]
        assert len({ports[0][0], ports[1][1], ports[0][1], ports[1][0]}) == 4
        server = socket.create_server(("127.0.0.1", ports[1][1]))  # worker 1's server

        def echo():
            connection, _ = server.accept()
            with connection:
                while data := connection.recv(1 << 16):
                    connection.sendall(data)

        thread = threading.Thread(target=echo, daemon=True)
        thread.start()
        with socket.create_connection(("127.0.0.1", ports[0][1])) as client:  # worker 0's way
            start = time.perf_counter()
            client.sendall(b"x")
            assert client.recv(1) == b"x"
            round_trip = time.perf_counter() - start
            client.sendall(payload)
            received = b""
            while len(received) < len(payload):
                received += client.recv(1 << 16)
        server.close()
    assert 0.1 <= round_trip < 0.2, round_trip
    assert received == payload


def _namespaces_left():
    import subprocess  # noqa: PLC0415

    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line for line in listed.splitlines() if line.startswith("yolo3-link-")]


@pytest.mark.skipif(not CAN_SHAPE, reason=CANNOT_SHAPE)
def test_shaped_loopback_limits_the_rate_and_is_removed_even_after_a_failure():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    # 4 MB from a client to a server on 127.0.0.1 inside the namespace.
    probe = (
        "import socket, threading, time\n"
        "server = socket.create_server(('127.0.0.1', 0)); port = server.getsockname()[1]\n"
        "def drain():\n"
        "    connection, _ = server.accept()\n"
        "    while connection.recv(1 << 16): pass\n"
        "thread = threading.Thread(target=drain); thread.start()\n"
        "client = socket.create_connection(('127.0.0.1', port)); start = time.perf_counter()\n"
        "client.sendall(b'x' * (4 << 20)); client.close(); thread.join()\n"
        "print(8 * (4 << 20) / (time.perf_counter() - start))\n"
    )
    with link.RateLimitedLoopback("20mbit") as shaped:
        completed = subprocess.run(
            shaped.command([sys.executable, "-c", probe]), capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert completed.returncode == 0, completed.stderr
        # Unshaped, this loopback carries gigabits per second.
        assert float(completed.stdout) < 40e6
        assert shaped.name in _namespaces_left()
    assert shaped.name not in _namespaces_left()
    with pytest.raises(RuntimeError), link.RateLimitedLoopback("20mbit") as shaped:
        raise RuntimeError("a benchmark process failed")
    assert shaped.name not in _namespaces_left()
    # A benchmark ended by SIGTERM removes its namespace too.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from benchmarks.link import RateLimitedLoopback\n"
         "with RateLimitedLoopback('20mbit') as shaped:\n"
         "    print(shaped.name, flush=True); time.sleep(60)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    name = holder.stdout.readline().strip()
    assert name in _namespaces_left()
    holder.terminate()
    assert holder.wait(timeout=30) == 128 + 15
    assert name not in _namespaces_left()


def test_link_rates_and_settings_are_checked(capsys, monkeypatch):
    assert link.parse_rate("100mbit") == 1e8 and link.parse_rate("1.5gbit") == 1.5e9
    assert link.parse_rate("none") is None
    for bad in ("100", "100mbps", "fast", "0mbit"):
        with pytest.raises(ValueError, match="--link"):
            link.parse_rate(bad)
    tool = load_tool("benchmark")
    assert tool.main(["scaling", "--link", "100mbps"]) == 2
    assert "--link '100mbps'" in capsys.readouterr().err
    assert tool.main(["scaling", "--settings", "0:float32"]) == 2
    assert "K:DTYPE" in capsys.readouterr().err
    assert tool.main(["scaling", "--settings", "4:int8"]) == 2
    assert "--allreduce-dtype" in capsys.readouterr().err
    bad_methods = ("powersgd0", "zip4", "powersgd", "local0", "overlap0", "overlap", "overlap2/3")
    bad_methods += ("overlap2/0", "overlap2/x", "local2/1")
    for bad in (f"1:float32:{method}" for method in bad_methods):
        assert tool.main(["scaling", "--settings", bad]) == 2
        assert "powersgdR" in capsys.readouterr().err
    assert tool.main(["scaling", "--steps", "6", "--settings", "1:bfloat16:local4"]) == 2
    assert "--steps 6 must be a multiple of H" in capsys.readouterr().err
    # Without root the shaped link cannot be made: one line and status 2, nothing started.
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert tool.main(["scaling", *SMALL_STEP, "--link", "100mbit"]) == 2
    assert "needs root" in capsys.readouterr().err


def _runs(speeds, cpu):
    return {"runs": [{"images_per_second": s, "cpu_ms_per_image": c} for s, c in zip(speeds, cpu)]}


def test_scaling_combines_workers_in_lockstep():
    # Two workers, 3 steps of 4 images each: 24 images in the slower worker's 2 s -> 12/s;
    # CPU: 1.5 s + 2.5 s = 4 s over 24 images -> 166.67 ms per image.
    results = [
        {"windows": [{"steps": 3, "seconds": 1.5, "cpu_seconds": 1.5}], "accumulate": 1},
        {"windows": [{"steps": 3, "seconds": 2.0, "cpu_seconds": 2.5}], "accumulate": 1},
    ]
    (figures,) = scaling._windows(results, batch_size=4)
    assert figures["images_per_second"] == pytest.approx(12.0)
    assert figures["cpu_ms_per_image"] == pytest.approx(4000 / 24)
    assert figures["step_seconds"] == pytest.approx(2.0 / 3)
    # Two micro-batches per optimizer step: twice the images in the same steps.
    for result in results:
        result["accumulate"] = 2
    (figures,) = scaling._windows(results, batch_size=4)
    assert figures["images_per_second"] == pytest.approx(24.0)


def test_overhead_is_the_median_of_the_ratios_within_rounds():
    # Rounds 1 and 3: 8 images/s against 10, 0.125 s against 0.1 s per image, 25% more;
    # round 2 under load, both at half speed: still 25%. Round 4: 10% (11 against 10).
    # Median of 25, 25, 25, 10 = 25%. CPU: 60/50, 60/50, 30/25, 55/50 -> median 20%.
    full = _runs([8.0, 4.0, 8.0, 10.0], [60.0, 60.0, 30.0, 55.0])
    bare = _runs([10.0, 5.0, 10.0, 11.0], [50.0, 50.0, 25.0, 50.0])
    ratio = train_step._overhead("overhead", full, bare, 0.15)
    assert ratio["value"] == pytest.approx(0.25) and ratio["cpu_value"] == pytest.approx(0.2)
    assert ratio["passed"] is False
    assert harness._cells(ratio) == ["+25.0%", "+20.0%", "<= 15%", "MISS"]
    info = train_step._overhead("loss", full, bare, None)
    assert info["passed"] is None and harness._cells(info)[2:] == ["-", "info"]


def test_configs_reject_settings_they_cannot_run():
    tiny_anchors = ((10, 14),) * 6
    with pytest.raises(ValueError, match="--model-type yolov3 needs 9 anchors; 6 given"):
        train_step.TrainStepConfig(anchors=tiny_anchors, model="yolov3")
    with pytest.raises(ValueError, match="--input-size 100 is not a positive multiple of 32"):
        train_step.TrainStepConfig(anchors=tiny_anchors, input_size=100)
    with pytest.raises(ValueError, match="--steps 0 must be >= 1"):
        train_step.TrainStepConfig(anchors=tiny_anchors, steps=0)
    with pytest.raises(ValueError, match="--precisions float32 float32: give each of"):
        train_step.TrainStepConfig(anchors=tiny_anchors, precisions=("float32", "float32"))
    with pytest.raises(ValueError, match=r"--xla \(none\): give each of \['off', 'on'\]"):
        train_step.TrainStepConfig(anchors=tiny_anchors, xla=())
    with pytest.raises(ValueError, match="--remat some: give each of"):
        train_step.TrainStepConfig(anchors=tiny_anchors, remat=["some"])
    with pytest.raises(ValueError, match="--peak-tflops 0 must be > 0"):
        train_step.TrainStepConfig(anchors=tiny_anchors, peak_tflops=0)
    # Read back from JSON, the lists become tuples again.
    read_back = train_step.TrainStepConfig(anchors=tiny_anchors, remat=["off", "full"])
    assert read_back.remat == ("off", "full")
    step = train_step.TrainStepConfig(anchors=tiny_anchors)
    with pytest.raises(ValueError, match="--workers 1: compare at least 2"):
        scaling.ScalingConfig(step=step, workers=1)
    with pytest.raises(ValueError, match="--steps 1: an epoch needs 2 steps or more"):
        scaling.ScalingConfig(step=step)
    with pytest.raises(ValueError, match="--straggler 1.5: give the last worker's share"):
        scaling.ScalingConfig(step=dataclasses.replace(step, steps=2), straggler=1.5)
    with pytest.raises(ValueError, match="--rtt '3x': use a round-trip time"):
        scaling.ScalingConfig(step=dataclasses.replace(step, steps=2), rtt="3x")


def test_tool_reports_bad_flags_with_status_2(capsys):
    assert load_tool("benchmark").main(["train", "--input-size", "100"]) == 2
    assert "--input-size 100 is not a positive multiple of 32" in capsys.readouterr().err


def test_original_colour_conversions_match_colorsys():
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (500, 3))
    pixels[:20] = pixels[:20, :1]  # grays
    pixels[20:40, 1] = pixels[20:40, 0]  # ties between red and green
    rgb = pixels / 255.0
    expected = np.array([colorsys.rgb_to_hsv(*p) for p in rgb])
    hsv = original_input.rgb_to_hsv_float64(rgb)
    np.testing.assert_allclose(hsv, expected, atol=1e-12)
    hsv[:10, 0] = 1.0  # the top of the hue range wraps to red, as in colorsys
    expected = np.array([colorsys.hsv_to_rgb(*p) for p in hsv])
    np.testing.assert_allclose(original_input.hsv_to_rgb_float64(hsv), expected, atol=1e-12)


def test_original_targets_match_build_targets():
    anchors = read_anchors(ROOT / "model_data" / "yolo_anchors.txt")
    rng = np.random.default_rng(1)
    boxes = np.zeros((4, 6, 5), np.float32)
    for image in range(4):
        for row in range(rng.integers(1, 6)):
            # Centres at 8k + 4 lie mid-cell at every stride, and even sides keep the
            # original's floored centre exact, so both rules see the same cell.
            centre = 8 * rng.integers(4, 48, 2) + 4
            half = rng.integers(2, 100, 2)
            boxes[image, row] = [*(centre - half), *(centre + half), rng.integers(80)]
    expected = build_targets(boxes, input_hw=(416, 416), head=make_head(anchors, 80))
    original = original_input.preprocess_true_boxes(boxes, (416, 416), anchors, 80)
    assert sum(float(level[..., 4].sum()) for level in original) > 4
    for level, reference in zip(original, expected):
        np.testing.assert_allclose(level, reference.numpy(), rtol=1e-6)


@pytest.mark.skipif(os.geteuid() != 0, reason="a cgroup with a CPU quota needs root")
def test_a_cpu_limit_holds_its_process_to_its_share_and_is_removed():
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from benchmarks.cpu_limit import CpuLimit  # noqa: PLC0415

    # One second of a busy loop: the CPU seconds it got over the wall-clock seconds.
    spin = (
        "import time\n"
        "start = time.perf_counter(); cpu = time.process_time()\n"
        "while time.perf_counter() - start < 1.0: pass\n"
        "print((time.process_time() - cpu) / (time.perf_counter() - start))\n"
    )
    with CpuLimit(0.3) as limit:
        completed = subprocess.run(
            [sys.executable, "-c", spin], preexec_fn=limit.join, capture_output=True,
            text=True, timeout=60, check=True,
        )  # fmt: skip
        folder = limit.path
        assert folder.is_dir()
    assert float(completed.stdout) < 0.4  # a whole core, or what the machine left it, unlimited
    assert not folder.exists()


def test_the_prediction_beyond_this_machine_by_hand():
    from benchmarks import prediction  # noqa: PLC0415

    # A 1 s GPU step; 100 MB of gradient a step in float32 (local steps: a 64th of it a
    # step, all of it once per 64); 16 workers, each on a 1 Gbit/s link of its own, 25 ms
    # apart. A worker sends 2 x 15 / 16 of the tensor: 1.5 s for 100 MB; a ring collective
    # waits 2 x 15 round trips, 0.75 s.
    load = prediction.Workload(
        "made-up", 1.0,
        {label: 1e8 / (setting[3] or 1) for label, setting in prediction.SETTINGS}, "by hand",
    )  # fmt: skip
    cell = dict(workers=16, bits_per_second=1e9, rtt=0.025)
    # Plain: 3 collectives a step.
    plain = prediction.efficiency(load, "plain, float32", **cell, collectives=3)
    assert plain == pytest.approx(1 / (1 + 1.5 + 3 * 0.75))
    # Eight micro-batches a step: the same traffic for 8 s of computation.
    accumulated = prediction.efficiency(load, "--accumulate 8, bfloat16", **cell, collectives=3)
    assert accumulated == pytest.approx(8 / (8 + 1.5 + 3 * 0.75))
    # Local steps: every step waits its own collective (0.75 s); every 64 steps one
    # synchronisation, 1.5 s of bytes and 0.75 s of round trips.
    local = prediction.efficiency(load, "--local-steps 64, bfloat16", **cell, collectives=1)
    assert local == pytest.approx(64 / (64 * 1.75 + 1.5 + 0.75))
    # The table names the best setting of each cell, the simplest of equals.
    table = prediction.predict({"all_reduce": 3, "local": 1})
    assert len(table["rows"]) == 2 * 4 * 2 * 3
    for row in table["rows"]:
        best = row["efficiency"][row["recommended"]]
        assert best >= max(row["efficiency"].values()) - 0.005
        assert 0 < min(row["efficiency"].values()) and best <= 1
    assert table["bytes_per_step"]["yolov3"]["plain, float32"] > 2.4e8  # 62 M parameters


def test_recipe_summary_is_the_mean_and_half_range_of_the_seeds():
    from benchmarks import recipe

    runs = [
        {"setting": "a", "seed": 0, "AP": 0.4, "AP50": 0.9, "AP75": 0.3, "mAP50": 0.8,
         "train_seconds": 100.0},
        {"setting": "a", "seed": 1, "AP": 0.5, "AP50": 0.8, "AP75": None, "mAP50": 0.9,
         "train_seconds": 120.0},
    ]  # fmt: skip
    row = recipe.summarize("a", runs)
    assert row["AP"] == pytest.approx(0.45) and row["AP_half_range"] == pytest.approx(0.05)
    assert row["AP75"] == pytest.approx(0.3) and row["AP75_half_range"] == 0  # one value
    table = recipe.format_recipe({"settings": [row]})
    assert (
        "| a | 2 | 0.450 ± 0.050 | 0.850 ± 0.050 | 0.300 ± 0.000 | 0.850 ± 0.050 | 110 |" in table
    )
    assert recipe.parse_setting("ciou=--iou-loss ciou") == ("ciou", ("--iou-loss", "ciou"))
    with pytest.raises(ValueError, match="not NAME=FLAGS"):
        recipe.parse_setting("--iou-loss ciou")


def test_recipe_curve_reads_the_runs_results_file_and_averages_the_seeds(tmp_path):
    """A run's curve is what ``yolo3 train`` wrote to results.csv (by its own writer), an
    epoch without AP kept as None; the setting's curve is the seeds' mean at the epochs
    both scored."""
    from benchmarks import recipe
    from yolo3.callbacks.results import write_results

    epochs = [
        {"epoch": 1, "seconds": 10.0, "loss": 9.0},
        {"epoch": 2, "seconds": 20.5, "loss": 5.0, "val_AP": 0.25, "val_mAP50": 0.5},
        {"epoch": 3, "seconds": 30.0, "loss": 4.0, "val_AP": 0.5},
    ]
    write_results(tmp_path / "a", epochs)
    write_results(tmp_path / "b", [{**epochs[1], "seconds": 22.5, "val_AP": 0.35}])
    first = recipe.curve(tmp_path / "a")
    assert first == [
        {"epoch": 1, "seconds": 10.0, "AP": None},
        {"epoch": 2, "seconds": 20.5, "AP": 0.25},
        {"epoch": 3, "seconds": 30.0, "AP": 0.5},
    ]
    assert recipe.curve(tmp_path / "missing") == []
    runs = [
        {"setting": "a", "seed": seed, "AP": 0.5, "AP50": 0.9, "AP75": 0.4, "mAP50": 0.9,
         "train_seconds": 30.0, "curve": recipe.curve(tmp_path / folder)}
        for seed, folder in enumerate("ab")
    ]  # fmt: skip
    row = recipe.summarize("a", runs)
    assert row["curve"] == [{"epoch": 2, "seconds": pytest.approx(21.5), "AP": pytest.approx(0.3)}]


def _accuracy_run(setting, seed, maps, final, step=10.0):
    curve = [{"epoch": e + 1, "seconds": step * (e + 1), "mAP50": m} for e, m in enumerate(maps)]
    final = {"mAP50": final, "AP": final / 2, "AP50": final, "AP75": final / 3}
    return {"setting": setting, "seed": seed, "curve": curve, "final": final}


def test_time_to_target_crosses_between_the_epochs_around_it():
    from benchmarks.accuracy import time_to_target

    curve = [{"seconds": 10.0, "mAP50": 0.2}, {"seconds": 20.0, "mAP50": 0.6},
             {"seconds": 30.0, "mAP50": 0.8}]  # fmt: skip
    assert time_to_target(curve, 0.5) == pytest.approx(17.5)  # 3/4 of the way from 0.2 to 0.6
    assert time_to_target(curve, 0.1) == 10.0  # the first point already reaches it
    assert time_to_target(curve, 0.8) == 30.0
    assert time_to_target(curve, 0.81) is None


def test_accuracy_summary_pairs_seeds_against_the_reference_and_one_worker_alone():
    from benchmarks import accuracy

    config = accuracy.AccuracyConfig(
        settings=(("sync", ()), ("local", ("--local-steps", "8"))), work="w", seeds=(0, 1),
        epochs=3,
    )  # fmt: skip
    runs = [
        _accuracy_run("sync", 0, [0.3, 0.6, 0.82], 0.90),
        _accuracy_run("sync", 1, [0.3, 0.6, 0.78], 0.86),
        _accuracy_run("local", 0, [0.2, 0.5, 0.79], 0.85, step=6.0),
        _accuracy_run("local", 1, [0.2, 0.4, 0.70], 0.83, step=6.0),
        _accuracy_run("alone", 0, [0.4, 0.7, 0.80], 0.88, step=12.0),
        _accuracy_run("alone", 1, [0.4, 0.7, 0.80], 0.88, step=12.0),
    ]
    result = accuracy.summarize(runs, config)
    # The target: the reference's mean last point (0.80) less the margin.
    assert result["reference"] == "sync" and result["target"] == pytest.approx(0.78)
    sync, local, alone = result["settings"]
    assert [row["setting"] for row in result["settings"]] == ["sync", "local", "alone"]
    assert sync["mAP50"] == pytest.approx(0.88) and sync["mAP50_error"] == pytest.approx(0.02)
    assert sync["mAP50_vs_reference"] == 0 and sync["mAP50_vs_reference_error"] == 0
    # Paired by seed: -0.05 and -0.03, mean -0.04; the standard error of two values is half
    # their difference.
    assert local["mAP50_vs_reference"] == pytest.approx(-0.04)
    assert local["mAP50_vs_reference_error"] == pytest.approx(0.01)
    # local reaches 0.78 at 6 * (2 + (0.78 - 0.5) / 0.29) s with seed 0, never with seed 1:
    # no mean time (it would be the lucky seed's), and no ratio.
    assert local["reached"] == 1 and local["time_vs_alone"] is None
    assert local["times_to_target"] == pytest.approx([6 * (2 + 0.28 / 0.29), None])
    assert local["time_to_target"] is None
    # One worker alone: 0.78 at 12 * (2 + 0.08 / 0.1) s with both seeds.
    assert alone["time_to_target"] == pytest.approx(12 * 2.8) and alone["time_vs_alone"] == 1
    assert sync["time_vs_alone"] == pytest.approx((20 + 10 * 0.18 / 0.22 + 30) / 2 / 33.6)
    assert [p["mAP50"] for p in local["curve"]] == pytest.approx([0.2, 0.45, 0.745])
    table = accuracy.format_accuracy({**result, "config": dataclasses.asdict(config)})
    assert "| local | 2 | 0.840 ± 0.010 | -0.040 ± 0.010 | 0.420 ± 0.005 |" in table
    assert "| 1 of 2 seeds reached it | - |" in table
    # The run shapes: replicas in one process share the global batch; one worker alone.
    args = accuracy._train_args(config, "local", ("--local-steps", "8"), 1, "r", "a", "d")
    assert args[-6:] == ("--batch-size", 8, "--cpu-replicas", 2, "--local-steps", "8")
    assert accuracy._train_args(config, "alone", (), 1, "r", "a", "d")[-2:] == ("--batch-size", 16)
    linked = dataclasses.replace(config, link="100mbit", cores=(0, 1))
    assert accuracy._train_args(linked, "sync", (), 1, "r", "a", "d")[-2:] == ("--batch-size", 8)
    # Over a link the workers' runs have a folder of their own; one worker alone talks to
    # no one, so its runs are those without a link.
    assert accuracy._run_dir(linked, "sync", 1).parent.name == "accuracy-100mbit"
    for name in ("alone", "sync"):
        assert accuracy._run_dir(config, name, 1).parent.name == "accuracy"
    assert accuracy._run_dir(linked, "alone", 1) == accuracy._run_dir(config, "alone", 1)
    assert accuracy._shape(linked, "alone") == accuracy._shape(config, "alone")
    assert accuracy._shape(linked, "sync") == {"replicas": 2, "link": "100mbit"}
    for bad, message in (
        ({"replicas": 3}, "divide the global batch"),
        ({"reference": "other"}, "--reference 'other'"),
        ({"settings": (("alone", ()),)}, "one worker alone"),
        ({"link": "100mbit"}, "--cores 0 1"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            dataclasses.replace(config, **bad)


def test_accuracy_goes_on_from_the_runs_an_earlier_invocation_finished(tmp_path):
    from benchmarks import accuracy

    finished, unfinished = tmp_path / "a-seed0", tmp_path / "b-seed0"
    finished.mkdir()
    shape = {"replicas": 2, "link": "none"}
    run = {"setting": "a", "seed": 0, "train": ["train", "--epochs", "6"], "shape": shape}
    (finished / accuracy.RECORD).write_text(json.dumps(run))
    assert accuracy._reused(finished, ("train", "--epochs", 6), print, shape) == run
    # Another command line, or the same one with other replicas (or link): not that run.
    for train, other in (
        (("train", "--epochs", 7), shape),
        (("train", "--epochs", 6), {"replicas": 4, "link": "none"}),
    ):
        with pytest.raises(ValueError, match="another command line"):
            accuracy._reused(finished, train, print, other)
    (unfinished / "checkpoints").mkdir(parents=True)  # killed part way: trained again
    assert accuracy._reused(unfinished, ("train",), print, shape) is None
    assert not unfinished.exists()


def test_a_failed_run_stops_the_runs_beside_it():
    import subprocess

    from benchmarks import recipe

    started = []

    def start(job, core):
        seconds = "0" if job == "fails" else "60"
        started.append(subprocess.Popen(["sleep", seconds], start_new_session=True))
        return started[-1]

    def finish(job, core, process, seconds):
        raise RuntimeError(f"{job} failed")

    with pytest.raises(RuntimeError, match="fails failed"):
        recipe.side_by_side(["fails", "runs on"], [0, 1], start, finish)
    assert started[1].poll() is not None  # stopped, not left running
