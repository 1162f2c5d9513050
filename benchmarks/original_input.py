"""The original keras-yolo3 input path, reimplemented as it was written, to be timed.

The Keras 2 code (``yolo3/utils.py`` and ``yolo3/model/network.py`` there) fed training from a
Python generator: per image, in one thread, open and decode with Pillow, then
``get_random_data`` (random aspect and scale, bicubic resize, placement on gray, flip, HSV
jitter in float64 through matplotlib's ``rgb_to_hsv`` / ``hsv_to_rgb``), and once per batch
``preprocess_true_boxes``, a Python loop over images, boxes and levels. It is kept line for
line where it matters for speed: float64 images and matplotlib's boolean-mask colour
conversions. :mod:`benchmarks.io_pipeline` times it against the record-set pipeline.
"""

import numpy as np
from PIL import Image

# The original's anchor masks for 9 anchors, stride 32 first.
ORIGINAL_ANCHOR_MASKS = ((6, 7, 8), (3, 4, 5), (0, 1, 2))


def rgb_to_hsv_float64(rgb):
    """``matplotlib.colors.rgb_to_hsv`` in float64: (..., 3) RGB in [0, 1] -> HSV in [0, 1]."""
    rgb = np.asarray(rgb, np.float64)
    out = np.zeros_like(rgb)
    arr_max = rgb.max(-1)
    delta = np.ptp(rgb, -1)
    saturation = np.zeros_like(delta)
    positive = arr_max > 0
    saturation[positive] = delta[positive] / arr_max[positive]
    positive = delta > 0
    # Later sectors overwrite earlier ones on ties, as matplotlib does; the hue is the same.
    index = (rgb[..., 0] == arr_max) & positive
    out[index, 0] = (rgb[index, 1] - rgb[index, 2]) / delta[index]
    index = (rgb[..., 1] == arr_max) & positive
    out[index, 0] = 2.0 + (rgb[index, 2] - rgb[index, 0]) / delta[index]
    index = (rgb[..., 2] == arr_max) & positive
    out[index, 0] = 4.0 + (rgb[index, 0] - rgb[index, 1]) / delta[index]
    out[..., 0] = (out[..., 0] / 6.0) % 1.0
    out[..., 1] = saturation
    out[..., 2] = arr_max
    return out


def hsv_to_rgb_float64(hsv):
    """``matplotlib.colors.hsv_to_rgb`` in float64: (..., 3) HSV in [0, 1] -> RGB in [0, 1]."""
    hsv = np.asarray(hsv, np.float64)
    hue, saturation, value = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    red, green, blue = np.empty_like(hue), np.empty_like(hue), np.empty_like(hue)
    sector = (hue * 6.0).astype(int)
    fraction = hue * 6.0 - sector
    p = value * (1.0 - saturation)
    q = value * (1.0 - saturation * fraction)
    t = value * (1.0 - saturation * (1.0 - fraction))
    table = ((value, t, p), (q, value, p), (p, value, t), (p, q, value), (t, p, value))
    table += ((value, p, q),)
    for number, channels in enumerate(table):
        index = sector % 6 == 0 if number == 0 else sector == number
        for plane, source in zip((red, green, blue), channels):
            plane[index] = source[index]
    gray = saturation == 0
    for plane in (red, green, blue):
        plane[gray] = value[gray]
    return np.stack([red, green, blue], axis=-1)


def get_random_data(annotation_line, input_hw, rng, max_boxes=20, jitter=0.3):
    """The original ``get_random_data(..., random=True)``, with its defaults.

    Args:
        annotation_line: ``"path x_min,y_min,x_max,y_max,class ..."``, integer coordinates.
        input_hw: ``(height, width)`` of the network input.
        rng: ``numpy.random.Generator`` standing in for the global ``np.random``.

    Returns:
        ``(image, boxes)``: (h, w, 3) float64 RGB in [0, 1], and (max_boxes, 5) float64
        x_min, y_min, x_max, y_max in input pixels and the class id, zero rows last.
    """

    def rand(low=0.0, high=1.0):
        return rng.random() * (high - low) + low

    line = annotation_line.split()
    image = Image.open(line[0])
    image_w, image_h = image.size
    h, w = input_hw
    box = np.array([np.array(list(map(int, text.split(",")))) for text in line[1:]])

    # The jittered aspect starts from the input's, not the image's: the original's quirk.
    new_aspect = w / h * rand(1 - jitter, 1 + jitter) / rand(1 - jitter, 1 + jitter)
    scale = rand(0.25, 2)
    if new_aspect < 1:
        new_h = int(scale * h)
        new_w = int(new_h * new_aspect)
    else:
        new_w = int(scale * w)
        new_h = int(new_w / new_aspect)
    image = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
    dx, dy = int(rand(0, w - new_w)), int(rand(0, h - new_h))
    canvas = Image.new("RGB", (w, h), (128, 128, 128))
    canvas.paste(image, (dx, dy))
    image = canvas
    flip = rand() < 0.5
    if flip:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)

    hue = rand(-0.1, 0.1)
    sat = rand(1, 1.5) if rand() < 0.5 else 1 / rand(1, 1.5)
    val = rand(1, 1.5) if rand() < 0.5 else 1 / rand(1, 1.5)
    x = rgb_to_hsv_float64(np.array(image) / 255.0)
    x[..., 0] += hue
    x[..., 0][x[..., 0] > 1] -= 1
    x[..., 0][x[..., 0] < 0] += 1
    x[..., 1] *= sat
    x[..., 2] *= val
    x[x > 1] = 1
    x[x < 0] = 0
    image_data = hsv_to_rgb_float64(x)

    box_data = np.zeros((max_boxes, 5))
    if len(box) > 0:
        rng.shuffle(box)
        # Integer array: the scaled coordinates are truncated, as in the original.
        box[:, [0, 2]] = box[:, [0, 2]] * new_w / image_w + dx
        box[:, [1, 3]] = box[:, [1, 3]] * new_h / image_h + dy
        if flip:
            box[:, [0, 2]] = w - box[:, [2, 0]]
        box[:, 0:2][box[:, 0:2] < 0] = 0
        box[:, 2][box[:, 2] > w] = w
        box[:, 3][box[:, 3] > h] = h
        box_w, box_h = box[:, 2] - box[:, 0], box[:, 3] - box[:, 1]
        box = box[np.logical_and(box_w > 1, box_h > 1)][:max_boxes]
        box_data[: len(box)] = box
    return image_data, box_data


def preprocess_true_boxes(true_boxes, input_hw, anchors, num_classes):
    """The original ``preprocess_true_boxes``: a Python loop over images, boxes and levels.

    Args:
        true_boxes: (N, max_boxes, 5) x_min, y_min, x_max, y_max in input pixels and the
            class id; rows of zero width are padding and come last.
        input_hw: ``(height, width)``, multiples of 32.
        anchors: (9, 2) anchor sizes in input pixels.

    Returns:
        Three float32 arrays (N, h / stride, w / stride, 3, 5 + num_classes), stride 32 first,
        laid out as :func:`yolo3.model.targets.build_targets` lays them out.
    """
    true_boxes = np.array(true_boxes, dtype="float32")
    input_shape = np.array(input_hw, dtype="int32")
    boxes_xy = (true_boxes[..., 0:2] + true_boxes[..., 2:4]) // 2
    boxes_wh = true_boxes[..., 2:4] - true_boxes[..., 0:2]
    true_boxes[..., 0:2] = boxes_xy / input_shape[::-1]
    true_boxes[..., 2:4] = boxes_wh / input_shape[::-1]

    batch = true_boxes.shape[0]
    grid_shapes = [input_shape // stride for stride in (32, 16, 8)]
    y_true = [
        np.zeros((batch, *grid, len(mask), 5 + num_classes), dtype="float32")
        for grid, mask in zip(grid_shapes, ORIGINAL_ANCHOR_MASKS)
    ]
    anchors = np.expand_dims(np.asarray(anchors, np.float64), 0)
    anchor_maxes = anchors / 2.0
    anchor_mins = -anchor_maxes
    valid_mask = boxes_wh[..., 0] > 0
    for b in range(batch):
        wh = boxes_wh[b, valid_mask[b]]
        if len(wh) == 0:
            continue
        wh = np.expand_dims(wh, -2)
        box_maxes = wh / 2.0
        box_mins = -box_maxes
        intersect_wh = np.maximum(
            np.minimum(box_maxes, anchor_maxes) - np.maximum(box_mins, anchor_mins), 0.0
        )
        intersect_area = intersect_wh[..., 0] * intersect_wh[..., 1]
        box_area = wh[..., 0] * wh[..., 1]
        anchor_area = anchors[..., 0] * anchors[..., 1]
        iou = intersect_area / (box_area + anchor_area - intersect_area)
        best_anchor = np.argmax(iou, axis=-1)
        for t, n in enumerate(best_anchor):
            for level, mask in enumerate(ORIGINAL_ANCHOR_MASKS):
                if n in mask:
                    i = np.floor(true_boxes[b, t, 0] * grid_shapes[level][1]).astype("int32")
                    j = np.floor(true_boxes[b, t, 1] * grid_shapes[level][0]).astype("int32")
                    k = mask.index(n)
                    c = true_boxes[b, t, 4].astype("int32")
                    y_true[level][b, j, i, k, 0:4] = true_boxes[b, t, 0:4]
                    y_true[level][b, j, i, k, 4] = 1
                    y_true[level][b, j, i, k, 5 + c] = 1
    return y_true


def data_generator(lines, *, batch_size, input_hw, anchors, num_classes, rng):
    """The original ``data_generator``: yields ``(images, y_true)`` batches forever.

    ``images`` is (batch_size, h, w, 3) float64 in [0, 1]; ``y_true`` as from
    :func:`preprocess_true_boxes`.
    """
    lines = list(lines)
    position = 0
    while True:
        image_data, box_data = [], []
        for _ in range(batch_size):
            if position == 0:
                rng.shuffle(lines)
            image, box = get_random_data(lines[position], input_hw, rng)
            image_data.append(image)
            box_data.append(box)
            position = (position + 1) % len(lines)
        image_data, box_data = np.array(image_data), np.array(box_data)
        yield image_data, preprocess_true_boxes(box_data, input_hw, anchors, num_classes)
