"""Mosaic augmentation (YOLOv4, Ultralytics): four images in one training image.

One mosaic (``W, H`` the input size, ``U`` uniform):

    xc, yc = integers drawn uniformly in [W / 4, 3 W / 4] and [H / 4, 3 H / 4]
    quarters meeting at (xc, yc): top-left [0, xc) x [0, yc), top-right [xc, W) x [0, yc),
    bottom-left [0, xc) x [yc, H), bottom-right [xc, W) x [yc, H); the image itself goes
    top-left, its three partners to the others in the order they were drawn.

Each quarter is :func:`yolo3.data.augment.render_sample` with the quarter as its canvas:
the image is resized with ``random_augment``'s aspect and scale jitter *relative to the
whole input* (so objects keep the size they have in plain augmented copies), then placed at
``dx = int(U * (qw - nw))``, ``dy = int(U * (qh - nh))``: a window of the quarter's size cut
at a random position when the resized image is larger than the quarter on a side, the whole
image at a random offset inside the quarter, gray around it, when smaller. Flip and HSV
jitter are drawn per quarter as ``random_augment`` draws them; a quarter's gray takes its
jitter, as ``random_augment``'s padding does.

Boxes follow the pixels exactly (scale, offset, flip) and are clipped to their quarter; a box
is kept by :func:`kept_after_cut`. Rows are never deleted: the caller counts the dropped ones
and selects class ids with the same mask.

Every random number comes from the caller's generator, in a fixed order: the centre (two
integers), then :data:`yolo3.data.augment.NUM_DRAWS` uniforms per quarter, in quarter order.
Which copies are mosaics and with which partners is drawn by :func:`choose_partners`, from a
generator of its own.

This module imports only NumPy and Pillow, as :mod:`yolo3.data.augment` does, so
preprocessing worker processes start quickly.
"""

from dataclasses import dataclass

import numpy as np

from yolo3.data.augment import NUM_DRAWS, AugmentConfig, render_sample

NUM_TILES = 4
# A box cut by a quarter's edge keeps its label only while this much of its area is left:
# below a fifth the object is mostly gone (a hand labelled "person") and the label teaches
# the wrong thing. Ultralytics keeps a tenth; YOLOv4's reference keeps any sliver.
MIN_VISIBLE_FRACTION = 0.2
# And only while both sides are this many pixels: a thinner box is the interpolation blur of
# an edge, with a width-height target far from every anchor.
MIN_SIDE = 2.0


@dataclass(frozen=True)
class MosaicSample:
    """One mosaic and its boxes.

    Attributes:
        pixels: ``(H, W, 3)`` uint8 RGB, the input size.
        boxes: ``(N, 4)`` float32, ``x_min, y_min, x_max, y_max`` in input pixels, each
            clipped to its quarter; the tiles' boxes in tile order, ``N`` their total.
        keep: ``(N,)`` bool, :func:`kept_after_cut` of each row.
        tile: ``(N,)`` int64, the tile (0 top-left, 1 top-right, 2 bottom-left,
            3 bottom-right) each row came from.
        centre: ``(xc, yc)`` ints, the pixel where the quarters meet.
    """

    pixels: np.ndarray
    boxes: np.ndarray
    keep: np.ndarray
    tile: np.ndarray
    centre: tuple


def choose_partners(rng, ordinal, num_images, probability):
    """Whether one augmented copy is a mosaic, and of which images.

    Draws one uniform (a mosaic when it is below ``probability``), then, for a mosaic, the
    partners: ``rng.choice(num_images - 1, 3, replace=False)``, skipping ``ordinal``.

    Args:
        rng: a ``numpy.random.Generator`` of this copy's own, not the one its augmentation
            draws from, so that ``probability`` 0 leaves every other draw as it was.
        ordinal: the image's position in its split.
        num_images: the number of images in the split.
        probability: the chance of a mosaic, in [0, 1].

    Returns:
        None for a plain copy, else a tuple of 3 distinct ordinals in ``[0, num_images)``,
        none of them ``ordinal``, in the order of the top-right, bottom-left and bottom-right
        quarters.

    Raises:
        ValueError when a mosaic is drawn and the split has fewer than 4 images.
    """
    if not rng.random() < probability:
        return None
    if num_images < NUM_TILES:
        raise ValueError(f"a mosaic takes {NUM_TILES} images; the split has {num_images}")
    others = rng.choice(num_images - 1, size=NUM_TILES - 1, replace=False)
    return tuple(int(other) + int(other >= ordinal) for other in others)


def kept_after_cut(boxes, clipped):
    """Which boxes a quarter's edges leave enough of.

    Args:
        boxes: ``(N, 4)`` float, boxes before clipping, ``x_min, y_min, x_max, y_max``.
        clipped: ``(N, 4)`` float, the same boxes clipped to their quarter.

    Returns:
        ``(N,)`` bool: at least :data:`MIN_VISIBLE_FRACTION` of the box's area is left and
        the clipped box is at least :data:`MIN_SIDE` px wide and high.
    """
    boxes, clipped = np.asarray(boxes, np.float64), np.asarray(clipped, np.float64)
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    width, height = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    visible = width * height >= MIN_VISIBLE_FRACTION * area
    return visible & (width >= MIN_SIDE) & (height >= MIN_SIDE)


def random_mosaic(tiles, input_hw, rng, config=None):
    """Four images in one: random centre, one jittered window of each image per quarter.

    Args:
        tiles: 4 ``(image, boxes)`` pairs for the top-left, top-right, bottom-left and
            bottom-right quarters: ``(H_i, W_i, 3)`` uint8 RGB arrays (or PIL images) and
            ``(M_i, 4)`` float ``x_min, y_min, x_max, y_max`` in that image's pixels.
        input_hw: ``(input_h, input_w)`` of the network input in pixels.
        rng: a ``numpy.random.Generator``; 2 integers and ``4 * NUM_DRAWS`` uniforms are
            drawn.
        config: the ranges of each quarter's augmentation, an
            :class:`~yolo3.data.augment.AugmentConfig`; None: its defaults.

    Returns:
        A :class:`MosaicSample`.
    """
    if len(tiles) != NUM_TILES:
        raise ValueError(f"a mosaic takes {NUM_TILES} (image, boxes) tiles, got {len(tiles)}")
    config = AugmentConfig() if config is None else config
    input_h, input_w = (int(v) for v in input_hw)
    centre_x = int(rng.integers((input_w + 3) // 4, 3 * input_w // 4, endpoint=True))
    centre_y = int(rng.integers((input_h + 3) // 4, 3 * input_h // 4, endpoint=True))
    quarters = (
        (0, 0, centre_x, centre_y),
        (centre_x, 0, input_w, centre_y),
        (0, centre_y, centre_x, input_h),
        (centre_x, centre_y, input_w, input_h),
    )
    pixels = np.empty((input_h, input_w, 3), np.uint8)
    all_boxes, all_keep, all_tiles = [], [], []
    for index, ((image, boxes), (x0, y0, x1, y1)) in enumerate(zip(tiles, quarters)):
        quarter_hw = (y1 - y0, x1 - x0)
        draws = rng.random(NUM_DRAWS)
        tile, tile_boxes = render_sample(
            image, boxes, draws, (input_h, input_w), quarter_hw, config
        )
        pixels[y0:y1, x0:x1] = tile
        clipped = np.clip(tile_boxes, 0.0, (x1 - x0, y1 - y0, x1 - x0, y1 - y0))
        all_keep.append(kept_after_cut(tile_boxes, clipped))
        all_boxes.append(clipped + (x0, y0, x0, y0))
        all_tiles.append(np.full(len(clipped), index, np.int64))
    return MosaicSample(
        pixels=pixels,
        boxes=np.concatenate(all_boxes).astype(np.float32),
        keep=np.concatenate(all_keep),
        tile=np.concatenate(all_tiles),
        centre=(centre_x, centre_y),
    )
