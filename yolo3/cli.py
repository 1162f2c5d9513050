"""The skeleton every command-line entry point shares (``train.py``, ``tools/*.py``).

``main(argv=None) -> int`` of each tool is ``run_main(build_parser(), argv, body)``: argument
errors end with argparse's own message and status, a known failure with one line,
``error: ...``, and exit status 2 (or 1 for a run that started and failed), never a
traceback; an unexpected error keeps its traceback, because it is a bug to report.
"""

import argparse
import sys

KNOWN_ERRORS = (FileNotFoundError, ValueError)


def argument_type(parse):
    """``parse`` as an argparse ``type=``: its ValueError message becomes argparse's error."""

    def convert(text):
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    convert.__name__ = parse.__name__
    return convert


def add_detector_arguments(parser):
    """The options of the tools that run a detector on weights from any source:
    ``--anchor-masks`` and ``--resampling`` (see :class:`yolo3.detect.Detector`)."""
    from yolo3.image import RESAMPLING  # noqa: PLC0415 - the skeleton itself stays light
    from yolo3.resources import parse_anchor_masks  # noqa: PLC0415

    parser.add_argument(
        "--anchor-masks",
        type=argument_type(parse_anchor_masks),
        help="anchors per head, largest stride first, e.g. '3,4,5 1,2,3' (default: what the "
        "weights file records; the original keras-yolo3's for its .h5 files)",
    )
    parser.add_argument(
        "--resampling",
        choices=RESAMPLING,
        help="how images are letterboxed (default: darknet for weights converted from "
        "Darknet, else bicubic as in training)",
    )


def add_progress_argument(parser):
    """``--progress`` of the tools that count images (see :mod:`yolo3.progress`)."""
    from yolo3.progress import PROGRESS_CHOICES  # noqa: PLC0415 - the skeleton stays light

    parser.add_argument(
        "--progress",
        choices=PROGRESS_CHOICES,
        default="auto",
        help="auto: a bar on a terminal, else a plain line every 30 s",
    )


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
            status 1.
    """
    try:
        args = parser.parse_args(argv)
        if check is not None:
            check(parser, args)
    except SystemExit as exit_:  # --help, or an argument error argparse has printed
        return int(exit_.code or 0)
    try:
        return body(args)
    except errors as err:
        return fail(err)
    except failures as err:
        return fail(err, status=1)
