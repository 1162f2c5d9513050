"""IoU k-means anchors: hand-computed IoUs, recovery of known clusters, and tools/kmeans.py."""

from pathlib import Path

import numpy as np
import pytest
from helpers import load_tool
from PIL import Image

from yolo3.data.annotations import Entry
from yolo3.data.kmeans import (
    format_anchors,
    image_hw,
    iou_kmeans,
    letterboxed_sizes,
    mean_best_iou,
    wh_iou,
)
from yolo3.model.resources import read_anchors

ROOT = Path(__file__).resolve().parents[1]
CENTRES = np.array([[10.0, 20.0], [50.0, 40.0], [120.0, 200.0]])


kmeans_tool = load_tool("kmeans")


def clustered(seed=0, per_cluster=200, spread=0.05):
    rng = np.random.default_rng(seed)
    noise = np.exp(rng.normal(0, spread, size=(len(CENTRES), per_cluster, 2)))
    return (CENTRES[:, None, :] * noise).reshape(-1, 2)


def test_iou_by_hand():
    # 10x10 vs 5x10: overlap 5*10 = 50, union 100 + 50 - 50 = 100 -> 0.5.
    # 10x10 vs 20x20: overlap 100, union 100 + 400 - 100 = 400 -> 0.25.
    # 4x8 vs 5x10: overlap 32, union 32 + 50 - 32 = 50 -> 0.64; vs 20x20: 32 / 400 = 0.08.
    iou = wh_iou([[10, 10], [4, 8]], [[5, 10], [20, 20]])
    np.testing.assert_allclose(iou, [[0.5, 0.25], [0.64, 0.08]])
    # Best per box: 0.5 and 0.64 -> mean 0.57.
    assert mean_best_iou([[10, 10], [4, 8]], [[5, 10], [20, 20]]) == pytest.approx(0.57)
    assert mean_best_iou([[7, 3]], [[7, 3]]) == 1.0


def test_recovers_known_clusters():
    anchors, score = iou_kmeans(clustered(), 3, seed=0)
    np.testing.assert_allclose(anchors, CENTRES, rtol=0.03)
    assert anchors.dtype == np.float64 and anchors.shape == (3, 2)
    # 5% log-normal noise per side leaves each box ~0.93 IoU from its centre on average.
    assert 0.9 < score < 1.0
    assert score == pytest.approx(mean_best_iou(clustered(), anchors))


def test_result_is_a_fixed_point_sorted_by_area():
    wh = np.random.default_rng(3).uniform(4, 300, size=(500, 2))
    anchors, _ = iou_kmeans(wh, 9, seed=1)
    areas = anchors.prod(axis=1)
    assert np.all(np.diff(areas) >= 0)
    # Converged k-means: every anchor is the median of the boxes closest to it.
    assignment = np.argmax(wh_iou(wh, anchors), axis=1)
    for index, anchor in enumerate(anchors):
        np.testing.assert_allclose(anchor, np.median(wh[assignment == index], axis=0))


def test_deterministic_for_a_seed_and_restarts_only_help():
    wh = np.random.default_rng(5).uniform(4, 300, size=(400, 2))
    first = iou_kmeans(wh, 6, seed=7)
    again = iou_kmeans(wh, 6, seed=7)
    np.testing.assert_array_equal(first[0], again[0])
    assert first[1] == again[1]
    single = iou_kmeans(wh, 6, seed=7, restarts=1)
    assert first[1] >= single[1]


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="2 distinct box sizes cannot give 3"):
        iou_kmeans([[1, 2], [1, 2], [3, 4]], 3)
    with pytest.raises(ValueError, match="expected \\(N, 2\\)"):
        iou_kmeans(np.ones((4, 3)), 2)
    with pytest.raises(ValueError, match="positive and finite"):
        mean_best_iou([[0, 3]], [[1, 1]])


def test_format_anchors_round_trips_through_read_anchors(tmp_path):
    anchors = np.array([[9.6, 13.2], [16, 30], [0.2, 23.5], [30, 61], [62.49, 45], [59, 119]])
    text = format_anchors(anchors)
    assert text == "10,13,  16,30,  1,24,  30,61,  62,45,  59,119"
    path = tmp_path / "anchors.txt"
    path.write_text(text + "\n")
    expected = [[10, 13], [16, 30], [1, 24], [30, 61], [62, 45], [59, 119]]
    np.testing.assert_array_equal(read_anchors(path), expected)


def _jpeg(path, width, height, orientation=None):
    image = Image.new("RGB", (width, height), (90, 120, 30))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    image.save(path, exif=exif.tobytes())


def test_image_size_honours_exif_rotation(tmp_path):
    _jpeg(tmp_path / "plain.jpg", 40, 20)
    _jpeg(tmp_path / "rotated.jpg", 40, 20, orientation=6)
    _jpeg(tmp_path / "flipped.jpg", 40, 20, orientation=3)
    assert image_hw(tmp_path / "plain.jpg") == (20, 40)
    assert image_hw(tmp_path / "rotated.jpg") == (40, 20)
    assert image_hw(tmp_path / "flipped.jpg") == (20, 40)
    (tmp_path / "bad.jpg").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*bad.jpg"):
        image_hw(tmp_path / "bad.jpg")
    with pytest.raises(FileNotFoundError, match="missing.jpg does not exist"):
        image_hw(tmp_path / "missing.jpg")


def _entry(path, boxes):
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    return Entry(str(path), boxes, np.zeros(len(boxes), np.int64), "train.txt", 1)


def test_letterboxed_sizes(tmp_path):
    _jpeg(tmp_path / "wide.jpg", 200, 100)
    entries = [
        _entry(tmp_path / "wide.jpg", [[10, 10, 60, 35], [-10, 0, 20, 50], [300, 0, 350, 10]]),
        _entry(tmp_path / "missing.jpg", [[0, 0, 5, 5]]),
        _entry(tmp_path / "background.jpg", []),  # not opened: it has no boxes
    ]
    wh, unreadable, outside = letterboxed_sizes(entries, (416, 416), threads=2)
    # 200x100 -> 416x208 inside 416x416: both axes scale by 2.08. 50x25 -> 104x52; the
    # second box is clipped to 0..20 first (20x50 -> 41.6x104); the third is outside.
    np.testing.assert_allclose(wh, [[104, 52], [41.6, 104]])
    assert outside == 1
    assert [path for path, _ in unreadable] == [str(tmp_path / "missing.jpg")]
    raw, unreadable, outside = letterboxed_sizes(entries, None)
    np.testing.assert_array_equal(raw, [[50, 25], [30, 50], [50, 10], [5, 5]])
    assert (unreadable, outside) == ([], 0)


def _annotated_images(tmp_path):
    lines = []
    for index, (w, h) in enumerate(clustered(per_cluster=4).round().astype(int)):
        name = f"img{index}.jpg"
        _jpeg(tmp_path / name, 416, 208)  # letterboxed to 416 px: boxes scale by 1.0
        lines.append(f"{name} 0,0,{w},{h},0")
    lines.append("broken.jpg 0,0,10,10,0")
    lines.append("negative.jpg 5,5,1,9,0")
    (tmp_path / "broken.jpg").write_bytes(b"junk")
    path = tmp_path / "train.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_tool_writes_anchors_that_read_back(tmp_path, capsys):
    annotations = _annotated_images(tmp_path)
    output = tmp_path / "anchors.txt"
    argv = ["--annotations", str(annotations), "-k", "6", "--output", str(output)]
    assert kmeans_tool.main(argv + ["--threads", "2", "--restarts", "2"]) == 0
    anchors = read_anchors(output)
    assert anchors.shape == (6, 2) and np.all(np.diff(anchors.prod(axis=1)) >= 0)
    out = capsys.readouterr().out
    assert "12 boxes from 13 images, sizes in pixels of a 416 px input" in out
    assert "skipped inverted_box: 1" in out
    assert "skipped 1 images that could not be read" in out and "broken.jpg" in out
    assert f"anchors: {output.read_text().strip()}" in out
    assert "mean best IoU: 0.9" in out
    assert "tiny_yolo_anchors.txt (x 1): " in out


def test_tool_without_letterbox_opens_no_image(tmp_path, capsys):
    annotations = tmp_path / "train.txt"
    annotations.write_text("".join(f"gone{w}.jpg 0,0,{w},{w + 3},0\n" for w in range(10, 40, 3)))
    argv = ["--annotations", str(annotations), "-k", "5", "--no-letterbox"]
    assert kmeans_tool.main(argv + ["--restarts", "1"]) == 0
    out = capsys.readouterr().out
    assert "10 boxes from 10 images, sizes in original pixels" in out and "skipped" not in out


def test_tool_refuses_what_cannot_be_written(tmp_path, capsys):
    argv = ["--annotations", str(tmp_path / "x.txt"), "-k", "5", "--output", "a.txt"]
    assert kmeans_tool.main(argv) == 2
    assert "anchors files hold 6 (tiny) or 9 (yolov3)" in capsys.readouterr().err
    assert kmeans_tool.main(["--annotations", "x.txt", "--input-size", "400"]) == 2
    assert "input size 400 is not a multiple of 32" in capsys.readouterr().err
    few = tmp_path / "few.txt"
    few.write_text("a.jpg 0,0,5,5,0\n")
    assert kmeans_tool.main(["--annotations", str(few), "--no-letterbox"]) == 2  # bad input
    assert "1 boxes are too few for 9 anchors" in capsys.readouterr().err
