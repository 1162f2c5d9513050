"""The skeleton every command-line entry point shares (the ``yolo3`` commands, yolo3/commands/).

``main(argv=None) -> int`` of each tool is ``run_main(build_parser(), argv, body)``: argument
errors end with argparse's own message and status, a known failure with one line,
``error: ...``, and exit status 2 (or 1 for a run that started and failed), never a
traceback; an unexpected error keeps its traceback, because it is a bug to report.
"""

import argparse
import contextlib
import copy
import os
import platform
import sys
import tempfile

from yolo3.faults import RunFailed, no_space_path, out_of_space
from yolo3.flags import argument_type
from yolo3.flags import from_args as dataclass_from_args  # noqa: F401 - the commands' name
from yolo3.model.head import HEAD_FLAG_FIELDS, HEAD_FLAGS

# OSError: a path a user gave that cannot be read or written (permissions, a file where a
# folder goes) is their mistake to fix, not a bug to report with a traceback. A full disk,
# met by any tool, is a run that failed (status 1, run_main), which the same command
# continues once there is room.
KNOWN_ERRORS = (OSError, ValueError)


# Set to 1 to see TensorFlow's start-up log, which the tools hold back by default.
TF_LOG_ENV = "YOLO3_TF_LOG"

# TensorFlow's oneDNN kernels (convolutions, matrix products, batch norm on the CPU): its
# x86-64 wheels use them by default only where the CPU has AVX-512 VNNI, BF16 or AMX, and
# Eigen's elsewhere. On a 2-core AMD EPYC with AVX2 alone, one core trained tiny 4.0x faster
# with oneDNN's at 96 px and 1.9x at 256 px (docs/benchmarks.md, "oneDNN on AVX2"). A value
# the user sets is kept (0 turns them off).
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
# Whether this machine is one where the tools set it: x86-64.
ONEDNN_BY_DEFAULT = platform.machine().lower() in ("x86_64", "amd64")


def tensorflow_environment():
    """Sets what TensorFlow reads from the environment when it starts, where the user has not:
    oneDNN's kernels on x86-64 (:data:`ONEDNN_ENV`). No effect once TensorFlow is imported."""
    if ONEDNN_BY_DEFAULT:
        os.environ.setdefault(ONEDNN_ENV, "1")


@contextlib.contextmanager
def _stderr_held_back():
    """Sends file descriptor 2 to a scratch file for the block; shows what was held back
    when the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def start_tensorflow():
    """Imports TensorFlow (its environment set first, :func:`tensorflow_environment`) and lets
    it find its devices with its start-up log held back.

    TensorFlow's C++ side logs several lines on import and on its first look at the devices,
    before any log level applies (on a machine without CUDA an ``E0000 ... failed call to
    cuInit`` that reads like a failure). The tools call this before importing the library;
    ``YOLO3_TF_LOG=1`` shows the log, and TensorFlow's warnings after the start, again.
    """
    tensorflow_environment()
    show = os.environ.get(TF_LOG_ENV, "0") not in ("", "0")
    if not show:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with contextlib.nullcontext() if show else _stderr_held_back():
        import tensorflow as tf  # noqa: PLC0415

        tf.config.list_physical_devices()


class HelpFormatter(argparse.HelpFormatter):
    """Every option's default in ``--help``, unless its help already says it or it has none."""

    def _format_action(self, action):
        # argparse expands an option's help only when there is some: an option declared
        # without help would show no default. Such an option gets "default: ..." as its help.
        if not action.help and self._get_help_string(action):
            action = copy.copy(action)
            action.help = self._get_help_string(action)
        return super()._format_action(action)

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            not action.option_strings
            or action.nargs == 0  # flags: on when given
            or action.default in (None, argparse.SUPPRESS)
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class ArgumentParser(argparse.ArgumentParser):
    """The tools' parser: defaults shown in ``--help`` (:class:`HelpFormatter`)."""

    def __init__(self, *args, formatter_class=HelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def _on_off(text):
    if text not in ("on", "off"):
        raise ValueError(f"{text!r}: use on or off")
    return text == "on"


# ``type=`` of a flag that takes on or off: True or False.
on_off = argument_type(_on_off)


def _blocking_ancestor(path):
    """The nearest existing ancestor of ``path`` when it is not a folder, else None."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return None if os.path.isdir(parent) else parent


def check_output_path(text, *, folder):
    """``text`` when a ``folder`` (or a file) can be written there; ValueError naming what is
    in the way otherwise. Remote paths (``gs://``) are left to the storage."""
    if "://" in text:
        return text
    kind, other = ("folder", "file") if folder else ("file", "folder")
    if os.path.exists(text) and os.path.isdir(text) != folder:
        raise ValueError(f"{text} is a {other}; give a {kind} path")
    blocking = _blocking_ancestor(text)
    if blocking is not None:
        raise ValueError(f"{text}: {blocking} is a file, so no {kind} can be made under it")
    return text


def _output_folder(text):
    return check_output_path(text, folder=True)


def _output_file(text):
    return check_output_path(text, folder=False)


# ``type=`` of output flags: checked while parsing, before any work starts.
output_folder = argument_type(_output_folder)
output_file = argument_type(_output_file)


def add_detector_arguments(parser):
    """The options of the tools that run a detector on weights from any source: the head's
    flags (:func:`add_head_arguments`), ``--resampling`` (see
    :class:`yolo3.inference.detect.Detector`) and ``--device``."""
    from yolo3.data.image import RESAMPLING  # noqa: PLC0415 - the skeleton itself stays light

    add_head_arguments(parser)
    parser.add_argument(
        "--resampling",
        choices=RESAMPLING,
        help="how images are letterboxed (default: darknet for weights converted from "
        "Darknet, else bicubic as in training)",
    )
    add_device_argument(parser)


def _fraction(what):
    def fraction(text):
        value = float(text)
        if not 0.0 <= value <= 1.0:  # NaN fails too
            raise ValueError(f"{what} lies in [0, 1], not {text}")
        return value

    return argument_type(fraction)


def _count(text):
    value = int(text)
    if value < 1:
        raise ValueError(f"at least 1, not {text}")
    return value


# Threshold flag -> (the detector's keyword argument, its type=, its help).
THRESHOLD_FLAGS = {
    "--score": ("score_threshold", _fraction("a score"), "score threshold"),
    "--iou": ("iou_threshold", _fraction("an IoU"), "NMS IoU threshold"),
    "--max-detections": ("max_detections", argument_type(_count), "detections kept per image"),
    "--box-merge": (
        "box_merge",
        on_off,
        "on: each box NMS keeps is the score- and IoU-weighted mean of the boxes it suppresses "
        "and itself",
    ),
}


def _threshold_defaults():
    """The defaults :func:`detector_thresholds` fills in; ``--box-merge`` has none here: the
    weights decide (off for weights converted from Darknet,
    :func:`yolo3.inference.detector_spec.spec_for_weights`)."""
    from yolo3.inference import detector_spec  # noqa: PLC0415 - the skeleton itself stays light

    return {
        "score_threshold": detector_spec.SCORE_THRESHOLD,
        "iou_threshold": detector_spec.NMS_IOU_THRESHOLD,
        "max_detections": detector_spec.MAX_DETECTIONS,
    }


def _threshold_help_default(keyword):
    if keyword == "box_merge":
        return "on, off for weights converted from Darknet"
    return _threshold_defaults()[keyword]


def add_threshold_arguments(parser, flags=tuple(THRESHOLD_FLAGS), artifacts=True):
    """``flags`` of :data:`THRESHOLD_FLAGS` on ``parser``, each None when not given
    (:func:`detector_thresholds` reads them); ``artifacts``: the tool also runs exported
    detectors, which keep the thresholds they were exported with unless one is given."""
    note = "; an exported detector keeps its own" if artifacts else ""
    for flag in flags:
        keyword, kind, text = THRESHOLD_FLAGS[flag]
        default = _threshold_help_default(keyword)
        metavar = "{on,off}" if kind is on_off else None
        parser.add_argument(
            flag, type=kind, metavar=metavar, help=f"{text} (default {default}{note})"
        )


def detector_thresholds(args, defaults=True):
    """The detector's keyword arguments (``score_threshold``, ``iou_threshold``,
    ``max_detections``, ``box_merge``) of the threshold flags ``args`` has: a flag not given
    is the detector's default with ``defaults`` (``box_merge``: left out, the weights
    decide), else left out (an exported detector keeps its own)."""
    fallback = _threshold_defaults() if defaults else {}
    thresholds = {}
    for flag, (keyword, _, _) in THRESHOLD_FLAGS.items():
        name = flag[2:].replace("-", "_")
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if value is None:
            value = fallback.get(keyword)
        if value is not None:
            thresholds[keyword] = value
    return thresholds


def add_head_arguments(parser, source="the weights file"):
    """One flag per entry of :data:`yolo3.model.head.HEAD_FLAGS` on ``parser``; a value not
    given is what ``source`` records, else the entry's own default."""
    for flag in HEAD_FLAGS:
        parser.add_argument(
            flag.flag,
            type=argument_type(flag.parse),
            metavar=flag.metavar,
            help=f"{flag.help} (default: what {source} records, else {flag.unrecorded})",
        )


def _parse_device(text):
    kind, colon, index = text.partition(":")
    if text == "cpu" or (kind == "gpu" and (not colon or index.isdigit())):
        return text
    raise ValueError(f"{text!r}: use cpu, gpu (the first GPU) or gpu:N")


def add_device_argument(parser):
    """``--device``: where a tool that runs a detector places it (see :func:`use_device`)."""
    parser.add_argument(
        "--device",
        type=argument_type(_parse_device),
        help="cpu, gpu (the first GPU) or gpu:N, counted among the GPUs TensorFlow sees; "
        "ONNX and TFLite models run on the CPU (default: the first GPU when there is one)",
    )


def use_device(device, engine="keras"):
    """Makes ``--device`` the one device TensorFlow runs on (before any model is built):
    ValueError naming the flag where it cannot be honoured."""
    if device is None:
        return
    if engine in ("onnx", "tflite") and device != "cpu":
        raise ValueError(f"--device {device}: {engine} models run on the CPU here; give cpu")
    import tensorflow as tf  # noqa: PLC0415 - the skeleton itself stays light

    gpus = tf.config.list_physical_devices("GPU")
    chosen = []
    if device != "cpu":
        index = int(device.partition(":")[2] or 0)
        from yolo3.distributed.devices import check_gpu_count  # noqa: PLC0415

        check_gpu_count(
            f"--device {device}", requested=index + 1, seen=len(gpus), cpu_flag="--device cpu"
        )
        chosen = [gpus[index]]
    tf.config.set_visible_devices(chosen, "GPU")


def add_model_type_argument(parser, *, default=None, help="default: from the anchor count"):
    """``--model-type``, the architecture, of every tool that takes one."""
    from yolo3.model.network import MODEL_TYPES  # noqa: PLC0415 - the skeleton itself stays light

    return parser.add_argument("--model-type", choices=MODEL_TYPES, default=default, help=help)


def detector_engine(path):
    """What ``path`` (a ``--weights`` value) holds: ``"keras"`` for a weights file, else the
    exported artifact's engine (:func:`yolo3.inference.export.artifact_engine`); ValueError naming
    the flag for a path that holds no detector."""
    from yolo3.inference.export import artifact_engine  # noqa: PLC0415 - imports TensorFlow

    try:
        return artifact_engine(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"--weights {err}") from None


# The flags that describe the detector a weights file holds, as argparse names them, and the
# keyword of yolo3.inference.detector_spec.spec_for_weights (and load_detector) each one feeds;
# None: a field of the head (yolo3.model.head.HeadSpec) of the same name, which goes in
# spec_for_weights's one head_overrides dict. An exported artifact fixes all of them: yolo3
# detect and yolo3 evaluate refuse them there.
WEIGHTS_FLAGS = {
    "classes": "classes_path",
    "anchors": "anchors_path",
    "model_type": None,
    "input_size": "input_size",
    **dict.fromkeys(HEAD_FLAG_FIELDS),
    "resampling": "resampling",
}
ARTIFACT_FIXED = tuple(WEIGHTS_FLAGS)


def weights_settings(args):
    """The :data:`WEIGHTS_FLAGS` in ``args`` as keyword arguments of ``spec_for_weights``."""
    settings = {"head_overrides": {}}
    for name, keyword in WEIGHTS_FLAGS.items():
        target = settings if keyword else settings["head_overrides"]
        target[keyword or name] = getattr(args, name, None)
    return settings


def refuse_fixed_flags(args, path, engine):
    """ValueError naming each flag of :data:`ARTIFACT_FIXED` given in ``args`` although
    ``path``, an exported ``engine`` artifact, fixes it."""
    given = [name for name in ARTIFACT_FIXED if getattr(args, name, None) is not None]
    if given:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        one = len(given) == 1
        raise ValueError(
            f"{path} is an exported {engine} model: {flags} {'is' if one else 'are'} part of "
            f"it (give its weights file to --weights to change {'it' if one else 'them'})"
        )


def add_progress_arguments(
    parser, *, help="auto: a bar on a terminal, else a plain line every 30 s"
):
    """``--progress`` and ``--quiet`` of every tool that shows progress (see
    :mod:`yolo3.progress`); :func:`progress_setting` reads them back as one value."""
    from yolo3.progress import PROGRESS_CHOICES  # noqa: PLC0415 - the skeleton stays light

    parser.add_argument("--progress", choices=PROGRESS_CHOICES, default="auto", help=help)
    parser.add_argument("--quiet", action="store_true", help="no progress display (--progress off)")


def progress_setting(args):
    """``args.progress``, or ``"off"`` with ``--quiet`` whatever ``--progress`` says."""
    return "off" if args.quiet else args.progress


def fail(message, status=2):
    """Prints ``error: message`` on standard error and returns ``status``."""
    print(f"error: {message}", file=sys.stderr)
    return status


def run_main(parser, argv, body, *, check=None, errors=KNOWN_ERRORS, failures=()):
    """Parses ``argv`` with ``parser`` and returns ``body(args)``'s exit status.

    Args:
        parser: the tool's ``argparse.ArgumentParser``.
        argv: the arguments (None: ``sys.argv[1:]``).
        body: ``body(args) -> int``, the tool's work.
        check: ``check(parser, args)``, run after parsing: checks across arguments that
            end, as argparse's own errors do, with ``parser.error``.
        errors: exception types that mean bad input or settings: one line, status 2.
        failures: exception types that mean a run that started and failed: one line,
            status 1. :class:`yolo3.faults.RunFailed` always is one, whatever ``errors``
            holds.
    """
    try:
        args = parser.parse_args(argv)
        if check is not None:
            check(parser, args)
    except SystemExit as exit_:  # --help, or an argument error argparse has printed
        return int(exit_.code or 0)
    try:
        return body(args)
    except RunFailed as err:
        return fail(err, status=1)
    except Exception as err:
        # A full disk is no bad input, whichever tool met it: status 1, the file named.
        path = no_space_path(err)
        if path is not None:
            return fail(out_of_space(path or "a write", then="continue where it stopped"), 1)
        if isinstance(err, errors):
            return fail(err)
        if isinstance(err, failures):
            return fail(err, status=1)
        raise
