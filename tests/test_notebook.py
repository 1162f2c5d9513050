"""The example notebook runs top to bottom, prints its detections and shows the picture.

The notebook is executed by nbclient on an IPython kernel started from this test's own Python
(a kernel spec written to a temporary folder), in a temporary working folder, so nothing is
written into the repository and no Jupyter installed elsewhere is involved.
"""

import base64
import io
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient
from PIL import Image

from yolo3.data.synthetic import CLASS_NAMES, make_dataset

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"
KERNEL_NAME = "keras-yolo3-test"
# The notebook's settings that its printed results are checked against.
SIZE, TEST_IMAGES, TEST_SEED, SCORE_THRESHOLD = 96, 4, 1, 0.01

IMAGE_LINE = re.compile(r"image (\d+): (\d+) detections, (\d+) true objects")
BOX_LINE = re.compile(r"  (\w+) +(\d\.\d\d)  \((-?\d+), (-?\d+), (-?\d+), (-?\d+)\)")
STEP_LINE = re.compile(r"step +(\d+)  loss (\d+\.\d+)  \(.*\)")
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _write_kernel_spec(jupyter_dir, env):
    spec_dir = jupyter_dir / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "keras-yolo3 test Python",
        "language": "python",
        "env": env,
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    work = tmp_path_factory.mktemp("notebook")
    jupyter_dir = work / "jupyter"
    run_dir = work / "run"
    run_dir.mkdir()
    # This checkout's library first, as pytest imports it; IPython's profile in the
    # temporary folder rather than the home folder.
    python_path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    _write_kernel_spec(
        jupyter_dir,
        {"PYTHONPATH": python_path, "IPYTHONDIR": str(work / "ipython")},
    )
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    with pytest.MonkeyPatch.context() as patch:
        # Only the spec above can match KERNEL_NAME; connection files go to the temporary
        # folder too.
        patch.setenv("JUPYTER_PATH", str(jupyter_dir))
        patch.setenv("JUPYTER_RUNTIME_DIR", str(work / "runtime"))
        client = NotebookClient(
            notebook,
            kernel_name=KERNEL_NAME,
            timeout=600,
            startup_timeout=180,
            allow_errors=True,
            resources={"metadata": {"path": str(run_dir)}},
        )
        client.execute()
    return {"notebook": notebook, "run_dir": run_dir}


def _outputs(notebook):
    for cell in notebook.cells:
        if cell.cell_type == "code":
            yield from cell.outputs


def _stdout(notebook):
    return "".join(
        output.text
        for output in _outputs(notebook)
        if output.output_type == "stream" and output.name == "stdout"
    )


def test_stored_notebook_has_no_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells
    for index, cell in enumerate(code_cells):
        assert cell.outputs == [], f"code cell {index} is stored with outputs"
        assert cell.execution_count is None, f"code cell {index} is stored with a count"
    assert notebook.metadata.kernelspec.name == "python3"


@pytest.mark.slow
def test_notebook_runs_without_errors(executed):
    errors = [
        ANSI_ESCAPE.sub("", "\n".join(output.traceback))
        for output in _outputs(executed["notebook"])
        if output.output_type == "error"
    ]
    assert not errors, "\n\n".join(errors)
    for index, cell in enumerate(executed["notebook"].cells):
        if cell.cell_type == "code":
            assert cell.execution_count is not None, f"code cell {index} did not run"
    # Everything the notebook shows is shown inline: it leaves no files behind.
    assert list(executed["run_dir"].iterdir()) == []


@pytest.mark.slow
def test_notebook_training_loss_falls(executed):
    stdout = _stdout(executed["notebook"])
    steps = [(int(match[1]), float(match[2])) for match in STEP_LINE.finditer(stdout)]
    assert len(steps) >= 2, stdout
    assert [step for step, _ in steps] == sorted(step for step, _ in steps)
    assert steps[-1][1] < steps[0][1]


@pytest.mark.slow
def test_notebook_prints_well_formed_detections(executed):
    lines = _stdout(executed["notebook"]).splitlines()
    starts = [index for index, line in enumerate(lines) if IMAGE_LINE.fullmatch(line)]
    assert len(starts) == TEST_IMAGES, "\n".join(lines)
    _, test_boxes = make_dataset(TEST_IMAGES, seed=TEST_SEED, size=(SIZE, SIZE))
    total = 0
    for image_index, start in enumerate(starts):
        number, count, true_count = map(int, IMAGE_LINE.fullmatch(lines[start]).groups())
        assert number == image_index
        truth = test_boxes[image_index]
        assert true_count == int(np.sum(truth[:, 2] > truth[:, 0]))
        boxes = []
        for line in lines[start + 1 :]:
            if not line.startswith("  "):
                break
            boxes.append(line)
        assert len(boxes) == count, "\n".join([lines[start], *boxes])
        scores = []
        for line in boxes:
            match = BOX_LINE.fullmatch(line)
            assert match, f"not a detection line: {line!r}"
            label, score = match[1], float(match[2])
            x_min, y_min, x_max, y_max = map(int, match.groups()[2:])
            assert label in CLASS_NAMES
            assert SCORE_THRESHOLD <= score <= 1
            assert 0 <= x_min <= x_max <= SIZE and 0 <= y_min <= y_max <= SIZE, line
            scores.append(score)
        assert scores == sorted(scores, reverse=True), "detections are not best first"
        total += count
    # A low score threshold after a little training: some boxes pass it, so the lines above
    # were checked.
    assert total > 0


@pytest.mark.slow
def test_notebook_shows_the_picture(executed):
    pictures = [
        output.data["image/png"]
        for output in _outputs(executed["notebook"])
        if output.output_type in ("display_data", "execute_result") and "image/png" in output.data
    ]
    assert len(pictures) == 1
    image = Image.open(io.BytesIO(base64.b64decode(pictures[0])))
    image.load()
    assert image.format == "PNG"
    # The test images side by side, each enlarged by the same factor.
    assert image.width == TEST_IMAGES * image.height
    assert image.height >= SIZE and image.height % SIZE == 0
    assert len(np.unique(np.asarray(image.convert("RGB")).reshape(-1, 3), axis=0)) > 100
