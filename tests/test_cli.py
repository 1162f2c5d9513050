"""What every command-line tool shares: output paths checked before any work starts, and
TensorFlow's start-up log held back."""

import argparse
import dataclasses
import functools
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from helpers import load_tool

from yolo3 import commands
from yolo3.cli import (
    ONEDNN_BY_DEFAULT,
    ONEDNN_ENV,
    TF_LOG_ENV,
    HelpFormatter,
    dataclass_from_args,
    tensorflow_environment,
)
from yolo3.commands import COMMANDS, summary, train
from yolo3.evaluation import validate

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
    # A notebook's first import of a public name, likewise.
    library = _run_python("-c", "from yolo3 import load_detector")
    assert library.returncode == 0 and library.stderr == ""
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


@pytest.mark.skipif(
    not ONEDNN_BY_DEFAULT, reason="TensorFlow's oneDNN default is set on x86-64 only"
)
def test_tools_start_tensorflow_with_onednn_kernels_on_unless_the_user_says_otherwise(
    monkeypatch,
):
    # TensorFlow itself leaves them off on x86-64 CPUs without AVX-512 VNNI/BF16 or AMX.
    code = (
        "from yolo3.cli import start_tensorflow\nstart_tensorflow()\n"
        "from tensorflow.python.util import _pywrap_util_port\n"
        "print(_pywrap_util_port.IsMklEnabled())"
    )
    environment = {k: v for k, v in os.environ.items() if k != ONEDNN_ENV}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment,
        timeout=120, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]
    # A value the user set is theirs.
    monkeypatch.setenv(ONEDNN_ENV, "0")
    tensorflow_environment()
    assert os.environ[ONEDNN_ENV] == "0"
    monkeypatch.delenv(ONEDNN_ENV)
    tensorflow_environment()
    assert os.environ[ONEDNN_ENV] == "1"


# Every command but train, and the benchmark harness, which lives outside the package.
TOOLS = ("benchmark", *sorted(module for module in COMMANDS.values() if module != "train"))


def _parsers():
    """``(name, parser)`` of train.py, every tool and every subcommand."""
    for name in ("train", *TOOLS):
        parser = (train if name == "train" else load_tool(name)).build_parser()
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    yield f"{name} {command}", sub


@functools.cache
def _parser_table():
    """``{name: parser}`` of :func:`_parsers`, built once for the tests that only parse."""
    return dict(_parsers())


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


# The flags every tool spells and reads the same way. A tool whose default differs says why
# here; a tool that lacks a flag simply does not have it.
ARCHITECTURE_DEFAULTS = {"benchmark train": "tiny", "benchmark scaling": "tiny"}  # the one measured
# model_data's file, for a run with no flag (train picks it by --model-type, so: None).
ANCHORS_DEFAULTS = ("benchmark io",)
CLASSES_DEFAULTS = ("voc_annotation",)  # the 20 VOC classes
# Tools that write something of a fixed shape (record shards, a Darknet cfg) take HEIGHTxWIDTH.
SIZE_PAIRS = ("convert", "preprocess", "train")  # train's is preprocess's, for --data


def _visible(parser):
    """``{option: action}`` of the options ``--help`` shows."""
    return {
        option: action
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
    }


def test_shared_flags_mean_the_same_in_every_tool():
    from yolo3.cli import THRESHOLD_FLAGS, output_file, output_folder
    from yolo3.model.network import MODEL_TYPES
    from yolo3.progress import PROGRESS_CHOICES

    seen = {}
    for name, parser in _parsers():
        flags = _visible(parser)
        for option in flags:
            seen.setdefault(option, []).append(name)
        # The architecture is --model-type everywhere, a model file --weights.
        assert "--model" not in flags and "--models" not in flags, name
        if "--model-type" in flags:
            action = flags["--model-type"]
            # train's lands in the run's setting of that name, TrainConfig.model.
            dest = "model" if name == "train" else "model_type"
            assert action.dest == dest and tuple(action.choices) == MODEL_TYPES, name
            assert action.default == ARCHITECTURE_DEFAULTS.get(name), name
        if "--model-types" in flags:
            assert tuple(flags["--model-types"].choices) == MODEL_TYPES, name
        if "--weights" in flags:
            action = flags["--weights"]
            assert action.dest == "weights" and action.type is None and action.nargs is None
            assert action.default is None, name
        if "--input-size" in flags:
            action = flags["--input-size"]
            expected = "parse_size" if name in SIZE_PAIRS else "int"
            assert action.dest == "input_size" and action.type.__name__ == expected, name
        for option, defaults in (("--anchors", ANCHORS_DEFAULTS), ("--classes", CLASSES_DEFAULTS)):
            if option in flags:
                action = flags[option]
                assert action.type is None and action.nargs is None, f"{name} {option}"
                assert (action.default is not None) == (name in defaults), f"{name} {option}"
        # Progress: both flags or neither, with the same choices and default.
        assert ("--progress" in flags) == ("--quiet" in flags), name
        if "--progress" in flags:
            action = flags["--progress"]
            assert tuple(action.choices) == PROGRESS_CHOICES and action.default == "auto", name
            assert isinstance(flags["--quiet"], argparse._StoreTrueAction), name
            assert flags["--quiet"].dest == "quiet", name
        for option, (_, kind, _) in THRESHOLD_FLAGS.items():
            if option in flags:  # the detector's thresholds: one parse, None when not given
                assert flags[option].type is kind and flags[option].default is None, name
        if "--output" in flags:
            action = flags["--output"]
            assert action.dest == "output" and action.nargs is None, name
            assert action.type in (None, output_folder, output_file), name  # a path, as given
    # The tools the vocabulary is for have it.
    assert {"train", "detect", "evaluate", "export", "convert"} <= set(seen["--model-type"])
    assert {"train", "detect", "evaluate", "export"} <= set(seen["--weights"])
    assert {"train", "evaluate", "preprocess", "demo"} <= set(seen["--progress"])
    assert {"detect", "evaluate", "export"} <= set(seen["--iou"])


# (parser, arguments every parse needs, old spelling, new spelling, its value or None)
OLD_SPELLINGS = [
    ("train", ["--records", "r"], "--model", "--model-type", "tiny"),
    ("detect", ["a.png", "--output", "out"], "--model", "--weights", "model.onnx"),
    ("evaluate", ["--records", "r"], "--model", "--weights", "model.onnx"),
    ("preprocess", [], "--no-progress", "--quiet", None),
    ("quickstart", [], "--size", "--input-size", "64"),
    ("convert", ["a.cfg", "a.weights", "out.h5"], "--fixed_size", "--fixed-size", None),
    ("benchmark train", [], "--model", "--model-type", "yolov3"),
    ("benchmark detect", [], "--models", "--model-types", "tiny"),
]


@pytest.mark.parametrize(
    "name, base, old, new, value", OLD_SPELLINGS, ids=[f"{o[0]} {o[2]}" for o in OLD_SPELLINGS]
)
def test_an_old_spelling_parses_as_the_new_one_and_stays_out_of_help(name, base, old, new, value):
    parsers = _parser_table()
    tool, *command = name.split()
    given = [] if value is None else [value]

    def parse(option):
        return vars(parsers[tool].parse_args([*command, *base, option, *given]))

    assert parse(old) == parse(new)
    text = parsers[name].format_help()
    assert re.search(rf"{re.escape(new)}(?![\w-])", text), text
    assert not re.search(rf"{re.escape(old)}(?![\w-])", text), text


def test_train_model_alias_builds_the_same_config(tmp_path):
    base = ["--records", "r", "--log-dir", str(tmp_path / "run")]
    configs = [
        train.config_from_args(train.build_parser().parse_args([*base, flag, "tiny"]))
        for flag in ("--model", "--model-type")
    ]
    assert configs[0] == configs[1] and configs[0].model == "tiny"


def test_a_dataclass_takes_each_field_from_the_argument_of_its_name():
    @dataclasses.dataclass(frozen=True)
    class Settings:
        sizes: tuple
        seed: int = 0
        name: str = "default"  # no flag of its own: stays at its default
        path: str | None = None

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--file")
    parser.add_argument("--other")
    args = parser.parse_args(["--sizes", "1", "8", "--file", "f.txt", "--other", "x"])
    settings = dataclass_from_args(Settings, args, path=args.file)
    assert settings == Settings(sizes=(1, 8), seed=3, name="default", path="f.txt")
    with pytest.raises(TypeError, match="unknown"):
        dataclass_from_args(Settings, args, unknown=1)


def _fake_detectors(folder):
    """Files that :func:`yolo3.inference.export.artifact_engine` tells apart by what they hold: no
    detector in them, enough to choose the way in."""
    folder.mkdir()
    saved = folder / "saved_model"
    saved.mkdir()
    (saved / "saved_model.pb").write_bytes(b"")
    (folder / "model.onnx").write_bytes(b"not onnx")
    (folder / "model.tflite").write_bytes(b"\0\0\0\0TFL3")
    (folder / "model.weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n")
    return {
        "saved_model": saved,
        "onnx": folder / "model.onnx",
        "tflite": folder / "model.tflite",
        "keras": folder / "model.weights.h5",
    }


class _Stop(ValueError):
    """Raised by a stand-in loader once it has recorded its call: status 2, nothing run."""


@pytest.fixture
def detect_calls(monkeypatch):
    """``(path, keyword arguments)`` of each load_detector call of tools/detect.py."""
    detect = load_tool("detect")
    calls = []

    def load(path, **settings):
        calls.append((path, settings))
        raise _Stop("stop")

    monkeypatch.setattr(detect, "load_detector", load)
    return detect, calls


@pytest.mark.parametrize("flag", ["--weights", "--model"])
def test_detect_opens_what_the_path_holds(detect_calls, flag, tmp_path, capsys):
    detect, calls = detect_calls
    files = _fake_detectors(tmp_path / "models")
    for engine, path in files.items():
        assert detect.main(["a.png", flag, str(path), "--output", str(tmp_path / "out")]) == 2
        found, settings = calls.pop()
        assert found == str(path)
        if engine == "keras":  # the flags' settings, defaults filled in
            assert settings["classes_path"] is None and settings["score_threshold"] == 0.3
        else:  # no threshold given: the artifact keeps its own
            assert settings == {}
    # A threshold given goes to the artifact, which checks it against its own.
    argv = ["a.png", flag, str(files["onnx"]), "--output", str(tmp_path / "out")]
    assert detect.main([*argv, "--iou", "0.6"]) == 2
    assert calls.pop()[1] == {"iou_threshold": 0.6}
    # What an exported file fixes is refused by flag, before it is opened.
    argv = ["a.png", flag, str(files["onnx"]), "--output", str(tmp_path / "out")]
    capsys.readouterr()
    assert detect.main([*argv, "--classes", "c.txt", "--input-size", "64"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--classes, --input-size are part of it" in err
    assert "exported onnx model" in err and not calls
    # A path that holds no detector is refused by flag.
    missing = ["a.png", flag, str(tmp_path / "none.onnx"), "--output", str(tmp_path / "out")]
    assert detect.main(missing) == 2
    assert f"--weights {tmp_path / 'none.onnx'}: no such file" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--weights", "--model"])
def test_evaluate_scores_what_the_path_holds(flag, tmp_path, monkeypatch, capsys):
    evaluate = load_tool("evaluate")
    files = _fake_detectors(tmp_path / "models")
    routes = []
    monkeypatch.setattr(
        evaluate, "evaluate_once", lambda args, weights, *rest: routes.append(("keras", weights))
    )

    def load(path, **settings):
        routes.append(("artifact", path))
        # The artifact's own score threshold, above the mAP threshold: a note says so.
        return types.SimpleNamespace(spec=types.SimpleNamespace(score_threshold=0.3))

    monkeypatch.setattr(evaluate, "load_detector", load)
    missing = str(tmp_path / "no_records")
    assert evaluate.main([flag, str(files["keras"]), "--annotations", "a.txt"]) == 0
    assert routes.pop() == ("keras", str(files["keras"]))
    for engine in ("saved_model", "onnx", "tflite"):
        # The note, then the missing record set ends the run.
        assert evaluate.main([flag, str(files[engine]), "--records", missing]) == 2
        assert routes.pop() == ("artifact", str(files[engine])), engine
        out = capsys.readouterr().out
        assert f"export with --score {validate.MAP_SCORE_THRESHOLD}" in out
    # An exported file: not for --coco-json, and what it fixes is refused by flag.
    for extra, named in (
        (["--coco-json", "x.json"], "--coco-json"),
        (["--records", missing, "--anchors", "a.txt"], "--anchors is part of it"),
        (["--records", missing, "--model-type", "tiny"], "--model-type is part of it"),
    ):
        capsys.readouterr()
        assert evaluate.main([flag, str(files["tflite"]), *extra]) == 2
        err = capsys.readouterr().err
        assert named in err and "exported tflite model" in err and err.count("\n") == 1
    assert not routes
    (tmp_path / "notes.txt").write_text("not a model")
    assert evaluate.main([flag, str(tmp_path / "notes.txt"), "--records", missing]) == 2
    assert "--weights " in capsys.readouterr().err


def test_every_command_module_is_a_yolo3_command_with_a_checkout_entry_point():
    modules = {path.stem for path in (REPO / "yolo3" / "commands").glob("*.py")} - {"__init__"}
    assert modules == set(COMMANDS.values())
    for name, module in COMMANDS.items():
        script = REPO / ("train.py" if name == "train" else f"tools/{module}.py")
        assert f'run_command("{name}")' in script.read_text(), script
        assert summary(name) and summary(name)[0].isupper(), name


def test_yolo3_command_lists_its_commands_and_refuses_an_unknown_one(capsys):
    assert commands.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name} " in listed and summary(name) in listed for name in COMMANDS)
    assert commands.main([]) == 2
    assert "usage: yolo3 {" in capsys.readouterr().err
    assert commands.main(["trian", "--records", "r"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == f"yolo3: error: unknown command 'trian': choose from {', '.join(COMMANDS)}"


def test_a_tools_bad_input_is_one_line_without_starting_tensorflow():
    # Every tool's error passes the full-disk check of run_main; a tool that never imports
    # TensorFlow must not import it there (seconds of start-up, on every mistyped path).
    script = (
        "import sys\n"
        "from yolo3 import cli\n"
        "def body(args):\n"
        "    raise ValueError('--thing 3: use 1 or 2')\n"
        "status = cli.run_main(cli.ArgumentParser(), [], body)\n"
        "print(status, 'tensorflow' in sys.modules)\n"
    )
    completed = _run_python("-c", script)
    assert completed.stdout.split() == ["2", "False"], completed.stderr[-2000:]
    assert completed.stderr.strip() == "error: --thing 3: use 1 or 2"
