"""Trains tiny-YOLOv3 from scratch on generated shapes, then detects on held-out images.

A self-contained tour of the library with no data to bring: synthetic images, in-graph
targets, the per-image loss, a training loop, and batched detection. Prints the loss as it
falls and, at the end, how many held-out objects were found.

    yolo3 quickstart [--steps 700] [--input-size 96]
"""

import argparse
import sys
import time

from yolo3.cli import ArgumentParser, run_main, start_tensorflow

start_tensorflow()  # before the library imports TensorFlow: its start-up log held back


def build_parser():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=700, help="training steps (default 700)")
    parser.add_argument("--input-size", type=int, default=96, help="a multiple of 32")
    # --size: the spelling of earlier releases, kept working for a release, out of --help.
    parser.add_argument("--size", type=int, dest="input_size", help=argparse.SUPPRESS)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--train-images", type=int, default=512)
    parser.add_argument("--val-images", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def _check_args(parser, args):
    if args.input_size % 32:
        parser.error(f"--input-size {args.input_size} is not a multiple of 32")


def tour(args):
    """Trains on generated shapes with a hand-written loop, then detects on held-out ones."""
    import tensorflow as tf

    from yolo3.data import autotune
    from yolo3.data.synthetic import CLASS_NAMES, make_dataset
    from yolo3.inference.detect import Detector
    from yolo3.model.head import HeadSpec
    from yolo3.model.loss import LOSS_TERMS, replica_loss, yolo_loss
    from yolo3.model.network import build_head_model
    from yolo3.model.resources import read_anchors, shipped_anchors
    from yolo3.model.targets import build_targets

    tf.keras.utils.set_random_seed(args.seed)
    size = args.input_size
    # Darknet's tiny anchors are for 416 px inputs; scale them to this input.
    anchors = read_anchors(shipped_anchors("tiny")) * (size / 416)
    head = HeadSpec(anchors=anchors, class_names=CLASS_NAMES, input_hw=size)

    print(f"generating {args.train_images} + {args.val_images} images of {size}x{size} px")
    train_images, train_boxes = make_dataset(args.train_images, args.seed, (size, size))
    val_images, val_boxes = make_dataset(args.val_images, args.seed + 1, (size, size))

    def to_batch(images, boxes):
        targets = build_targets(boxes, head=head)
        return tf.cast(images, tf.float32) / 255.0, boxes, targets

    dataset = (
        tf.data.Dataset.from_tensor_slices((train_images, train_boxes))
        .shuffle(len(train_images), seed=args.seed)
        .repeat()
        .batch(args.batch_size, drop_remainder=True)
        .map(to_batch, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(2)
        .with_options(autotune.untuned_options())  # ends at once when deleted
    )
    model = build_head_model(head)
    optimizer = tf.keras.optimizers.Adam(args.lr)

    @tf.function
    def train_step(images, boxes, targets):
        with tf.GradientTape() as tape:
            outputs = model(images, training=True)
            per_image, terms = yolo_loss(targets, outputs, head=head)
            loss = replica_loss(per_image, args.batch_size, model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return {name: tf.reduce_mean(value) for name, value in terms.items()}

    print(f"training tiny-YOLOv3 from scratch: {args.steps} steps of {args.batch_size} images")
    start = time.time()
    for step, batch in enumerate(dataset.take(args.steps), start=1):
        terms = train_step(*batch)
        if step % 25 == 0 or step == args.steps:
            values = "  ".join(f"{name} {float(terms[name]):7.3f}" for name in LOSS_TERMS)
            rate = step * args.batch_size / (time.time() - start)
            print(f"step {step:4d}/{args.steps}  {values}  ({rate:.0f} images/s)", flush=True)

    detector = Detector.from_model(model, head)
    start = time.time()
    detections = detector.detect(list(val_images))
    print(f"detected on {len(val_images)} held-out images in {time.time() - start:.1f} s")
    found = total = 0
    for detection, boxes in zip(detections, val_boxes):
        for truth in boxes[boxes[:, 2] > boxes[:, 0]]:
            total += 1
            found += any(
                cls == int(truth[4]) and _iou(box, truth[:4]) >= 0.5
                for box, cls in zip(detection["boxes"], detection["classes"])
            )
    print(f"held-out objects found (right class, IoU >= 0.5): {found}/{total}")
    return 0


def main(argv=None):
    return run_main(build_parser(), argv, tour, check=_check_args, errors=())


def _iou(a, b):
    width = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    height = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = width * height
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


if __name__ == "__main__":
    sys.exit(main())
