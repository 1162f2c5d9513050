"""Weights, Darknet cfgs and exported detectors from elsewhere: refused in one line, nothing run.

Each hostile file ends a command with exit status 2 and one ``error:`` line that names it,
never a traceback: a Darknet cfg that asks for heads of a billion filters is refused at its
line before a model is built; a ``.keras`` archive naming ``os.system`` as a layer class is
refused by Keras's safe loading, and the command says so; a SavedModel is read by its
``assets.extra/yolo3.json`` before any of its code runs, so one whose ``metadata()``
function writes a file is refused without that function running.
"""

import json
import zipfile

import h5py
import numpy as np
import pytest
from darknet_files import write_cfg
from helpers import SMALL_ANCHORS, load_tool, micro_model
from PIL import Image
from train_helpers import small_record_set, train_args, write_anchors

from yolo3.checkpoint import darknet
from yolo3.checkpoint.weights import MAX_VALUES
from yolo3.inference.detector_spec import DetectorSpec
from yolo3.inference.export import SAVED_MODEL_SPEC, export_detector, read_artifact_metadata
from yolo3.inference.runtime import load_detector
from yolo3.model.head import HeadSpec

SIZE = 64
CLASSES = ("circle", "square")


def _one_error_line(capsys, *names):
    """The single ``error:`` line of the captured stderr, checked to name each of ``names``."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    for name in names:
        assert str(name) in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    classes = root / "classes.txt"
    classes.write_text("\n".join(CLASSES) + "\n")
    images = root / "images"
    images.mkdir()
    Image.fromarray(np.full((48, 40, 3), 90, np.uint8)).save(images / "a.png")
    return {
        "root": root,
        "classes": str(classes),
        "anchors": write_anchors(root / "anchors.txt"),
        "images": str(images),
    }


# -- Darknet cfgs ------------------------------------------------------------------------


def test_cfg_whose_classes_make_heads_of_a_billion_filters_is_refused_before_building(
    tmp_path, capsys
):
    cfg, weights = tmp_path / "huge.cfg", tmp_path / "huge.weights"
    # 3 anchors x (5 + 333,333,328 classes) = 999,999,999 filters a head: 2 TB of kernel.
    write_cfg(cfg, "tiny", 333_333_328, SIZE)
    weights.write_bytes(np.zeros(8, np.int32).tobytes())
    output = tmp_path / "out.weights.h5"
    assert load_tool("convert").main([str(cfg), str(weights), str(output)]) == 2
    line = _one_error_line(capsys, cfg, "line ", "filters=999999999")
    assert str(darknet.MAX_FILTERS) in line
    assert not output.exists()


def _edit_cfg(path, old, new, count=1):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, count))


@pytest.mark.parametrize(
    ("old", "new", "named"),
    [
        ("width=64", "width=100000", "width=100000"),
        ("classes=2", "classes=1000000", "classes=1000000"),
        ("size=3", "size=99", "size=99"),
        # Four thousand copies of a 256-channel layer into one 1x1 convolution of 128
        # filters: 131M values there, the network over MAX_PARAMETERS.
        ("layers = -4", "layers = " + ",".join(["-4"] * 8200), "parameters"),
    ],
)
def test_cfg_values_that_would_allocate_absurd_tensors_name_their_line(tmp_path, old, new, named):
    cfg = tmp_path / "tiny.cfg"
    write_cfg(cfg, "tiny", 2, SIZE)
    _edit_cfg(cfg, old, new)
    with pytest.raises(ValueError, match=rf"tiny\.cfg, line \d+: .*{named}"):
        darknet.describe_cfg(darknet.parse_cfg(cfg), str(cfg))


@pytest.mark.parametrize(
    ("model_type", "num_classes", "size"),
    [("yolov3", 80, 416), ("tiny", 80, 1280), ("yolov3", 9418, 544), ("tiny", 21841, 608)],
)
def test_bounds_admit_real_cfgs(tmp_path, model_type, num_classes, size):
    """COCO at 416-1280 px, YOLO9000's 9418 classes, ImageNet-21k's 21841."""
    cfg = tmp_path / "real.cfg"
    write_cfg(cfg, model_type, num_classes, size)
    info = darknet.describe_cfg(darknet.parse_cfg(cfg), str(cfg))
    assert info["num_classes"] == num_classes and info["input_size"] == (size, size)


# -- Keras archives ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def os_system_archive(files):
    """A ``.keras`` archive whose model has a layer of class ``system`` from module ``os``:
    were it called with its config, it would create the file ``ran``."""
    marker = files["root"] / "ran"
    layer = {
        "module": "os",
        "class_name": "system",
        "config": {"command": f"touch {marker}"},
        "registered_name": None,
        "name": "conv_0",
        "inbound_nodes": [],
    }
    config = {
        "module": "keras.src.models.functional",
        "class_name": "Functional",
        "config": {"name": "model", "layers": [layer], "input_layers": [], "output_layers": []},
        "registered_name": "Functional",
    }
    path = files["root"] / "model.keras"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("metadata.json", json.dumps({"keras_version": "3.15.1"}))
        archive.writestr("config.json", json.dumps(config))
        archive.writestr("model.weights.h5", b"")
    return path, marker


@pytest.mark.parametrize("command", ["convert", "detect", "export", "evaluate"])
def test_keras_archive_naming_os_system_is_one_line(files, os_system_archive, command, capsys):
    path, marker = os_system_archive
    out = files["root"] / f"out-{command}"
    head = ["--classes", files["classes"], "--anchors", files["anchors"], "--input-size", "64"]
    argv = {
        "convert": ["--to-darknet", str(path), str(out) + ".cfg", str(out) + ".weights"]
        + ["--num-classes", "2", "--anchors", files["anchors"], "--input-size", "64"],
        "detect": [files["images"], "--weights", str(path), "--output", str(out), *head],
        "export": ["--weights", str(path), "--format", "saved_model", "--output", str(out), *head],
        "evaluate": ["--weights", str(path), "--annotations", "none.txt", *head],
    }[command]
    assert load_tool(command).main(argv) == 2
    line = _one_error_line(capsys, path, "'system'")
    assert ".weights.h5" in line  # what to give instead
    assert not marker.exists()


def test_train_weights_naming_os_system_is_one_line(files, os_system_archive, tmp_path, capsys):
    path, marker = os_system_archive
    records = small_record_set(tmp_path / "records", train=4, val=0)
    argv = train_args(records, tmp_path / "run", files["anchors"], "--weights", str(path))
    assert load_tool("train").main([*argv, "--epochs", "1"]) == 2
    _one_error_line(capsys, path, "'system'")
    assert not marker.exists()


def test_weights_file_declaring_a_gigabyte_of_values_is_refused_before_reading(
    files, tmp_path, capsys
):
    path = tmp_path / "bomb.weights.h5"
    with h5py.File(path, "w") as f:  # a few KB: no chunk is written, each reads as zeros
        variables = f.create_group("layers/conv_0/vars")
        variables.attrs["name"] = "conv_0"
        variables.create_dataset("0", (MAX_VALUES + 1,), "f4", chunks=(2**20,))
    head = ["--classes", files["classes"], "--anchors", files["anchors"], "--input-size", "64"]
    argv = [files["images"], "--weights", str(path), "--output", str(tmp_path / "out"), *head]
    assert load_tool("detect").main(argv) == 2
    _one_error_line(capsys, path, f"more than {MAX_VALUES:,}")


# -- Exported detectors ------------------------------------------------------------------


@pytest.fixture(scope="module")
def writing_saved_model(files):
    """A SavedModel whose ``metadata()`` returns yolo3-like JSON after writing the file
    ``metadata-ran``, and whose ``serving_default`` writes ``serving-ran``."""
    import tensorflow as tf

    root = files["root"]
    marker = root / "metadata-ran"
    module = tf.Module()
    text = json.dumps({"format": "yolo3-detector", "engine": "saved_model"})

    @tf.function(input_signature=[])
    def metadata():
        with tf.control_dependencies([tf.io.write_file(str(marker), "ran")]):
            return tf.constant(text)

    @tf.function(input_signature=[tf.TensorSpec((None, SIZE, SIZE, 3), tf.uint8, name="images")])
    def serve(images):
        with tf.control_dependencies([tf.io.write_file(str(root / "serving-ran"), "ran")]):
            return {"boxes": tf.zeros((tf.shape(images)[0], 1, 4))}

    module.metadata, module.serve = metadata, serve
    path = root / "writing_saved_model"
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})
    return path


@pytest.mark.parametrize("command", ["detect", "evaluate"])
def test_saved_model_whose_metadata_op_writes_a_file_is_refused_unrun(
    files, writing_saved_model, command, capsys
):
    path = writing_saved_model
    out = files["root"] / f"saved-model-{command}"
    argv = {
        "detect": [files["images"], "--weights", str(path), "--output", str(out)],
        "evaluate": ["--weights", str(path), "--annotations", "none.txt", "--output", str(out)],
    }[command]
    assert load_tool(command).main(argv) == 2
    line = _one_error_line(capsys, path, SAVED_MODEL_SPEC)
    assert "export it again" in line
    assert not (files["root"] / "metadata-ran").exists()
    assert not (files["root"] / "serving-ran").exists()


@pytest.fixture(scope="module")
def exported_saved_model(files):
    """A SavedModel of yolo3 export: a three-convolution network with tiny's heads."""
    path = files["root"] / "exported"
    spec = DetectorSpec(HeadSpec(anchors=SMALL_ANCHORS, class_names=CLASSES, input_hw=SIZE))
    export_detector(micro_model(len(CLASSES), SIZE), spec, path, engine="saved_model")
    return path


def test_exported_saved_model_carries_its_spec_as_a_file_that_detect_reads(
    files, exported_saved_model, capsys
):
    recorded = json.loads((exported_saved_model / SAVED_MODEL_SPEC).read_text())
    assert recorded == read_artifact_metadata(exported_saved_model)
    assert recorded["classes"] == list(CLASSES) and recorded["input_size"] == [SIZE, SIZE]
    assert recorded["engine"] == "saved_model" and recorded["outputs"] == "detections"
    out = files["root"] / "exported-detections"
    argv = [files["images"], "--weights", str(exported_saved_model), "--output", str(out)]
    assert load_tool("detect").main(argv) == 0
    assert json.loads((out / "detections.json").read_text())["classes"] == list(CLASSES)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"\xff\xfe not text", "not JSON"),
        (b"[" * 100_000, "not JSON"),
        (b'["yolo3-detector"]', "not a yolo3 detector"),
        (b'{"format": "yolo3-detector", "engine": "saved_model", "outputs": "detections"}',
         "records no anchors"),
        ("score_threshold", "KeyError: 'score_threshold'"),
        ("input_size", "input size"),
        ("max_detections", "detections"),
    ],
)  # fmt: skip
def test_saved_model_spec_file_from_elsewhere_is_checked_before_loading(
    exported_saved_model, tmp_path, content, problem
):
    """A spec file that is not the JSON export writes, or asks for absurd sizes, is refused
    naming the folder; the SavedModel beside it is never loaded (its graph is gone here)."""
    path = tmp_path / "saved_model"
    path.mkdir()
    (path / "saved_model.pb").write_bytes(b"")
    if isinstance(content, str):  # the exported spec with one value made absurd, or left out
        spec = json.loads((exported_saved_model / SAVED_MODEL_SPEC).read_text())
        absurd = {"input_size": [2**20, 2**20], "max_detections": 10**12}
        if content in absurd:
            spec[content] = absurd[content]
        else:
            del spec[content]
        content = json.dumps(spec).encode()
    (path / SAVED_MODEL_SPEC).parent.mkdir()
    (path / SAVED_MODEL_SPEC).write_bytes(content)
    with pytest.raises(ValueError, match=problem) as raised:
        load_detector(path)
    assert str(path) in str(raised.value) and "\n" not in str(raised.value)


def test_tflite_header_over_garbage_is_one_line(tmp_path):
    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(range(256)) * 4)
    with pytest.raises(ValueError, match="model.tflite") as raised:
        load_detector(path)
    assert "\n" not in str(raised.value)
