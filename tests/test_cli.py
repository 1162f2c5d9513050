"""What every command-line tool shares: output paths checked before any work starts, and
TensorFlow's start-up log held back."""

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_tool

import train
from yolo3.cli import TF_LOG_ENV, HelpFormatter

REPO = Path(__file__).resolve().parents[1]

# (tool, its arguments with {out} where the output goes, folder or file, the output's name).
# None of the inputs exist: the refusal must come before any of them is read.
OUTPUTS = [
    ("train", ["--records", "r", "--log-dir", "{out}"], "folder", "run"),
    ("detect", ["a.png", "--weights", "w.weights.h5", "--output", "{out}"], "folder", "det"),
    (
        "evaluate",
        ["--weights", "w.weights.h5", "--annotations", "a.txt", "--output", "{out}"],
        "folder",
        "eval",
    ),  # fmt: skip
    (
        "preprocess",
        ["--annotations", "a.txt", "--classes", "c.txt", "--output", "{out}"],
        "folder",
        "records",
    ),  # fmt: skip
    (
        "export",
        ["--weights", "w.weights.h5", "--format", "saved_model", "--output", "{out}"],
        "folder",
        "saved",
    ),  # fmt: skip
    (
        "export",
        ["--weights", "w.weights.h5", "--format", "onnx", "--output", "{out}"],
        "file",
        "model.onnx",
    ),  # fmt: skip
    ("kmeans", ["--annotations", "a.txt", "-k", "6", "--output", "{out}"], "file", "a.txt"),
    ("convert", ["a.cfg", "a.weights", "{out}"], "file", "m.weights.h5"),
]


@pytest.mark.parametrize(
    "name, argv, kind, output", OUTPUTS, ids=[f"{o[0]}-{o[2]}" for o in OUTPUTS]
)
def test_an_output_path_held_by_something_else_is_refused_at_once(
    name, argv, kind, output, tmp_path, capsys
):
    tool = train if name == "train" else load_tool(name)

    def run(out):
        return tool.main([a.format(out=out) for a in argv])

    # A file where the folder goes, or a folder where the file goes.
    taken = tmp_path / output
    taken.mkdir() if kind == "file" else taken.write_text("")
    assert run(taken) == 2
    err = capsys.readouterr().err
    other = "folder" if kind == "file" else "file"
    assert f"{taken} is a {other}; give a {kind} path" in err and "Traceback" not in err
    # A file where one of its parent folders goes.
    (tmp_path / "plain").write_text("")
    assert run(tmp_path / "plain" / output) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'plain'} is a file, so no {kind} can be made under it" in err


def _run_python(*args, **env):
    environment = {k: v for k, v in os.environ.items() if k != TF_LOG_ENV} | env
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=environment, timeout=120
    )


@pytest.mark.slow
def test_tensorflow_start_up_log_is_held_back_unless_asked_for():
    # What TensorFlow prints on import and on its first look at the devices, whatever the
    # machine (here: oneDNN and CUDA lines, and an E0000 for cuInit without a GPU).
    baseline = _run_python("-c", "import tensorflow as tf; tf.config.list_physical_devices()")
    tool = (str(REPO / "tools" / "detect.py"), "--help")
    quiet = _run_python(*tool)
    assert quiet.returncode == 0 and "usage: detect.py" in quiet.stdout
    assert quiet.stderr == ""
    loud = _run_python(*tool, **{TF_LOG_ENV: "1"})
    assert loud.returncode == 0
    assert _log_lines(loud.stderr) == _log_lines(baseline.stderr)


def _log_lines(text):
    """The lines without their time stamps and process ids."""
    return [re.sub(r"^([IWEF])\d{4} [\d:.]+ +\d+ ", r"\1 ", line) for line in text.splitlines()]


def test_a_failed_start_shows_what_was_held_back(tmp_path):
    # A broken TensorFlow install: its own words reach the user with the error.
    fake = tmp_path / "tensorflow"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "import os\nos.write(2, b'libfoo.so: cannot open shared object file\\n')\n"
        "raise ImportError('tensorflow is broken')\n"
    )
    code = f"import sys; sys.path[:0] = [{str(tmp_path)!r}, {str(REPO)!r}]\n"
    code += "from yolo3.cli import start_tensorflow\nstart_tensorflow()"
    result = _run_python("-c", code)
    assert result.returncode == 1
    assert "libfoo.so: cannot open shared object file" in result.stderr
    assert "ImportError: tensorflow is broken" in result.stderr


TOOLS = (
    "benchmark", "coco_annotation", "convert", "demo", "detect", "evaluate", "export",
    "kmeans", "launch", "make_demo_dataset", "preprocess", "quickstart", "voc_annotation",
)  # fmt: skip


def _parsers():
    """``(name, parser)`` of train.py, every tool and every subcommand."""
    for name in ("train", *TOOLS):
        parser = (train if name == "train" else load_tool(name)).build_parser()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    yield f"{name} {command}", sub


def test_every_flag_is_hyphenated_and_shows_its_default():
    for name, parser in _parsers():
        assert issubclass(parser.formatter_class, HelpFormatter), name
        formatter = parser._get_formatter()
        for action in parser._actions:
            if action.help == argparse.SUPPRESS or not action.option_strings:
                continue  # an old spelling kept out of --help; a positional argument
            for option in action.option_strings:
                assert "_" not in option, f"{name} {option}: hyphens, not underscores"
            if action.nargs != 0 and action.default not in (None, argparse.SUPPRESS):
                text = formatter._get_help_string(action) % {"default": action.default}
                assert "default" in text, f"{name} {action.option_strings[0]}: {text!r}"
        parser.format_help()  # every help string renders
