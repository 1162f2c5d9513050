"""MLflow experiment tracking: ``yolo3 train --mlflow`` and ``yolo3 evaluate --mlflow``.

The one module that talks to MLflow (the ``mlflow`` extra, ``pip install
"keras-yolo3[mlflow]"``), and it imports MLflow only when a run asks for it: ``import yolo3``
and a run without ``--mlflow`` import neither this module nor MLflow.

A training run's chief opens its MLflow run before any work (:meth:`MlflowTracking.start`):
MLflow not installed, or a tracking server that cannot be reached, is one line naming the
fix or the server there (``ValueError``, exit status 2). The run's id goes to
``LOG_DIR/mlflow_run.json`` (:data:`RUN_FILE`); the same command started again (after a kill
or a preemption, or with ``--resume``) continues that MLflow run. Once training is under way
nothing MLflow does can end it: a server that stops answering gets one warning, and the
process sends it nothing more.

What a training run logs:

- parameters: every :class:`yolo3.engine.config.TrainConfig` field under its own name, and
  each setting the run resolved (model, classes, anchors, replicas, workers, global batch,
  peak learning rate, ...) as ``resolved.<name>``, the values written as ``config.json``
  writes them (JSON). MLflow never changes a parameter: a setting that a resume changes keeps
  its first value there, and its new one is the tag ``resumed.<name>``;
- metrics at every epoch's end, at step = the epoch's number from 1: ``loss`` and its terms,
  the ``val_`` ones, ``learning_rate``, ``images_per_second``, ``input_wait_fraction`` and,
  with ``--map-every``, ``val_mAP50``;
- artifacts at the end: ``checkpoints/best.weights.h5`` and ``checkpoints/last.weights.h5``,
  ``config.json`` and, when the run evaluated mAP, the last evaluation's report under
  ``evaluation/`` (``gallery.png``, ``pr/<class>.png``, ``metrics.json``, ``table.txt``).
"""

import contextlib
import dataclasses
import json
import math
import os
import re
import tempfile
import time

import keras

from yolo3 import fileio
from yolo3.status import TrainingStatus

from .checkpoint import BEST, LAST

RUN_FILE = "mlflow_run.json"
INSTALL = 'pip install "keras-yolo3[mlflow]"'
# MLflow's client retries a failed request 7 times over about four minutes, and waits up to
# 120 s for an answer: a run that lost its server would stand still that long at every epoch
# end. These apply to this module's requests wherever MLflow's own variables do not say
# otherwise: a refused connection fails in about 3 s, a silent server in about 90 s. The run's
# page is named in the run's own lines, not in the two MLflow prints when a run ends.
CLIENT_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
}
DEFAULT_EXPERIMENT_ID = "0"  # MLflow's "Default"
# MLflow takes at most 100 parameters or tags per request (mlflow.utils.validation).
PER_REQUEST = 100
# Prefix of the metrics and artifacts yolo3 evaluate logs.
EVALUATE = "evaluate"


def import_mlflow():
    """The ``mlflow`` module; ValueError saying how to install it where it is missing."""
    try:
        import mlflow  # noqa: PLC0415 - only runs that ask for tracking import it
    except ImportError:
        raise ValueError(f"--mlflow needs MLflow, which is not installed: {INSTALL}") from None
    return mlflow


def read_run_file(folder):
    """The MLflow run recorded in ``folder/mlflow_run.json`` (``run_id``, ``experiment_id``,
    ``tracking_uri``), or None without one."""
    path = os.path.join(folder, RUN_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            recorded = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("run_id"), str):
        raise ValueError(f"{path} does not name an MLflow run; delete it to start a new one")
    return recorded


def resolve_tracking_uri(mlflow, given=None, recorded=None):
    """Where runs are logged: ``given`` (a flag), else ``$MLFLOW_TRACKING_URI``, else the URI
    a recorded run (:func:`read_run_file`) was logged to, else MLflow's default."""
    return (
        given
        or os.environ.get("MLFLOW_TRACKING_URI")
        or (recorded or {}).get("tracking_uri")
        or mlflow.get_tracking_uri()
    )


@contextlib.contextmanager
def _client_settings():
    """:data:`CLIENT_SETTINGS` for the block, where the environment sets none of them."""
    added = [name for name in CLIENT_SETTINGS if name not in os.environ]
    os.environ.update({name: CLIENT_SETTINGS[name] for name in added})
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _reason(error):
    """What went wrong, in a few words: the operating system's words for a failed connection
    ("Connection refused", "Name or service not known"), else the message's first line."""
    text = str(getattr(error, "message", None) or error)
    found = re.search(r"\[Errno -?\d+\] ([^'\"()]+)", text)
    if found:
        return found.group(1).strip()
    if re.search(r"timed? ?out", text, re.I):
        return "no answer in time"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines or [type(error).__name__])[0][:300]


def _unreachable(error):
    text = str(getattr(error, "message", None) or error)
    return bool(re.search(r"\[Errno -?\d+\]|Max retries exceeded|timed? ?out", text, re.I))


@contextlib.contextmanager
def _opening(mlflow, uri):
    """MLflow's failures while a run is opened, as one line naming the server."""
    try:
        with _client_settings():
            yield
    except ImportError as error:
        # MLflow's client alone (the mlflow extra) talks to a server; a local store (its
        # default, sqlite:///mlflow.db) needs the whole package's database libraries.
        raise ValueError(
            f"--mlflow: MLflow at {uri} needs {error.name or 'a module'}, which the client "
            "alone does not bring: give a tracking server with --mlflow-tracking-uri (or "
            "MLFLOW_TRACKING_URI), or pip install mlflow"
        ) from None
    except (mlflow.exceptions.MlflowException, OSError) as error:
        if uri.startswith(("http://", "https://")) and _unreachable(error):
            raise ValueError(
                f"--mlflow: the MLflow tracking server at {uri} cannot be reached "
                f"({_reason(error)}); start it, or give another --mlflow-tracking-uri (or "
                "MLFLOW_TRACKING_URI)"
            ) from None
        raise ValueError(f"--mlflow: MLflow at {uri}: {_reason(error)}") from None


def _view(uri, experiment_id, run_id):
    """Where a person sees the run: its page on a tracking server, else the URI."""
    if uri.startswith(("http://", "https://")):
        return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
    return uri


class TrackedRun:
    """One MLflow run this process logs to; after the first failure it logs nothing more.

    Args:
        client: an ``mlflow.tracking.MlflowClient`` of ``uri``.
        run_id: the run.
        uri: the tracking URI, named in the warning.
        log: a callable given the warning line.
    """

    def __init__(self, client, run_id, uri, *, view=None, log=print):
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self.view = view or uri
        self.log = log
        self.lost = False

    def send(self, what, call):
        """Runs ``call()`` (requests to MLflow about ``what``); True when it succeeded.

        Any failure is a warning, once: the server or its storage is gone, and the work
        this process does (training) matters more than its record.
        """
        if self.lost:
            return False
        try:
            with _client_settings():
                call()
        except Exception as error:  # noqa: BLE001 - nothing MLflow raises may end a run
            self.lost = True
            self.log(
                f"warning: MLflow at {self.uri} failed while logging {what} ({_reason(error)}); "
                f"the run goes on without it, and this process logs nothing more to MLflow run "
                f"{self.run_id}"
            )
            return False
        return True

    def log_metrics(self, figures, step, what):
        """Logs the finite values of ``figures`` (name: number) at ``step``."""
        from mlflow.entities import Metric  # noqa: PLC0415

        stamp = int(time.time() * 1000)
        metrics = [
            Metric(name, float(value), stamp, int(step))
            for name, value in figures.items()
            if _finite(value)
        ]
        if metrics:
            self.send(what, lambda: self.client.log_batch(self.run_id, metrics=metrics))

    def upload(self, files=(), folders=()):
        """Logs ``files`` (``(path, artifact folder or None)``) that exist and ``folders``
        (``(local folder, artifact folder)``); raises what MLflow raises (inside :meth:`send`)."""
        for path, artifact_path in files:
            if os.path.exists(path):
                self.client.log_artifact(self.run_id, path, artifact_path)
        for folder, artifact_path in folders:
            self.client.log_artifacts(self.run_id, folder, artifact_path)


def _finite(value):
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _text(value):
    """A parameter's value as config.json writes it, within MLflow's 6000 characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= 6000 else text[:5997] + "..."


def _parameters(config, resolved):
    values = dataclasses.asdict(config)
    values.update({f"resolved.{name}": value for name, value in resolved.items()})
    return {name: _text(value) for name, value in values.items()}


def _in_batches(items):
    items = list(items)
    return [items[start : start + PER_REQUEST] for start in range(0, len(items), PER_REQUEST)]


def _experiment_id(client, name, uri):
    """The id of experiment ``name`` (else ``$MLFLOW_EXPERIMENT_NAME``, else
    ``$MLFLOW_EXPERIMENT_ID``, else MLflow's Default), created when it does not exist."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    name = name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
    if not name:
        return os.environ.get("MLFLOW_EXPERIMENT_ID") or DEFAULT_EXPERIMENT_ID
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name)
        except MlflowException:  # made by another process in between
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage == "deleted":
        raise ValueError(
            f"--mlflow: experiment {name!r} is deleted at {uri}; restore it (mlflow "
            "experiments restore) or name another with --mlflow-experiment"
        )
    return experiment.experiment_id


def _existing_run(client, run_id, uri, *, source, instead):
    """Run ``run_id`` at ``uri``, checked to exist and not be deleted; ``source`` says where
    its id came from and ``instead`` what else a user can do, in the ValueError otherwise."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    try:
        run = client.get_run(run_id)
    except MlflowException as error:
        if error.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        raise ValueError(
            f"--mlflow: MLflow run {run_id} ({source}) is not at {uri}; {instead}"
        ) from None
    if run.info.lifecycle_stage == "deleted":
        raise ValueError(
            f"--mlflow: MLflow run {run_id} ({source}) is deleted at {uri}; restore it "
            f"(mlflow runs restore --run-id {run_id}), or {instead}"
        )
    return run


def _recorded_run(client, recorded, path, uri):
    """The MLflow run recorded in ``path`` (``recorded``: its contents), at ``uri``."""
    logged_to = recorded.get("tracking_uri")
    instead = f"delete {path} to start a new MLflow run"
    if logged_to and logged_to != uri:
        instead = f"give --mlflow-tracking-uri {logged_to}, where it was logged, or {instead}"
    return _existing_run(
        client, recorded["run_id"], uri, source=f"recorded in {path}", instead=instead
    )


class MlflowTracking(keras.callbacks.Callback):
    """Logs a training run to MLflow (see the module docstring); the chief's alone.

    Built by :meth:`start`. Each epoch's logs go out as metrics at its end, so it must come
    after the callbacks that add to them (throughput, learning rate, mAP). The run's end
    (:meth:`finish`) and a failure that ends it (leaving the ``with`` block with an
    exception) set the MLflow run's status.

    Args:
        run: the :class:`TrackedRun`.
        log_dir, checkpoint_dir: the run's folders, where :meth:`finish` finds its files.
    """

    def __init__(self, run, *, log_dir, checkpoint_dir):
        super().__init__()
        self.run = run
        self.log_dir = log_dir
        self.checkpoint_dir = checkpoint_dir
        self.status = TrainingStatus()
        self.evaluation = None

    @classmethod
    def start(cls, config, resolved, *, checkpoint_dir, log=print):
        """Opens the MLflow run of ``config`` (a TrainConfig with ``mlflow`` set): the one
        recorded in its log folder, continued, or a new one, recorded there; logs the
        parameters (``resolved``: the settings the run resolved, as config.json holds them).

        Raises:
            ValueError: MLflow is not installed, the server cannot be reached or refuses,
                or the recorded run is not there.
        """
        mlflow = import_mlflow()
        from mlflow.entities import Param, RunTag  # noqa: PLC0415
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        import yolo3  # noqa: PLC0415 - the version, for the run's tags

        path = os.path.join(config.log_dir, RUN_FILE)
        recorded = read_run_file(config.log_dir)
        uri = resolve_tracking_uri(mlflow, config.mlflow_tracking_uri, recorded)
        client = MlflowClient(tracking_uri=uri)
        parameters = _parameters(config, resolved)
        with _opening(mlflow, uri):
            if recorded is not None:
                run = _recorded_run(client, recorded, path, uri)
                client.update_run(run.info.run_id, status="RUNNING")
                saved = run.data.params
            else:
                run = client.create_run(
                    _experiment_id(client, config.mlflow_experiment, uri),
                    run_name=os.path.basename(os.path.abspath(config.log_dir)),
                    tags={
                        "yolo3.log_dir": os.path.abspath(config.log_dir),
                        "yolo3.version": yolo3.__version__,
                    },
                )
                saved = {}
        run_id = run.info.run_id
        if recorded is None:
            record = {
                "run_id": run_id,
                "experiment_id": run.info.experiment_id,
                "tracking_uri": uri,
            }
            fileio.write_json(path, record)
        new = [Param(name, value) for name, value in parameters.items() if name not in saved]
        changed = [
            RunTag(f"resumed.{name}", value)
            for name, value in parameters.items()
            if name in saved and saved[name] != value
        ]
        with _opening(mlflow, uri):
            for batch in _in_batches(new):
                client.log_batch(run_id, params=batch)
            for batch in _in_batches(changed):
                client.log_batch(run_id, tags=batch)
        how = "continues" if recorded is not None else "is"
        view = _view(uri, run.info.experiment_id, run_id)
        log(f"MLflow: this run {how} {view}")
        tracked = TrackedRun(client, run_id, uri, view=view, log=log)
        return cls(tracked, log_dir=config.log_dir, checkpoint_dir=checkpoint_dir)

    def attach(self, status, evaluation=None):
        """The trainer's :class:`TrainingStatus` (an epoch a stop request cut short is not
        logged) and the run's :class:`yolo3.callbacks.MapEvaluation`, if any, whose last
        evaluation :meth:`finish` logs."""
        self.status = status
        self.evaluation = evaluation

    def on_epoch_end(self, epoch, logs=None):
        if self.status.stop_requested:
            return  # the epoch did not finish; the resumed run trains and logs it
        self.run.log_metrics(logs or {}, epoch + 1, f"epoch {epoch + 1}'s figures")

    def finish(self, status):
        """Ends the MLflow run with ``status`` (``FINISHED``, ``FAILED``, or ``KILLED`` for a
        run stopped on request, which the same command resumes); a run that did not stop on
        request logs its files first."""
        if status != "KILLED":
            self._log_files()
        ended = self.run.send(
            "the end of the run", lambda: self.run.client.set_terminated(self.run.run_id, status)
        )
        if ended:
            self.run.log(f"MLflow: {status.lower()}, {self.run.view}")

    def _log_files(self):
        files = [
            (os.path.join(self.checkpoint_dir, BEST), "checkpoints"),
            (os.path.join(self.checkpoint_dir, LAST), "checkpoints"),
            (os.path.join(self.log_dir, "config.json"), None),
        ]
        latest = self.evaluation.latest if self.evaluation is not None else None

        def upload():
            with tempfile.TemporaryDirectory(prefix="yolo3-mlflow-") as folder:
                folders = []
                if latest is not None:
                    from yolo3.evaluation import validate  # noqa: PLC0415

                    validate.write_report(latest, folder)
                    folders.append((folder, "evaluation"))
                self.run.upload(files, folders)

        self.run.send("the weights, config.json and the evaluation", upload)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if error is not None:
            status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
            self.run.send(
                "the run's failure",
                lambda: self.run.client.set_terminated(self.run.run_id, status),
            )
        return False


def open_run(run_id=None, *, tracking_uri=None, near=None, log=print):
    """An existing MLflow run to log an evaluation to, as a :class:`TrackedRun`.

    Args:
        run_id: the run (None: the one recorded in ``near``'s folder or the folder above it,
            e.g. a training run's ``checkpoints/best.weights.h5``).
        tracking_uri: the server (None: as :func:`resolve_tracking_uri`).
        near: a path beside which a training run recorded its MLflow run.

    Raises:
        ValueError: MLflow is not installed, no run is given or recorded, the server cannot
            be reached, or the run is not there.
    """
    mlflow = import_mlflow()
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    recorded, path = None, None
    if near is not None:
        folder = os.path.dirname(os.path.abspath(near))
        for candidate in (folder, os.path.dirname(folder)):
            recorded = read_run_file(candidate)
            if recorded is not None:
                path = os.path.join(candidate, RUN_FILE)
                break
    if run_id is None and recorded is None:
        raise ValueError(
            f"--mlflow: no MLflow run is recorded beside {near} ({RUN_FILE} of a run trained "
            "with --mlflow); give the run with --mlflow-run-id"
        )
    # Another run than the one recorded is looked for where that one was logged, unless told.
    uri = resolve_tracking_uri(mlflow, tracking_uri, recorded)
    client = MlflowClient(tracking_uri=uri)
    with _opening(mlflow, uri):
        if recorded is not None and run_id in (None, recorded["run_id"]):
            run = _recorded_run(client, recorded, path, uri)
        else:
            instead = "give the URI it was logged to with --mlflow-tracking-uri"
            run = _existing_run(client, run_id, uri, source="--mlflow-run-id", instead=instead)
    view = _view(uri, run.info.experiment_id, run.info.run_id)
    log(f"MLflow: logging to {view}")
    return TrackedRun(client, run.info.run_id, uri, view=view, log=log)


def log_evaluation(run, figures, *, step, report_dir, name):
    """Logs an evaluation to ``run`` (a :class:`TrackedRun`): each of ``figures`` (metric
    name: number) as ``evaluate/<metric name>`` at ``step`` (the weights' epoch), and the
    report folder ``report_dir`` as the artifacts under ``evaluate/<name>/``."""
    run.log_metrics({f"{EVALUATE}/{key}": value for key, value in figures.items()}, step, "metrics")
    folders = [(report_dir, f"{EVALUATE}/{name}")]
    run.send("the evaluation report", lambda: run.upload(folders=folders))
