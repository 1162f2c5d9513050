"""``yolo3 train --mlflow`` and ``yolo3 evaluate --mlflow`` against a real MLflow server.

One ``mlflow server`` for the module (a SQLite backend store, a local artifact root, a free
port on 127.0.0.1; started by :func:`server`, stopped after the last test), read back with
``MlflowClient``. The runs are as small as the other training tests' (64 px, 8 images, the
heads alone trained): one epoch in this process, which the tests of what a run logs and of
``yolo3 evaluate`` share, then its resume on two workers, one launch, which shows both that a
resumed run continues its MLflow run and that only the chief logs.
"""

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import keras
import pytest
from train_helpers import frozen_heads, job_inputs, train_args

from yolo3.checkpoint.weights import read_metadata
from yolo3.commands import evaluate, train
from yolo3.distributed.ports import free_port
from yolo3.engine.trainer import YoloTrainer
from yolo3.training import job as training

ROOT = Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "tools" / "launch.py"
TRAIN = ROOT / "train.py"
EXPERIMENT = "detector"
SERVER_START_SECONDS = 120
# The server runs from an environment of its own, as .ci/run makes it: the whole MLflow
# package brings scikit-learn and pandas, which TensorFlow imports in every process of the
# suite when they are installed beside it (the training environment has the client alone).
SERVER_PYTHON = Path(os.environ.get("YOLO3_MLFLOW_SERVER_PYTHON", ROOT / ".venv-mlflow/bin/python"))
SERVER_INSTALL = (
    "python3 -m venv .venv-mlflow && .venv-mlflow/bin/pip install 'mlflow>=3.17.2,<3.18'"
)
LOSS_TERMS = ("loss", "box_loss", "objectness_loss", "class_loss")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The tracking server's URI; the server runs until the module's last test is done."""
    pytest.importorskip("mlflow", reason='MLflow is not installed (pip install -e ".[mlflow]")')
    if not SERVER_PYTHON.exists():
        pytest.skip(f"no MLflow server: {SERVER_PYTHON} is missing ({SERVER_INSTALL})")
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port("127.0.0.1")
    command = [
        str(SERVER_PYTHON), "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{folder / 'store.db'}",
        "--default-artifact-root", str(folder / "artifacts"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    # Its job runner (background jobs of MLflow's GenAI features) is not needed here.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(folder / "server.log", "w")
    # A session of its own: the server runs uvicorn in a child process, stopped with it.
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_until_it_answers(uri, process, folder / "server.log")
        yield uri
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _wait_until_it_answers(uri, process, log_path):
    deadline = time.monotonic() + SERVER_START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"mlflow server exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"mlflow server gave no answer in {SERVER_START_SECONDS} s")


@pytest.fixture(scope="module")
def client(server):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """``(records, anchors, initial weights)``: 8 training and 8 validation records."""
    return job_inputs(tmp_path_factory.mktemp("mlflow-inputs"))


def _flags(inputs, log_dir, *extra):
    """The heads alone, for the two epochs of a run and its resume."""
    records, anchors, initial = inputs
    return train_args(records, log_dir, anchors, "--weights", initial, *frozen_heads(2), *extra)


def _train_here(args):
    """Trains in this process as ``yolo3 train ARGS`` does; ``(result, logged lines)``."""
    config = train.config_from_args(train.build_parser().parse_args(args))
    training.configure(config)
    logged = []
    return training.run(config, log=logged.append), logged


@pytest.fixture(scope="module")
def first_run(server, inputs, tmp_path_factory):
    """Epoch 1 of 2, trained here and logged to experiment :data:`EXPERIMENT`."""
    log_dir = tmp_path_factory.mktemp("mlflow-run") / "run"
    args = _flags(inputs, log_dir, "--epochs", "1", "--map-every", "1", "--mlflow")
    args += ["--mlflow-tracking-uri", server, "--mlflow-experiment", EXPERIMENT]
    result, logged = _train_here(args)
    recorded = json.loads((log_dir / "mlflow_run.json").read_text())
    return {"log_dir": log_dir, "result": result, "logged": logged, "recorded": recorded}


def _param(value):
    return value if isinstance(value, str) else json.dumps(value)


def _history(client, run_id, key):
    return [(metric.step, metric.value) for metric in client.get_metric_history(run_id, key)]


def _artifacts(client, run_id, path=None):
    """Every artifact file of the run under ``path``, as paths relative to the run."""
    found = []
    for item in client.list_artifacts(run_id, path):
        found += _artifacts(client, run_id, item.path) if item.is_dir else [item.path]
    return sorted(found)


def _download(server, run_id, path, folder):
    from mlflow.artifacts import download_artifacts

    return download_artifacts(
        run_id=run_id, artifact_path=path, dst_path=str(folder), tracking_uri=server
    )


@pytest.mark.slow
def test_a_run_logs_its_settings_every_epoch_and_its_files(server, client, first_run, tmp_path):
    recorded, result = first_run["recorded"], first_run["result"]
    run_id = recorded["run_id"]
    assert recorded["tracking_uri"] == server
    experiment = client.get_experiment_by_name(EXPERIMENT)
    assert recorded["experiment_id"] == experiment.experiment_id
    page = f"{server}/#/experiments/{experiment.experiment_id}/runs/{run_id}"
    said = [line for line in first_run["logged"] if line.startswith("MLflow:")]
    assert said == [f"MLflow: this run is {page}", f"MLflow: finished, {page}"], first_run["logged"]
    assert first_run["logged"][-1] == said[-1]
    run = client.get_run(run_id)
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    # The resolved configuration, as config.json holds it.
    saved = json.loads((first_run["log_dir"] / "config.json").read_text())
    params = run.data.params
    # Text as it is, anything else as JSON.
    for name in ("batch_size", "epochs", "map_every", "freeze_body", "lr", "records"):
        assert params[name] == _param(saved[name]), name
    for name, value in saved["resolved"].items():
        assert params[f"resolved.{name}"] == _param(value), name
    assert params["resolved.classes"] == '["circle", "square"]'
    assert params["resolved.model"] == "tiny"
    # Epoch 1's figures at step 1: losses, validation, learning rate, images/s, mAP. (The
    # resume test adds step 2 to the same run.)
    keys = [*LOSS_TERMS, *(f"val_{term}" for term in LOSS_TERMS)]
    keys += ["learning_rate", "images_per_second", "input_wait_fraction", "val_mAP50"]
    for key in keys:
        step_one = [value for step, value in _history(client, run_id, key) if step == 1]
        assert step_one == [pytest.approx(result.history[key][0], rel=1e-6)], key
    # The files: both weights, the config, and the mAP evaluation's gallery and PR curves.
    files = _artifacts(client, run_id)
    assert {"checkpoints/best.weights.h5", "checkpoints/last.weights.h5", "config.json"} <= set(
        files
    )
    assert {
        "evaluation/gallery.png",
        "evaluation/metrics.json",
        "evaluation/table.txt",
        "evaluation/pr/000-circle.png",
        "evaluation/pr/001-square.png",
    } <= set(files)
    copy = _download(server, run_id, "evaluation/metrics.json", tmp_path)
    assert json.loads(Path(copy).read_text())["num_images"] == 8


@pytest.mark.slow
def test_a_resumed_run_on_two_workers_continues_its_mlflow_run_from_the_chief_alone(
    server, client, inputs, first_run, tmp_path
):
    log_dir, run_id = first_run["log_dir"], first_run["recorded"]["run_id"]
    # The URI from MLflow's own variable this time; the run from the log folder.
    env = {**os.environ, "MLFLOW_TRACKING_URI": server}
    args = _flags(inputs, log_dir, "--epochs", "2", "--map-every", "1", "--resume", "--mlflow")
    command = [sys.executable, str(LAUNCH), "-n", "2", "--grace", "20", "--"]
    command += [sys.executable, str(TRAIN), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert f"[worker 0] MLflow: this run continues {server}/#/experiments/" in output
    assert "[worker 1] MLflow" not in output
    # One run in the experiment, each epoch's figures once: worker 1 logged nothing.
    experiment = client.get_experiment_by_name(EXPERIMENT)
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    for key in ("loss", "val_loss", "val_mAP50", "learning_rate"):
        assert [step for step, _ in _history(client, run_id, key)] == [1, 2], key
    # A parameter keeps its first value; the resume's is a tag.
    assert run.data.params["resolved.num_workers"] == "1"
    assert run.data.tags["resumed.resolved.num_workers"] == "2"
    assert run.data.tags["resumed.epochs"] == "2"
    last = _download(server, run_id, "checkpoints/last.weights.h5", tmp_path)
    assert read_metadata(last)["epoch"] == 2


@pytest.mark.slow
def test_evaluate_logs_to_the_run_recorded_beside_the_weights(
    server, client, first_run, tmp_path, monkeypatch, capsys
):
    # No URI given: the one the training run recorded.
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run_id = first_run["recorded"]["run_id"]
    weights = first_run["log_dir"] / "checkpoints" / "best.weights.h5"
    epoch = read_metadata(str(weights))["epoch"]
    records = json.loads((first_run["log_dir"] / "config.json").read_text())["records"]
    argv = ["--weights", str(weights), "--records", records, "--quiet", "--no-coco"]
    assert evaluate.main([*argv, "--output", str(tmp_path / "eval"), "--mlflow"]) == 0
    assert f"MLflow: logging to {server}/#/experiments/" in capsys.readouterr().out
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    history = _history(client, run_id, "evaluate/mAP50")
    assert history == [(epoch, pytest.approx(report["voc"]["mAP"], rel=1e-6))]
    figures = client.get_run(run_id).data.metrics
    assert {"evaluate/mAP50_voc07", "evaluate/AP50/circle", "evaluate/AP50/square"} <= set(figures)
    assert {"evaluate/best/gallery.png", "evaluate/best/table.txt"} <= set(
        _artifacts(client, run_id, "evaluate")
    )
    # A run that is not there: one line, before any detection.
    assert evaluate.main([*argv, "--mlflow", "--mlflow-run-id", "0" * 32]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"error: --mlflow: MLflow run {'0' * 32} (--mlflow-run-id) is not at {server}; give "
        "the URI it was logged to with --mlflow-tracking-uri"
    )


def test_an_unreachable_server_or_a_missing_mlflow_is_one_line_before_any_work(
    inputs, tmp_path, monkeypatch, capsys
):
    log_dir = tmp_path / "run"
    uri = f"http://127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens there
    args = _flags(inputs, log_dir, "--epochs", "1", "--mlflow")
    assert train.main([*args, "--mlflow-tracking-uri", uri]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == (
        f"error: --mlflow: the MLflow tracking server at {uri} cannot be reached (Connection "
        "refused); start it, or give another --mlflow-tracking-uri (or MLFLOW_TRACKING_URI)"
    )
    assert "tiny 64x64" not in captured.out  # no model was built
    assert not log_dir.exists()
    # Without the extra installed.
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert train.main([*args, "--mlflow-tracking-uri", uri]) == 2
    assert capsys.readouterr().err.strip() == (
        'error: --mlflow needs MLflow, which is not installed: pip install "keras-yolo3[mlflow]"'
    )
    # Where the run goes, without --mlflow to log it.
    assert train.main([*_flags(inputs, log_dir, "--mlflow-experiment", "x")]) == 2
    assert capsys.readouterr().err.strip() == "error: --mlflow-experiment needs --mlflow"


class _Relay:
    """A TCP relay from a port on 127.0.0.1 to ``target_port``: closing it is the server
    going away (connections cut, nothing listening)."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", free_port("127.0.0.1")))
        self.port = self.listener.getsockname()[1]
        self.sockets = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                inbound, _ = self.listener.accept()
            except OSError:
                return
            outbound = socket.create_connection(("127.0.0.1", self.target_port))
            self.sockets += [inbound, outbound]
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source, sink):
        try:
            while data := source.recv(1 << 16):
                sink.sendall(data)
        except OSError:
            pass
        # One side's end reaches the other, as on a direct connection: the server closes
        # a kept-alive connection after 5 s idle, and a client that never heard of it sent
        # its next request into the void and waited out its 30 s timeout (an epoch end
        # 32 s long) before retrying on a new connection.
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        for sock in [self.listener, *self.sockets]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


@pytest.mark.slow
def test_a_server_lost_mid_run_is_one_warning_and_training_goes_on(
    server, client, inputs, tmp_path, monkeypatch
):
    relay = _Relay(int(server.rsplit(":", 1)[1]))
    uri = f"http://127.0.0.1:{relay.port}"

    # Last of the callbacks: the server goes once every other one has seen epoch 1's end.
    lose = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: relay.close() if epoch == 0 else None
    )
    fit = YoloTrainer.fit

    def fit_then_lose(self, *args, callbacks=None, **kwargs):
        return fit(self, *args, callbacks=[*(callbacks or []), lose], **kwargs)

    monkeypatch.setattr(YoloTrainer, "fit", fit_then_lose)
    args = _flags(inputs, tmp_path / "run", "--epochs", "2", "--steps-per-epoch", "1")
    args += ["--mlflow", "--mlflow-tracking-uri", uri]
    try:
        result, logged = _train_here(args)
    finally:
        relay.close()
    assert result.epochs_done == 2 and result.stopped_reason is None
    assert read_metadata(str(tmp_path / "run/checkpoints/last.weights.h5"))["epoch"] == 2
    run_id = json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"]
    warnings = [line for line in logged if line.startswith("warning:")]
    assert len(warnings) == 1, logged  # epoch 2's figures failed; the end was not tried
    assert warnings[0].startswith(
        f"warning: MLflow at {uri} failed while logging epoch 2's figures (Connection refused)"
    )
    assert _history(client, run_id, "loss") == [(1, pytest.approx(result.history["loss"][0]))]
    assert client.get_run(run_id).info.status == "RUNNING"  # a resume would continue it


def test_only_the_tracking_module_imports_mlflow_and_only_inside_functions():
    """``import yolo3`` and a run without --mlflow never import MLflow: no module imports it
    or the tracking module at its top level."""
    sources = [*(ROOT / "yolo3").rglob("*.py"), *(ROOT / "callbacks").glob("*.py")]
    for path in sources:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or "", *(alias.name for alias in node.names)]
            hits = [name for name in names if "mlflow" in name]
            assert not hits, f"{path.relative_to(ROOT)} imports {hits} at its top level"
