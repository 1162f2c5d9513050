"""What every command-line tool shares: output paths checked before any work starts."""

import pytest
from helpers import load_tool

import train

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
