"""tools/preprocess.py end to end: bad inputs, boxes following pixels, determinism, resume.

Every test builds its images in ``tmp_path`` and runs the real command line through
``main([...])`` (the kill test also as a subprocess), then reads the shards back with
:func:`yolo3.data.records.parse_example_numpy`.
"""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from helpers import load_tool
from PIL import Image

from yolo3.data import records
from yolo3.data.augment import letterbox

ROOT = Path(__file__).resolve().parents[1]
tool = load_tool("preprocess")
SIZE = 64
BACKGROUND = (90, 90, 90)
COLOURS = {0: (255, 0, 0), 1: (0, 255, 0), 2: (0, 0, 255)}
CLASSES = ("red", "green", "blue")
# Keep colours: with these the HSV jitter is the identity and a box keeps its class colour.
KEEP_COLOURS = ["--hue", "0", "--saturation", "1", "--value", "1"]
# Tests of something else than the validation split keep every image in training.
NO_VAL = ["--val-fraction", "0"]


def _rectangle(height, width, box, colour):
    """An ``(height, width, 3)`` uint8 image: BACKGROUND with ``box`` (x0, y0, x1, y1) filled."""
    image = np.full((height, width, 3), BACKGROUND, np.uint8)
    x0, y0, x1, y1 = box
    image[y0:y1, x0:x1] = colour
    return image


def _write_classes(folder, names=CLASSES):
    path = folder / "classes.txt"
    path.write_text("".join(f"{name}\n" for name in names))
    return str(path)


def _write_lines(folder, lines, name="train.txt"):
    path = folder / name
    path.write_text("".join(f"{line}\n" for line in lines))
    return str(path)


def _box_text(box, class_id):
    return ",".join(str(v) for v in (*box, class_id))


def _rectangles_dataset(folder, count, rng, *, num_classes=3, name="train.txt"):
    """``count`` PNGs of random sizes, one solid box each in its class colour.

    Returns the annotation file path and ``{image path: (box, class id)}``.
    """
    folder.mkdir(parents=True, exist_ok=True)
    lines, truth = [], {}
    for index in range(count):
        height, width = (int(v) for v in rng.integers(40, 120, size=2))
        box_w, box_h = (int(v) for v in rng.integers(12, 30, size=2))
        x0, y0 = int(rng.integers(0, width - box_w)), int(rng.integers(0, height - box_h))
        box = (x0, y0, x0 + box_w, y0 + box_h)
        class_id = index % num_classes
        path = folder / f"img{index:04d}.png"
        Image.fromarray(_rectangle(height, width, box, COLOURS[class_id])).save(path)
        lines.append(f"{path.name} {_box_text(box, class_id)}")
        truth[str(path)] = (box, class_id)
    return _write_lines(folder, lines, name), truth


def _read_set(directory):
    """``(manifest, {split: [record, ...]})`` of a record set, in manifest order."""
    manifest = records.read_manifest(str(directory))
    decoded = {}
    for split in manifest["splits"]:
        decoded[split] = [
            records.parse_example_numpy(serialized.numpy())
            for path in records.shard_paths(str(directory), manifest, split)
            for serialized in tf.data.TFRecordDataset(path)
        ]
    return manifest, decoded


def _tree(directory):
    """``{relative path: bytes}`` of every file under ``directory``."""
    directory = Path(directory)
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def _interior_colour(image, box, margin=3):
    """Mean colour of ``box`` shrunk by ``margin`` px on each side (resize blurs the edges)."""
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    return image[y0 + margin : y1 - margin, x0 + margin : x1 - margin].reshape(-1, 3).mean(0)


def _check_boxes_inside(record):
    boxes = record["boxes"]
    assert (boxes >= 0).all(), boxes
    assert (boxes[:, [0, 2]] <= record["width"]).all(), boxes
    assert (boxes[:, [1, 3]] <= record["height"]).all(), boxes
    assert (boxes[:, 2] - boxes[:, 0] >= 1).all() and (boxes[:, 3] - boxes[:, 1] >= 1).all()


def _keys(data):
    """Every dict key in a nested structure of dicts and lists."""
    if isinstance(data, dict):
        return set(data) | {key for value in data.values() for key in _keys(value)}
    if isinstance(data, list):
        return {key for value in data for key in _keys(value)}
    return set()


def _run(argv):
    return tool.main([*argv, "--quiet"])


# --- bad inputs -----------------------------------------------------------------------------


def _save_jpeg(image, path, **kwargs):
    Image.fromarray(image).save(path, "JPEG", quality=95, **kwargs)


def _bad_dataset(folder):
    """Images and one annotation file holding every kind of bad input; returns its path."""
    folder.mkdir()
    red_box = (8, 8, 40, 32)
    rgb = _rectangle(48, 64, red_box, COLOURS[0])
    _save_jpeg(rgb, folder / "good.jpg")
    Image.fromarray(rgb).convert("L").save(folder / "gray.png")
    Image.fromarray(np.dstack([rgb, np.full((48, 64), 255, np.uint8)])).save(folder / "rgba.png")
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE).save(folder / "palette.png")
    Image.fromarray(rgb).convert("CMYK").save(folder / "cmyk.jpg", "JPEG", quality=95)
    deep = rgb[..., 0].astype(np.uint16) * 257  # 16 bits per pixel, full range
    Image.fromarray(deep).save(folder / "deep.png")
    assert Image.open(folder / "deep.png").mode.startswith("I")
    # Upright 48 wide x 64 tall with a red box at x 5..25, y 30..50; stored rotated 90 degrees
    # counter-clockwise with EXIF orientation 6 ("rotate 90 clockwise to display").
    upright = _rectangle(64, 48, (5, 30, 25, 50), COLOURS[0])
    exif = Image.Exif()
    exif[0x0112] = 6
    _save_jpeg(
        np.asarray(Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90)),
        folder / "rotated.jpg",
        exif=exif.tobytes(),
    )
    whole = (folder / "good.jpg").read_bytes()
    (folder / "truncated.jpg").write_bytes(whole[: len(whole) // 2])
    (folder / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\nthis is not a PNG at all")
    # A 3 px wide box in a 320 px image is 0.6 px wide at 64 px: dropped from the clean copy.
    _save_jpeg(_rectangle(240, 320, (100, 50, 300, 200), COLOURS[1]), folder / "large.jpg")
    # Over twice Image.MAX_IMAGE_PIXELS, which the test lowers: a decompression bomb.
    Image.new("RGB", (500, 400)).save(folder / "huge.png")
    lines = [
        f"good.jpg {_box_text(red_box, 0)}",  # 1
        "",  # 2 blank
        "# a comment",  # 3
        f"gray.png {_box_text(red_box, 0)}",  # 4
        f"rgba.png {_box_text(red_box, 0)}",  # 5
        f"palette.png {_box_text(red_box, 0)}",  # 6
        f"cmyk.jpg {_box_text(red_box, 0)}",  # 7
        f"deep.png {_box_text(red_box, 0)}",  # 8
        "rotated.jpg 5,30,25,50,0",  # 9
        "missing.jpg 1,1,9,9,0",  # 10
        "truncated.jpg 1,1,9,9,0",  # 11
        "corrupt.png 1,1,9,9,0",  # 12
        "good.jpg -10,-5,40,32,0 30,20,100,90,1",  # 13: both clipped to the image
        "good.jpg 40,8,8,32,0 8,8,40,32,0",  # 14: inverted box
        "good.jpg 8,8,8,32,0 8,8,40,32,0",  # 15: zero-area box
        "good.jpg 8,8,40,32,7 8,8,40,32,0",  # 16: class out of range
        "good.jpg 8,8,4x0,32,0 8,8,40,32,0",  # 17: malformed number
        "good.jpg 8,8,40,32,9",  # 18: class out of range, nothing left on the line
        "good.jpg 200,200,220,220,0 8,8,40,32,0",  # 19: box entirely outside the image
        "1,2,3,4,0",  # 20: no image path
        "   ",  # 21 blank
        "large.jpg 100,50,103,200,1 100,50,300,200,1",  # 22: first box too thin at 64 px
        "huge.png 1,1,9,9,0",  # 23
    ]
    return _write_lines(folder, lines)


def test_bad_inputs_are_converted_or_skipped_and_counted(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 80_000)
    annotations = _bad_dataset(tmp_path / "bad")
    classes = _write_classes(tmp_path, ("a", "b"))
    output = tmp_path / "out"
    argv = ["--annotations", annotations, "--classes", classes, "--output", str(output)]
    argv += ["--input-size", str(SIZE), "--copies", "1", "--workers", "1", *NO_VAL]
    assert tool.main(argv) == 0
    printed = capsys.readouterr()
    assert "images/s" in printed.out  # the rate, once, in plain text: output is not a terminal
    assert "\r" not in printed.out + printed.err

    manifest, decoded = _read_set(output)
    assert manifest["rejects"] == {
        "all_boxes_rejected": 1,  # line 18
        "box_outside_image": 1,  # line 19
        "class_out_of_range": 2,  # lines 16, 18
        "inverted_box": 1,
        "malformed_number": 1,
        "missing_image": 1,
        "missing_path": 1,
        "unreadable_image": 3,  # truncated, corrupt, huge
        "zero_area_box": 1,
    }
    counts = manifest["counts"]
    expected = {
        "lines": 23,
        "blank_lines": 2,
        "comment_lines": 1,
        "converted_grayscale": 1,
        "converted_alpha": 1,
        "converted_palette": 1,
        "converted_cmyk": 1,
        "converted_high_bit_depth": 1,
        "exif_rotated": 1,
        "boxes_clipped": 2,  # line 13
        "boxes_dropped_clean": 1,  # line 22
        "images": 18,  # parsed lines with an image: 23 - 3 blank/comment - 2 rejected lines
        "images_written": 14,  # 18 - missing - truncated - corrupt - huge
        "images_rejected": 4,
        "rejected_boxes": 5,  # by the parser, lines 14-18; line 19 is found later
        "rejected_lines": 2,
    }
    assert {key: counts.get(key, 0) for key in expected} == expected
    train = decoded["train"]
    assert manifest["splits"]["train"]["images"] == 14
    assert len(train) == 14 * 2 == manifest["splits"]["train"]["records"]
    # Every box that survived parsing and clipping is either stored or counted as dropped.
    # Parsed boxes less the one outside its image (line 19) and those of lines 10-12 and 23.
    boxes_in = counts["boxes"] - 1 - 4
    clean = [r for r in train if r["copy"] == 0]
    augmented = [r for r in train if r["copy"] == 1]
    assert sum(len(r["boxes"]) for r in clean) + counts["boxes_dropped_clean"] == boxes_in
    stored = sum(len(r["boxes"]) for r in augmented)
    assert stored + counts.get("boxes_dropped_augmented", 0) == boxes_in
    for record in train:
        _check_boxes_inside(record)
        assert record["image"].shape == (SIZE, SIZE, 3)

    rejects = (output / "rejects.txt").read_text().splitlines()
    assert len(rejects) == sum(manifest["rejects"].values())
    for line in rejects:
        where, reason, message = line.split("\t")
        assert where.startswith(f"{annotations}:") and reason in manifest["rejects"]
        assert message.startswith(f"{where}: ")
    by_line = {int(line.split("\t")[0].rsplit(":", 1)[1]): line for line in rejects}
    assert "missing_image" in by_line[10] and "truncated.jpg" in by_line[11]
    assert "corrupt.png" in by_line[12] and "4x0" in by_line[17]
    assert "DecompressionBombError" in by_line[23]

    # The EXIF-rotated image is stored upright: 48 x 64 letterboxed into 64 x 64 is offset 8
    # px in x, so the upright box 5,30,25,50 becomes 13,30,33,50, and it is red there.
    (rotated,) = [r for r in clean if r["source"].endswith("rotated.jpg")]
    np.testing.assert_allclose(rotated["boxes"], [[13, 30, 33, 50]])
    np.testing.assert_allclose(
        _interior_colour(rotated["image"], (13, 30, 33, 50)), COLOURS[0], atol=40
    )
    # Converted images keep their content: red in colour modes, a gray level in the others.
    # good.jpg 64 x 48 -> scale 1, offset 8 in y: box 8,8,40,32 -> 8,16,40,40.
    for name in ("rgba.png", "palette.png", "cmyk.jpg"):
        (record,) = [r for r in clean if r["source"].endswith(name)]
        np.testing.assert_allclose(record["boxes"], [[8, 16, 40, 40]])
        np.testing.assert_allclose(
            _interior_colour(record["image"], (8, 16, 40, 40)), COLOURS[0], atol=40
        )
    for name in ("gray.png", "deep.png"):
        (record,) = [r for r in clean if r["source"].endswith(name)]
        inside = _interior_colour(record["image"], (8, 16, 40, 40))
        outside = record["image"][20:30, 50:60].reshape(-1, 3).mean(0)
        # Red 255 is gray 76 (L) or 255 (the red channel stored at 16 bits, rescaled).
        target = 255 if name == "deep.png" else 76
        np.testing.assert_allclose(inside, [target] * 3, atol=12)
        assert abs(outside - BACKGROUND[0]).max() < 12


def test_strict_turns_any_reject_into_an_error(tmp_path, capsys):
    annotations = _bad_dataset(tmp_path / "bad")
    argv = ["--classes", _write_classes(tmp_path, ("a", "b")), "--input-size", str(SIZE)]
    argv += ["--copies", "0", "--workers", "1", *NO_VAL]
    strict = ["--annotations", annotations, "--output", str(tmp_path / "a"), "--strict"]
    assert _run([*argv, *strict]) == 2
    error = capsys.readouterr().err
    assert f"{annotations}:14: box 40,8,8,32,0 has x_max < x_min" in error
    # An image that only the worker finds bad (the annotation line itself is fine).
    _save_jpeg(_rectangle(48, 64, (8, 8, 40, 32), COLOURS[0]), tmp_path / "bad" / "ok.jpg")
    lines = ["ok.jpg 8,8,40,32,0", "missing.jpg 8,8,40,32,0"]
    annotations = _write_lines(tmp_path / "bad", lines, "missing.txt")
    out = tmp_path / "b"
    assert _run([*argv, "--annotations", annotations, "--output", str(out), "--strict"]) == 2
    error = capsys.readouterr().err
    assert f"{annotations}:2: image " in error and "missing.jpg does not exist" in error
    assert not (out / "manifest.json").exists()
    # Without --strict the same input is a record set with one image.
    assert _run([*argv, "--annotations", annotations, "--output", str(out)]) == 0
    assert records.read_manifest(str(out))["splits"]["train"]["images"] == 1
    # Nothing usable: the first reasons, with their file:line, without --strict too.
    lines = ["a.jpg 40,8,8,32,0", "b.jpg 8,8,40,32,7"]
    annotations = _write_lines(tmp_path / "bad", lines, "useless.txt")
    assert _run([*argv, "--annotations", annotations, "--output", str(tmp_path / "c")]) == 2
    error = capsys.readouterr().err
    assert f"no usable images in {annotations}; the reasons:" in error
    assert f"{annotations}:1: box 40,8,8,32,0 has x_max < x_min" in error
    assert f"{annotations}:2: box 8,8,40,32,7" in error


# --- boxes and pixels -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def rectangles(tmp_path_factory):
    """12 images with one solid box each, and a classes file: ``(annotations, classes, truth)``."""
    folder = tmp_path_factory.mktemp("rectangles")
    annotations, truth = _rectangles_dataset(folder / "images", 12, np.random.default_rng(0))
    return annotations, _write_classes(folder), truth


def _rectangles_argv(rectangles, output, *extra):
    annotations, classes, _ = rectangles
    argv = ["--annotations", annotations, "--classes", classes, "--output", str(output)]
    return [*argv, "--input-size", str(SIZE), *NO_VAL, *extra]


def _ring(image, box, width=2):
    """The pixels in a band ``width`` px wide just outside ``box`` (1 px gap for the blur)."""
    x0, y0, x1, y1 = (int(round(v)) for v in box)
    bands = [
        image[y0:y1, max(x0 - 1 - width, 0) : max(x0 - 1, 0)],
        image[y0:y1, x1 + 1 : x1 + 1 + width],
        image[max(y0 - 1 - width, 0) : max(y0 - 1, 0), x0:x1],
        image[y1 + 1 : y1 + 1 + width, x0:x1],
    ]
    return np.concatenate([band.reshape(-1, 3) for band in bands])


def test_boxes_move_with_the_pixels_in_clean_and_augmented_copies(rectangles, tmp_path):
    _, _, truth = rectangles
    output = tmp_path / "out"
    argv = _rectangles_argv(rectangles, output, "--copies", "3", "--workers", "1")
    assert _run([*argv, "--format", "raw", *KEEP_COLOURS]) == 0
    manifest, decoded = _read_set(output)
    train = decoded["train"]
    assert sorted((r["source"], r["copy"]) for r in train) == sorted(
        (path, copy) for path in truth for copy in range(4)
    )
    # A random placement may push a box off the canvas: then it is dropped and counted.
    dropped = manifest["counts"].get("boxes_dropped_augmented", 0)
    assert sum(len(r["boxes"]) for r in train) + dropped == 12 * 4
    assert dropped < 4
    checked = 0
    for record in train:
        _check_boxes_inside(record)
        if not len(record["boxes"]):
            continue
        (box,), (class_id,) = record["boxes"], record["classes"]
        assert class_id == truth[record["source"]][1]
        if min(box[2] - box[0], box[3] - box[1]) < 8:
            continue  # too small to have an interior after the resize blur
        colour = COLOURS[class_id]
        np.testing.assert_allclose(
            _interior_colour(record["image"], box, margin=2), colour, atol=30
        )
        # Just outside the box is background or padding, never the box colour.
        ring = _ring(record["image"], box).astype(int)
        assert not (np.abs(ring - colour) < 30).all(axis=1).any()
        checked += 1
    assert checked >= 30


def test_raw_format_round_trips_the_letterbox_exactly(rectangles, tmp_path):
    _, _, truth = rectangles
    output = tmp_path / "out"
    assert _run(_rectangles_argv(rectangles, output, "--copies", "0", "--format", "raw")) == 0
    manifest, decoded = _read_set(output)
    assert manifest["image_format"] == "raw" and manifest["jpeg_quality"] is None
    clean = {record["source"]: record for record in decoded["train"]}
    assert sorted(clean) == sorted(truth)
    for path, (box, _) in truth.items():
        pixels, boxes, keep = letterbox(np.asarray(Image.open(path)), [box], (SIZE, SIZE))
        np.testing.assert_array_equal(clean[path]["image"], pixels)
        np.testing.assert_array_equal(clean[path]["boxes"], boxes[keep])
        assert clean[path]["copy"] == 0 and clean[path]["format"] == "raw"


# --- determinism, atomic writes and resumption ------------------------------------------------


def test_output_does_not_depend_on_the_number_of_workers(rectangles, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    argv = ["--copies", "2", "--num-shards", "3", "--val-fraction", "0.25"]
    assert _run(_rectangles_argv(rectangles, one, *argv, "--workers", "1")) == 0
    assert _run(_rectangles_argv(rectangles, two, *argv, "--workers", "2")) == 0
    files = _tree(one)
    assert files == _tree(two)
    assert {"manifest.json", "rejects.txt", "train-00002-of-00003.tfrecord"} <= set(files)


def _kill_dataset(folder):
    """~300 small images with some bad lines, enough for a few seconds of rendering."""
    annotations, _ = _rectangles_dataset(folder, 300, np.random.default_rng(1))
    with open(annotations, "a") as f:
        f.write("missing.png 1,1,9,9,0\nimg0000.png 9,1,1,9,0\n")
    return annotations


def test_killed_run_resumes_to_the_same_bytes(tmp_path):
    annotations = _kill_dataset(tmp_path / "images")
    classes = _write_classes(tmp_path)
    argv = ["--annotations", annotations, "--classes", classes, "--input-size", str(SIZE)]
    argv += ["--copies", "3", "--num-shards", "24", "--workers", "1", "--quiet", *NO_VAL]
    reference, killed = tmp_path / "uninterrupted", tmp_path / "interrupted"
    assert tool.main([*argv, "--output", str(reference)]) == 0

    script = str(ROOT / "tools" / "preprocess.py")
    log = tmp_path / "killed-run.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, script, *argv, "--output", str(killed)],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
        try:
            deadline = time.monotonic() + 60
            while not list(killed.glob("*.tfrecord")):  # the first shard renamed
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, "no shard written within 60 s"
                time.sleep(0.005)
            process.send_signal(signal.SIGKILL)
        finally:
            process.kill()
            process.wait()
    assert not (killed / "manifest.json").exists(), "the run finished before it was killed"
    finished = sorted(path.name for path in killed.glob("*.tfrecord"))
    assert 1 <= len(finished) < 24
    for name in finished:  # whatever carries a final name is complete
        assert (killed / name).read_bytes() == (reference / name).read_bytes()
    with pytest.raises(FileNotFoundError, match="rerun the same command"):
        records.read_manifest(str(killed))

    assert tool.main([*argv, "--output", str(killed)]) == 0
    assert not list(killed.glob("*.incomplete"))
    assert _tree(killed) == _tree(reference)
    manifest_text = (killed / "manifest.json").read_text()
    manifest = json.loads(manifest_text)
    assert manifest["rejects"] == {"all_boxes_rejected": 1, "inverted_box": 1, "missing_image": 1}
    assert manifest["splits"]["train"]["records"] == 300 * 4
    # Nothing that depends on the run: no output folder, worker count or timing.
    assert "interrupted" not in manifest_text  # the names of both output folders
    assert not {key for key in _keys(manifest) if re.search("worker|time|elapsed|date", key)}


def test_resume_refuses_other_settings_unless_overwrite(rectangles, tmp_path, capsys):
    output = tmp_path / "out"
    assert _run(_rectangles_argv(rectangles, output, "--copies", "1", "--workers", "1")) == 0
    capsys.readouterr()
    assert _run(_rectangles_argv(rectangles, output, "--copies", "2", "--workers", "1")) == 2
    error = capsys.readouterr().err
    assert "different copies" in error and "--overwrite" in error
    assert records.read_manifest(str(output))["copies"] == 1  # left as it was
    (output / "notes.txt").write_text("not part of the record set")
    argv = _rectangles_argv(rectangles, output, "--copies", "2", "--workers", "1", "--overwrite")
    assert _run(argv) == 0
    manifest, decoded = _read_set(output)
    assert manifest["copies"] == 2 and len(decoded["train"]) == 12 * 3
    assert len(list(output.glob("*.tfrecord"))) == len(manifest["splits"]["train"]["shards"])
    assert (output / "notes.txt").exists()  # --overwrite deletes record set files only


def test_verify_finds_changed_and_missing_shards(rectangles, tmp_path, capsys):
    output = tmp_path / "out"
    assert _run(_rectangles_argv(rectangles, output, "--copies", "1", "--num-shards", "3")) == 0
    capsys.readouterr()
    assert tool.main(["--verify", str(output)]) == 0
    assert "3 shards, 24 records, 24 boxes: OK" in capsys.readouterr().out

    shard = output / "train-00001-of-00003.tfrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert tool.main(["--verify", str(output)]) == 1
    captured = capsys.readouterr()
    assert str(shard) in captured.err and "problems" in captured.out

    (output / "train-00002-of-00003.tfrecord").unlink()
    assert tool.main(["--verify", str(output)]) == 1
    assert "train-00002-of-00003.tfrecord: listed in the manifest but missing" in (
        capsys.readouterr().err
    )
    assert tool.main(["--verify", str(tmp_path / "nothing")]) == 2


def test_resume_after_editing_the_annotations_renders_the_changed_shards(tmp_path):
    annotations, _ = _rectangles_dataset(tmp_path / "images", 7, np.random.default_rng(5))
    lines = Path(annotations).read_text().splitlines()
    argv = ["--annotations", annotations, "--classes", _write_classes(tmp_path)]
    argv += ["--input-size", str(SIZE), "--copies", "1", "--workers", "1", *NO_VAL]
    edited = tmp_path / "edited"

    def rerun_matches_a_fresh_run(kept_lines, name):
        Path(annotations).write_text("\n".join(kept_lines) + "\n")
        assert _run([*argv, "--output", str(edited)]) == 0
        assert _run([*argv, "--output", str(tmp_path / name)]) == 0
        assert _tree(edited) == _tree(tmp_path / name)

    Path(annotations).write_text("\n".join(lines[:6]) + "\n")
    assert _run([*argv, "--output", str(edited)]) == 0
    # Same settings, one box moved: the same 6 shard names, one of them stale.
    name, box = lines[2].split()
    x0, y0, x1, y1, class_id = (int(v) for v in box.split(","))
    lines[2] = f"{name} {_box_text((x0 + 2, y0, x1, y1), class_id)}"
    rerun_matches_a_fresh_run(lines[:6], "fresh6")
    # A seventh image: 7 shards, and the 6 of the earlier plan are gone.
    rerun_matches_a_fresh_run(lines, "fresh7")
    assert len(list(edited.glob("train-*-of-00007.tfrecord"))) == 7


# --- validation split and class filter --------------------------------------------------------


def test_validation_split_is_clean_and_counted(tmp_path):
    folder = tmp_path / "images"
    annotations, _ = _rectangles_dataset(folder, 20, np.random.default_rng(2), num_classes=2)
    # One image of a third class: too rare for --min-images-per-class 2, so it is dropped.
    Image.fromarray(_rectangle(50, 60, (5, 5, 30, 30), COLOURS[2])).save(folder / "rare.png")
    with open(annotations, "a") as f:
        f.write("rare.png 5,5,30,30,2\n")
    output = tmp_path / "out"
    argv = ["--annotations", annotations, "--classes", _write_classes(tmp_path)]
    argv += ["--output", str(output), "--input-size", str(SIZE), "--copies", "2"]
    argv += ["--val-per-class", "3", "--min-images-per-class", "2", "--workers", "1"]
    assert _run(argv) == 0
    manifest, decoded = _read_set(output)
    assert manifest["classes"] == ["red", "green"]
    assert manifest["validation"]["per_class"] == 3
    assert manifest["validation"]["source"] == "held_out"
    assert manifest["min_images_per_class"] == 2
    dropped = manifest["hygiene"]["min_images_per_class"]["dropped"]
    assert dropped == [{"class_id": 2, "name": "blue", "images": 1}]
    # 21 images: 6 to validation (3 per class, one class per image), 15 (with rare.png, now
    # a background image) to training.
    assert manifest["source_images"] == {"train": 15, "val": 6}
    val, train = decoded["val"], decoded["train"]
    assert len(val) == manifest["splits"]["val"]["records"] == 6
    assert all(record["copy"] == 0 for record in val)
    assert np.bincount(np.concatenate([r["classes"] for r in val]), minlength=2).tolist() == [3, 3]
    assert len(train) == manifest["splits"]["train"]["records"] == 15 * 3
    assert sorted(r["copy"] for r in train) == sorted(list(range(3)) * 15)
    assert not {r["source"] for r in val} & {r["source"] for r in train}
    assert manifest["splits"]["val"]["images"] == 6 and manifest["splits"]["train"]["images"] == 15
    # The validation images are stored lossless (PNG in this JPEG set): each is exactly its
    # image letterboxed, so the mAP measured on them is the mAP on the images themselves.
    assert manifest["splits"]["val"]["image_format"] == "png"
    assert {r["format"] for r in val} == {"png"} and {r["format"] for r in train} == {"jpeg"}
    for record in val:
        pixels, _, _ = letterbox(np.asarray(Image.open(record["source"])), [], (SIZE, SIZE))
        np.testing.assert_array_equal(record["image"], pixels)


def test_a_validation_split_is_always_held_out_or_refused_aloud(tmp_path, capsys):
    """Annotations without a validation split: a seeded tenth held out, said in the summary
    and the manifest; --val-fraction 0 trains without one, said too; one image cannot be
    split, and the line says so."""
    annotations, _ = _rectangles_dataset(tmp_path / "images", 10, np.random.default_rng(4))
    base = ["--annotations", annotations, "--classes", _write_classes(tmp_path)]
    base += ["--input-size", "32", "--copies", "0", "--workers", "1"]
    assert _run([*base, "--output", str(tmp_path / "held")]) == 0
    manifest = records.read_manifest(str(tmp_path / "held"))
    assert manifest["source_images"] == {"train": 9, "val": 1}
    assert manifest["validation"]["source"] == "held_out"
    assert manifest["validation"]["fraction"] == 0.1
    out = capsys.readouterr().out
    assert "validation: held out of the training images: 10% of the images, seed 0;" in out
    assert _run([*base, "--output", str(tmp_path / "none"), "--val-fraction", "0"]) == 0
    manifest = records.read_manifest(str(tmp_path / "none"))
    assert list(manifest["splits"]) == ["train"] and manifest["validation"]["source"] == "none"
    assert "validation: none (--val-fraction 0)" in capsys.readouterr().out
    single = _write_lines(tmp_path / "images", [Path(annotations).read_text().splitlines()[0]])
    argv = ["--annotations", single, *base[2:], "--output", str(tmp_path / "one")]
    assert _run(argv) == 0
    assert "validation: none: 1 distinct training image cannot be split" in capsys.readouterr().out
    assert _run([*argv, "--val-fraction", "1.5"]) == 2
    assert "--val-fraction 1.5: give a share in [0, 1)" in capsys.readouterr().err


# --- other filesystems ------------------------------------------------------------------------


def test_ram_filesystem_paths_work_like_local_ones(rectangles, tmp_path):
    """TensorFlow's ram:// filesystem stands in for gs://: the same code path, tf.io.gfile."""
    annotations, classes, truth = rectangles
    local, remote = tmp_path / "local", f"ram://{tmp_path.name}/out"
    argv = ["--copies", "1", "--num-shards", "2", "--workers", "1", *NO_VAL]
    assert _run(_rectangles_argv(rectangles, local, *argv)) == 0
    assert _run(_rectangles_argv(rectangles, remote, *argv)) == 0
    for name, data in _tree(local).items():
        with tf.io.gfile.GFile(f"{remote}/{name}", "rb") as f:
            assert f.read() == data, name
    assert tool.main(["--verify", remote]) == 0
    assert _run(_rectangles_argv(rectangles, remote, *argv)) == 0  # finished: nothing to redo

    # Images and annotations on the remote filesystem too; relative paths resolve there.
    folder = f"ram://{tmp_path.name}/images"
    tf.io.gfile.makedirs(folder)
    for path in [*truth, annotations]:
        tf.io.gfile.copy(path, f"{folder}/{Path(path).name}")
    output = f"ram://{tmp_path.name}/from-ram"
    argv = ["--annotations", f"{folder}/train.txt", "--classes", classes, "--output", output]
    assert _run([*argv, "--input-size", str(SIZE), "--copies", "0", "--workers", "1", *NO_VAL]) == 0
    manifest = records.read_manifest(output)
    assert manifest["splits"]["train"]["images"] == len(truth)
    paths = records.shard_paths(output, manifest, "train")
    record = records.parse_example_numpy(next(iter(tf.data.TFRecordDataset(paths[0]))).numpy())
    assert record["source"].startswith(f"{folder}/img")


def test_difficult_flags_reach_records_training_and_scoring(tmp_path):
    """VOC's difficult objects: kept in the records, left out of training, ignored by mAP."""

    from yolo3.data import pipeline as data
    from yolo3.evaluation import metrics as evaluate

    folder = tmp_path / "data"
    folder.mkdir()
    lines = []
    for index in range(4):
        # A red box, and a green one that is difficult in even images.
        red, green = (4, 4, 24, 24), (34, 30, 60, 58)
        image = _rectangle(64, 64, red, COLOURS[0])
        image[green[1] : green[3], green[0] : green[2]] = COLOURS[1]
        Image.fromarray(image).save(folder / f"img{index}.png")
        flag = ",1" if index % 2 == 0 else ""
        lines.append(f"img{index}.png {_box_text(red, 0)} {_box_text(green, 1)}{flag}")
    train = _write_lines(folder, lines)
    val = _write_lines(folder, lines, "val.txt")
    out = tmp_path / "records"
    argv = ["--annotations", train, "--val-annotations", val, "--classes", _write_classes(folder),
            "--output", str(out), "--input-size", "64", "--copies", "1", *KEEP_COLOURS]  # fmt: skip
    assert _run(argv) == 0
    _, decoded = _read_set(out)
    for record in decoded["train"] + decoded["val"]:
        difficult = record["difficult"]
        assert len(difficult) == len(record["classes"])
        assert not difficult[record["classes"] == 0].any()  # flags stay with their boxes
    sources = {r["source"]: r["difficult"].tolist() for r in decoded["val"]}
    assert sorted(sources.values()) == [[False, False]] * 2 + [[False, True]] * 2

    # Training reads no difficult box: green boxes only from the odd images.
    dataset = data.make_dataset(str(out), "val", batch_size=4, training=False, targets=False)
    _, boxes = next(iter(dataset))
    real = boxes.numpy()[..., 2] > 0
    assert sorted(np.sum(real, axis=1).tolist()) == [1, 1, 2, 2]

    # Scoring: detecting every object, or every object but the difficult ones, both score
    # 1.0. Were the flags lost, missing the difficult ones would cost recall.
    truths = [truth for _, truth in records.iterate_records(str(out), "val")]

    def detections(skip_difficult):
        found = []
        for truth in truths:
            keep = ~truth["difficult"] if skip_difficult else np.ones(len(truth["boxes"]), bool)
            found.append({"boxes": truth["boxes"][keep], "classes": truth["classes"][keep],
                          "scores": np.full(int(keep.sum()), 0.9, np.float32)})  # fmt: skip
        return found

    every = evaluate.evaluate_voc(truths, detections(False), num_classes=3)
    ordinary_only = evaluate.evaluate_voc(truths, detections(True), num_classes=3)
    assert every.num_positives.tolist() == [4, 2, 0]
    np.testing.assert_array_equal(every.ap[:2], [1.0, 1.0])
    np.testing.assert_array_equal(ordinary_only.ap[:2], [1.0, 1.0])
