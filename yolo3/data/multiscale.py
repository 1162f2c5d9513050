"""Multi-scale training, as Darknet's ``random=1``: the input size changes every few steps.

Darknet (pjreddie's ``detector.c``) picks a new square size ``(rand() % 10 + 10) * 32`` every
10 batches, 320 to 608 px for a 416 px network (0.77x to 1.46x), and trains the last 200
batches at the largest (here at most the last tenth of a run, so that a short run is not all
at the largest size). Here:

- the sizes are multiples of 32, Darknet's ten by default scaled to the record set's size
  (:func:`darknet_sizes`), or a ``MIN:MAX`` range;
- the size of a step follows from the step number and the seed alone
  (:class:`ScaleSchedule`), never from a local random draw, so every replica and every worker
  trains the same step at the same size, and a resumed run continues the same schedule;
- records stay at their stored size and each batch is resized in the train step
  (:func:`resize_batch`), with its boxes scaled to match;
- each size has a train function of its own with static shapes, traced (and compiled under
  XLA) once, so a run compiles at most as many steps as there are sizes.
"""

import numpy as np
import tensorflow as tf

DARKNET_PERIOD = 10  # steps between size changes
DARKNET_FINAL_STEPS = 200  # the last steps train at the largest size (at most a tenth)
# Darknet's sizes for its 416 px network are 10..19 times 32.
_DARKNET_BASE, _DARKNET_MULTIPLES = 13, range(10, 20)


def darknet_sizes(record_size):
    """Darknet's ten multi-scale sizes for a ``record_size`` network, multiples of 32.

    At 416 these are Darknet's own, 320 to 608; at other sizes the same factors
    (10/13 to 19/13), rounded to multiples of 32 (repeats removed).
    """
    record_size = int(record_size)
    sizes = {max(32, round(record_size * k / _DARKNET_BASE / 32) * 32) for k in _DARKNET_MULTIPLES}
    return tuple(sorted(sizes))


def parse_sizes(text, record_hw):
    """The sizes of ``--multi-scale``: ``auto`` (Darknet's, :func:`darknet_sizes`) or
    ``MIN:MAX`` in pixels, every multiple of 32 in between. Needs square records."""
    height, width = (int(v) for v in record_hw)
    if height != width:
        raise ValueError(
            f"--multi-scale trains square inputs, as Darknet does; the record set is "
            f"{height}x{width}: preprocess with a square --input-size"
        )
    if text == "auto":
        return darknet_sizes(height)
    low, sep, high = str(text).partition(":")
    try:
        low, high = int(low), int(high)
    except ValueError:
        raise ValueError(
            f"--multi-scale {text!r}: expected auto or MIN:MAX in pixels, e.g. 320:608"
        ) from None
    if not sep or low % 32 or high % 32 or not 32 <= low <= high:
        raise ValueError(
            f"--multi-scale {text!r}: MIN and MAX must be multiples of 32 with MIN <= MAX"
        )
    return tuple(range(low, high + 1, 32))


class ScaleSchedule:
    """The input size of every step: a function of the step number and the seed.

    Args:
        sizes: the square sizes to draw from.
        seed: the run's seed.
        total_steps: steps of the whole run; the last ``final_steps`` (at most a tenth of
            them) use the largest size.
        period: steps between changes.
    """

    def __init__(self, sizes, *, seed, total_steps, period=DARKNET_PERIOD,
                 final_steps=DARKNET_FINAL_STEPS):  # fmt: skip
        self.sizes = tuple(sorted(int(s) for s in sizes))
        if not self.sizes or any(s % 32 or s < 32 for s in self.sizes):
            raise ValueError(f"multi-scale sizes {self.sizes} must be positive multiples of 32")
        self.seed = int(seed)
        self.period = int(period)
        self._final_cap = int(final_steps)
        self.set_total_steps(total_steps)

    def set_total_steps(self, total_steps):
        """The run's length in steps, changed (``--time`` fits it to a time budget)."""
        self.total_steps = int(total_steps)
        self.final_steps = min(self._final_cap, self.total_steps // 10)

    def size_at(self, step):
        step = int(step)
        if step >= self.total_steps - self.final_steps:
            return self.sizes[-1]
        draw = np.random.default_rng([self.seed, step // self.period]).integers(len(self.sizes))
        return self.sizes[int(draw)]


def resize_batch(images, boxes, size):
    """A batch resized to ``size`` x ``size``: images float in [0, 1], boxes scaled along.

    Args:
        images: ``(N, S, S, 3)`` uint8 (or float in [0, 1]) at the stored size ``S``.
        boxes: ``(N, max_boxes, 5)`` padded boxes in stored-image pixels and class ids.
        size: the target size, a Python int.

    Returns:
        ``(images, boxes)``: ``(N, size, size, 3)`` float32 and the boxes in its pixels
        (padding rows stay zero).
    """
    stored = int(images.shape[1])
    if images.dtype == tf.uint8:
        images = tf.cast(images, tf.float32) / 255.0
    if size != stored:
        # Bilinear, which XLA compiles; the letterbox is square, so resizing the stored
        # letterboxed image is letterboxing at the new size.
        images = tf.image.resize(images, (size, size), method="bilinear")
    scale = tf.constant([size / stored] * 4 + [1.0], boxes.dtype)
    return images, boxes * scale
