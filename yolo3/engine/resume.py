"""What ``--resume`` may change: a run continued with other settings either honours the change
and says so, or is refused before any work, naming the flag and the value the run was saved with.

The run's ``config.json`` (written by :func:`yolo3.training.job.run` at the start of every run)
holds its :class:`~yolo3.engine.config.TrainConfig` and the settings resolved from it (model type,
classes, anchors, input size, precision, replicas, workers). A resumed run compares its own
against them:

- **refused** (:data:`FIXED`): what the saved weights and training state were built for (the
  architecture, the classes and anchors of its heads, the input size of its records, the
  precision of its loss scale, the communication state kept in the checkpoint);
- **honoured and logged**: everything else (batch size, replicas, workers, learning rate,
  epochs, all-reduce precision, remat, ...), one line per change.
"""

import json
import os

from yolo3.model.head import HEAD_FLAGS, HeadSpec

# A setting a resumed run must keep: (where config.json holds it, the key, the flag a user
# changes it with). "resolved" values come from more than a flag (the record set, the anchors
# file's contents, the devices).
FIXED = (
    ("resolved", "model", "--model-type"),
    ("resolved", "classes", "--records (its classes)"),
    ("resolved", "anchors", "--anchors"),
    ("resolved", "input_size", "--records (its image size)"),
    ("resolved", "precision", "--mixed-precision"),
    *(("resolved", flag.field, flag.flag) for flag in HEAD_FLAGS),
    ("config", "compress", "--compress"),
    ("config", "rank", "--rank"),
    ("config", "local_steps", "--local-steps"),
    ("config", "overlap_sync", "--overlap-sync"),
    ("config", "outer_momentum", "--outer-momentum"),
)
FIXED_FIELDS = frozenset(key for where, key, _ in FIXED if where == "config")
# Changes a resumed run honours and reports from its resolved settings: where they come from
# the devices or the cluster rather than one flag.
RESOLVED_LOGGED = (
    ("num_replicas", "replicas (--gpus, --cpu-replicas)"),
    ("num_workers", "workers (TF_CONFIG, Slurm)"),
    ("global_batch_size", "global batch"),
)
# Fields of the config that say how a run is watched or continued, not what it trains.
NOT_COMPARED = frozenset(
    {"resume", "progress", "log_every", "log_seconds", "weights", "log_dir", "model",
     "anchors", "mixed_precision", "mlflow", "mlflow_tracking_uri", "mlflow_experiment"}
)  # fmt: skip


def flag_of(field):
    """The yolo3 train flag of a :class:`~yolo3.engine.config.TrainConfig` field."""
    return "--model-type" if field == "model" else "--" + field.replace("_", "-")


def read_saved(log_dir):
    """The saved ``config.json`` of the run in ``log_dir`` as a dict, or None without one."""
    path = os.path.join(log_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def check_resumed(saved, config, resolved, log=print):
    """Refuses a resume that changes a :data:`FIXED` setting (ValueError naming the flag and
    the saved value); logs every other changed setting.

    Args:
        saved: the saved ``config.json`` (:func:`read_saved`); None checks nothing.
        config: the resumed run's settings, a dict of :class:`~yolo3.engine.config.TrainConfig`.
        resolved: the resumed run's resolved settings, as :func:`yolo3.training.job.run` saves
            them.
    """
    if saved is None:
        return
    saved_resolved = _head_recorded(dict(saved.get("resolved", {})))
    now = {"config": config, "resolved": resolved}
    was = {"config": saved, "resolved": saved_resolved}
    for where, key, flag in FIXED:
        if key not in was[where]:  # saved by a version that did not record it
            continue
        if _normal(was[where][key]) != _normal(now[where].get(key)):
            raise ValueError(
                f"--resume: {flag} gives {_text(now[where].get(key))} but the run was saved "
                f"with {_text(was[where][key])}; resume with the run's own setting, or start "
                "a new run in another --log-dir"
            )
    for field, value in config.items():
        if field in NOT_COMPARED or field in FIXED_FIELDS or field not in saved:
            continue
        if _normal(saved[field]) != _normal(value):
            was_text = _text(saved[field])
            log(f"resume: {flag_of(field)} {_text(value)} (the run was saved with {was_text})")
    for key, name in RESOLVED_LOGGED:
        if key in saved_resolved and saved_resolved[key] != resolved.get(key):
            log(f"resume: {name} {resolved.get(key)} (was {saved_resolved[key]})")


def _head_recorded(resolved):
    """``resolved`` (a saved run's) with the head's fields it was saved before recording:
    their meaning then, as a checkpoint of that time reads (:meth:`HeadSpec.from_metadata`)."""
    if not resolved.get("anchors") or not resolved.get("classes"):
        return resolved
    try:
        head = HeadSpec.from_metadata({**resolved, "model_type": resolved.get("model")})
    except ValueError:  # what it records is compared, and refused, as it is
        return resolved
    recorded = head.to_metadata()
    return {**{flag.field: recorded[flag.field] for flag in HEAD_FLAGS}, **resolved}


def _normal(value):
    """Lists and tuples alike, as JSON gives them back."""
    return json.loads(json.dumps(value))


def _text(value):
    return "none" if value is None else json.dumps(value) if isinstance(value, list) else str(value)
