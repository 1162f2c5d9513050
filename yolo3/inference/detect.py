"""Detection on images of any size: letterbox, run the model, decode, NMS, draw.

Example::

    detector = Detector("model_data/yolo.weights.h5", "model_data/yolo_anchors.txt",
                        "model_data/coco_classes.txt")
    image = load_rgb("dog.jpg")
    [result] = detector.detect([image])
    result["boxes"]  # (k, 4) float32, x_min, y_min, x_max, y_max in the image's pixels
    draw_detections(image, result, detector.class_names).save("dog-boxes.jpg")
"""

import numpy as np
import tensorflow as tf
from PIL import Image, ImageDraw, ImageFont

from yolo3 import drawing
from yolo3.checkpoint import weights as weights_io
from yolo3.data.image import letterbox_darknet, letterbox_image, to_rgb
from yolo3.drawing import class_colors
from yolo3.inference.detector_spec import (
    BOX_MERGE,
    MAX_DETECTIONS,
    NMS_IOU_THRESHOLD,
    SCORE_THRESHOLD,
    DetectorSpec,
    spec_for_weights,
)
from yolo3.inference.postprocess import postprocess
from yolo3.model.network import build_head_model, head_layer_names
from yolo3.model.resources import DARKNET_INPUT_SIZE


class Detector:
    """A YOLOv3 / tiny-YOLOv3 model plus everything needed to turn images into detections.

    Args:
        weights_path: ``.weights.h5`` file written by :func:`yolo3.checkpoint.weights.save_weights`
            (or any file :func:`yolo3.checkpoint.weights.load_weights` reads).
        anchors_path: anchors file, 9 pairs (YOLOv3) or 6 (tiny), in input pixels; default:
            what the weights file records (yolo3 train's checkpoints record theirs).
        classes_path: one class name per line, in the order the weights were trained with;
            default: what the weights file records.
        input_size: network input, an int (square) or ``(height, width)``, multiples of 32;
            default: what the file records, else Darknet's 416.
        score_threshold, iou_threshold, max_detections, box_merge: see
            :func:`yolo3.inference.postprocess.postprocess`; ``box_merge`` by default on,
            off for weights converted from Darknet.
        resampling: how images are letterboxed, ``"bicubic"`` (PIL, as this library's
            preprocessing and the original keras-yolo3) or ``"darknet"`` (Darknet's own
            resize, :func:`yolo3.data.image.letterbox_darknet`); default: ``"darknet"`` for
            weights converted from Darknet, else ``"bicubic"``.
        head_overrides: fields of :class:`yolo3.model.head.HeadSpec` that win over what the
            file records, keyed by field name: the model type, the anchor masks, the grid
            sensitivity (see :func:`yolo3.inference.detector_spec.spec_for_weights`).

    Attributes:
        model: the Keras model; ``spec`` its :class:`yolo3.inference.detector_spec.DetectorSpec`
            and ``head`` (``spec.head``) the :class:`yolo3.model.head.HeadSpec` it decodes with.

    Raises:
        ValueError naming both class counts when the weights were trained for a different
        number of classes than ``classes_path`` lists.
    """

    def __init__(
        self,
        weights_path,
        anchors_path=None,
        classes_path=None,
        *,
        input_size=None,
        score_threshold=SCORE_THRESHOLD,
        iou_threshold=NMS_IOU_THRESHOLD,
        max_detections=MAX_DETECTIONS,
        box_merge=None,
        resampling=None,
        head_overrides=None,
    ):
        weights_path = str(weights_path)
        # One home for "an argument, else the file's metadata, else Darknet's default".
        spec = spec_for_weights(
            weights_path,
            classes_path=classes_path,
            anchors_path=anchors_path,
            input_size=input_size,
            head_overrides=head_overrides,
            resampling=resampling,
            score_threshold=score_threshold,
            iou_threshold=iou_threshold,
            max_detections=max_detections,
            box_merge=box_merge,
            fallbacks={"input_size": DARKNET_INPUT_SIZE},
        )
        head = spec.head
        model = build_head_model(head)
        try:
            weights_io.load_weights(model, weights_path)
        except ValueError as err:
            found = _classes_in_file(weights_path, head.model_type, head.anchors_per_level)
            if found is None or found == head.num_classes:
                raise
            raise ValueError(
                f"weights {weights_path} have heads for {found} classes, but classes file "
                f"{classes_path} lists {head.num_classes} classes; use the classes file the "
                f"weights were trained with"
            ) from err
        self._setup(model, spec)

    @classmethod
    def from_model(
        cls,
        model,
        head,
        *,
        input_size=None,
        score_threshold=SCORE_THRESHOLD,
        iou_threshold=NMS_IOU_THRESHOLD,
        max_detections=MAX_DETECTIONS,
        box_merge=BOX_MERGE,
        resampling="bicubic",
    ):
        """A detector around an already built (and loaded) Keras model.

        ``head`` is the :class:`yolo3.model.head.HeadSpec` the model was built for.
        ``input_size`` (an int or ``(height, width)``) defaults to the model's static input
        size, else the head's ``input_hw``; a model that accepts any size with a head that
        records none needs it given (no size is assumed: one the weights were not trained at
        detects poorly without a word).
        """
        if input_size is None:
            height, width = model.input_shape[1:3]
            input_size = (height, width) if height and width else head.input_hw
        if input_size is None:
            raise ValueError(
                f"model {model.name} accepts any input size: give input_size, a multiple "
                "of 32 (the size its weights were trained at)"
            )
        spec = DetectorSpec(
            head.replace(input_hw=input_size),
            resampling=resampling,
            score_threshold=score_threshold,
            iou_threshold=iou_threshold,
            max_detections=max_detections,
            box_merge=box_merge,
        )
        detector = cls.__new__(cls)
        detector._setup(model, spec)
        return detector

    def _setup(self, model, spec):
        _check_model(model, spec.head)
        self.model = model
        self.spec = spec
        # A fixed signature with an open batch axis: one trace serves every batch size. The
        # thresholds are baked in at that trace, so they are fixed for the detector's life.
        # No autograph: TensorFlow ops only, as the train step (yolo3/engine/step.py).
        self._predict = tf.function(
            self._predict_batch,
            autograph=False,
            input_signature=[
                tf.TensorSpec((None, *self.input_hw, 3), tf.float32),
                tf.TensorSpec((None, 2), tf.int32),
            ],
        )

    @property
    def head(self):
        """The :class:`yolo3.model.head.HeadSpec` the detector decodes with."""
        return self.spec.head

    @property
    def class_names(self):
        """The class names, a list indexed by class id."""
        return list(self.spec.head.class_names)

    @property
    def input_hw(self):
        """The network input ``(height, width)`` in pixels."""
        return self.spec.head.input_hw

    @property
    def resampling(self):
        return self.spec.resampling

    def letterbox(self, image):
        """The network input for one image: ``(H, W, 3)`` float32 in [0, 1]."""
        if self.resampling == "darknet":
            return letterbox_darknet(image, self.input_hw)
        return letterbox_image(image, self.input_hw).astype(np.float32) / np.float32(255)

    def _predict_batch(self, inputs, image_hw):
        outputs = self.model(inputs, training=False)
        return postprocess(
            list(outputs), self.head, image_hw, self.input_hw, **self.spec.thresholds
        )

    def detect(self, images):
        """Detects objects in a batch of images, which may differ in size.

        Args:
            images: a list of PIL images (any mode) or ``(H, W, 3)`` uint8 RGB arrays, an
                ``(N, H, W, 3)`` uint8 array, or a single image (a list of one).

        Returns:
            One dict per image: ``boxes`` ``(k, 4)`` float32 ``x_min, y_min, x_max, y_max``
            in that image's pixels, ``scores`` ``(k,)`` float32, ``classes`` ``(k,)`` int32
            and ``labels`` (k class names), highest score first.
        """
        if isinstance(images, (Image.Image, np.ndarray)) and np.ndim(images) < 4:
            images = [images]
        if len(images) == 0:
            return []
        inputs, sizes = letterbox_batch(images, self.letterbox)
        found = self._predict(tf.constant(inputs), tf.constant(sizes, dtype=tf.int32))
        return split_detections(*(tensor.numpy() for tensor in found), self.class_names)


def letterbox_batch(images, letterbox):
    """Letterboxes images that may differ in size into one network input.

    Args:
        images: PIL images (any mode) or ``(H, W, 3)`` uint8 RGB arrays, or an
            ``(N, H, W, 3)`` uint8 array.
        letterbox: ``letterbox(image) -> (H_in, W_in, 3)`` array for one RGB image.

    Returns:
        The stacked inputs ``(N, H_in, W_in, 3)`` and each image's original ``(height,
        width)``, ``(N, 2)`` int32.
    """
    batch, sizes = [], []
    for image in images:
        if isinstance(image, Image.Image):
            image = to_rgb(image)
            sizes.append((image.height, image.width))
        else:
            sizes.append(np.shape(image)[:2])
        batch.append(letterbox(image))
    return np.stack(batch), np.asarray(sizes, dtype=np.int32)


def split_detections(boxes, scores, classes, counts, class_names):
    """Padded batch results (see :func:`yolo3.inference.postprocess.batched_nms`) -> one dict per
    image with ``boxes`` ``(k, 4)``, ``scores`` ``(k,)``, ``classes`` ``(k,)`` int32 and
    ``labels`` (k class names), highest score first."""
    results = []
    for index, count in enumerate(np.asarray(counts)):
        image_classes = np.asarray(classes[index, :count], dtype=np.int32)
        results.append(
            {
                "boxes": boxes[index, :count],
                "scores": scores[index, :count],
                "classes": image_classes,
                "labels": [class_names[c] for c in image_classes],
            }
        )
    return results


def _check_model(model, head):
    """ValueError naming both counts when ``model``'s outputs do not fit ``head``."""
    shapes = [output.shape for output in getattr(model, "outputs", None) or ()]
    if not shapes:
        return  # a subclassed model declares no outputs; decoding checks what it returns
    what = f"model {model.name}"
    channels = shapes[0][-1]
    if len(shapes) == head.num_levels and channels not in (None, head.channels):
        raise ValueError(
            f"{what} has heads for {channels // head.anchors_per_level - 5} classes "
            f"({channels} channels) but {head.num_classes} class names were given"
        )
    head.check_outputs(shapes, what)


def _classes_in_file(path, model_type, num_anchors):
    """Classes the file's first head was built for, or None when that cannot be read."""
    try:
        arrays = weights_io.read_named_arrays(path)
        head_bias = arrays[head_layer_names(model_type)[0]][-1]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
    # Head channels = num_anchors * (5 + num_classes).
    channels = int(head_bias.shape[-1])
    return channels // num_anchors - 5 if channels % num_anchors == 0 else None


def draw_detections(image, detection, class_names, *, legend=False):
    """Draws boxes and ``"label score"`` captions on a copy of ``image``.

    A caption sits above its box; at the image top, inside the box's top edge, or below the
    box when it is too small to hold it. It always stays within the image.

    Args:
        image: PIL image or ``(H, W, 3)`` uint8 RGB array, the one detection ran on.
        detection: one dict from :meth:`Detector.detect` (``boxes`` in this image's pixels).
        class_names: names indexed by class id.
        legend: add a band below the image naming the colours of the classes drawn
            (:func:`yolo3.drawing.legend_band`). Off by default, so that the picture keeps
            the image's size (video frames, overlays).

    Returns:
        A new RGB PIL image of ``image``'s size, taller by the band with ``legend``.
    """
    image = to_rgb(image).copy() if isinstance(image, Image.Image) else Image.fromarray(image)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    colors = class_colors(len(class_names))
    thickness = max(1, round((image.width + image.height) / 600))
    bounds = (0, 0, image.width, image.height)
    for box, score, class_id in zip(
        detection["boxes"], detection["scores"], detection["classes"], strict=True
    ):
        x_min, y_min, x_max, y_max = (float(v) for v in box)
        color = colors[int(class_id) % len(colors)]
        draw.rectangle((x_min, y_min, x_max, y_max), outline=color, width=thickness)
        caption = f"{class_names[int(class_id)]} {float(score):.2f}"
        drawing.draw_caption(draw, caption, (x_min, y_min, x_max, y_max), color, font, bounds)
    if not legend:
        return image
    band = drawing.legend_band(image.width, class_names, detection["classes"])
    framed = Image.new("RGB", (image.width, image.height + band.height))
    framed.paste(image, (0, 0))
    framed.paste(band, (0, image.height))
    return framed
