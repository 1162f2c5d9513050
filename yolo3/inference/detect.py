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

from yolo3.checkpoint import weights as weights_io
from yolo3.data.image import RESAMPLING, letterbox_darknet, letterbox_image, to_rgb
from yolo3.evaluation import plots
from yolo3.evaluation.plots import class_colors
from yolo3.inference.detector_spec import spec_for_weights
from yolo3.inference.postprocess import postprocess
from yolo3.model.network import build_model, head_layer_names
from yolo3.model.resources import (
    DARKNET_INPUT_SIZE,
    default_anchor_masks,
    scale_x_y_per_head,
)

NUM_HEADS = {"yolov3": 3, "tiny": 2}


class Detector:
    """A YOLOv3 / tiny-YOLOv3 model plus everything needed to turn images into detections.

    Args:
        weights_path: ``.weights.h5`` file written by :func:`yolo3.checkpoint.weights.save_weights`
            (or any file :func:`yolo3.checkpoint.weights.load_weights` reads).
        anchors_path: anchors file, 9 pairs (YOLOv3) or 6 (tiny), in input pixels; default:
            what the weights file records (yolo3 train's checkpoints record theirs).
        classes_path: one class name per line, in the order the weights were trained with;
            default: what the weights file records.
        model_type: ``"yolov3"`` or ``"tiny"``; default: what the file records, else from
            the anchor count.
        input_size: network input, an int (square) or ``(height, width)``, multiples of 32;
            default: what the file records, else Darknet's 416.
        score_threshold, iou_threshold, max_detections: see
            :func:`yolo3.inference.postprocess.postprocess`.
        anchor_masks: anchors per head, largest stride first; default: what the weights
            file records (:func:`yolo3.checkpoint.weights.stored_anchor_masks`), else the default
            for the anchor count.
        resampling: how images are letterboxed, ``"bicubic"`` (PIL, as this library's
            preprocessing and the original keras-yolo3) or ``"darknet"`` (Darknet's own
            resize, :func:`yolo3.data.image.letterbox_darknet`); default: ``"darknet"`` for
            weights converted from Darknet, else ``"bicubic"``.
        scale_x_y: grid sensitivity, one number or one per head (see
            :func:`yolo3.inference.postprocess.decode_heads`); default: what the weights file
            records, else 1 (YOLOv3's).

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
        model_type=None,
        input_size=None,
        score_threshold=0.3,
        iou_threshold=0.45,
        max_detections=100,
        anchor_masks=None,
        resampling=None,
        scale_x_y=None,
    ):
        weights_path = str(weights_path)
        # One home for "an argument, else the file's metadata, else Darknet's default".
        spec = spec_for_weights(
            weights_path,
            classes_path=classes_path,
            anchors_path=anchors_path,
            model_type=model_type,
            input_size=input_size,
            anchor_masks=anchor_masks,
            resampling=resampling,
            scale_x_y=scale_x_y,
            fallbacks={"input_size": DARKNET_INPUT_SIZE},
        )
        anchors, class_names = spec.anchor_array, list(spec.class_names)
        anchor_masks = _resolve_masks(anchors, spec.anchor_masks, spec.model_type)
        num_anchors = len(anchor_masks[0])
        model = build_model(
            spec.model_type, len(class_names), num_anchors=num_anchors, input_size=spec.input_hw
        )
        try:
            weights_io.load_weights(model, weights_path)
        except ValueError as err:
            found = _classes_in_file(weights_path, spec.model_type, num_anchors)
            if found is None or found == len(class_names):
                raise
            raise ValueError(
                f"weights {weights_path} have heads for {found} classes, but classes file "
                f"{classes_path} lists {len(class_names)} classes; use the classes file the "
                f"weights were trained with"
            ) from err
        self._setup(
            model,
            anchors,
            class_names,
            input_size=spec.input_hw,
            score_threshold=score_threshold,
            iou_threshold=iou_threshold,
            max_detections=max_detections,
            anchor_masks=anchor_masks,
            resampling=spec.resampling,
            scale_x_y=spec.scale_x_y,
        )

    @classmethod
    def from_model(
        cls,
        model,
        anchors,
        class_names,
        *,
        input_size=None,
        score_threshold=0.3,
        iou_threshold=0.45,
        max_detections=100,
        anchor_masks=None,
        resampling="bicubic",
        scale_x_y=None,
    ):
        """A detector around an already built (and loaded) Keras model.

        ``anchors`` is ``(num_anchors, 2)`` in input pixels. ``input_size`` defaults to the
        model's static input size; a model that accepts any size needs it given (no size
        is assumed: one the weights were not trained at detects poorly without a word).
        """
        anchors = np.asarray(anchors, dtype=np.float32)
        if input_size is None:
            height, width = model.input_shape[1:3]
            if not (height and width):
                raise ValueError(
                    f"model {model.name} accepts any input size: give input_size, a multiple "
                    "of 32 (the size its weights were trained at)"
                )
            input_size = (height, width)
        detector = cls.__new__(cls)
        detector._setup(
            model,
            anchors,
            list(class_names),
            input_size=input_size,
            score_threshold=score_threshold,
            iou_threshold=iou_threshold,
            max_detections=max_detections,
            anchor_masks=_resolve_masks(anchors, anchor_masks, None),
            resampling=resampling,
            scale_x_y=scale_x_y,
        )
        return detector

    def _setup(
        self,
        model,
        anchors,
        class_names,
        *,
        input_size,
        score_threshold,
        iou_threshold,
        max_detections,
        anchor_masks,
        resampling,
        scale_x_y,
    ):
        if resampling not in RESAMPLING:
            raise ValueError(f"resampling {resampling!r}: use one of {RESAMPLING}")
        num_heads = len(getattr(model, "outputs", None) or anchor_masks)
        if num_heads != len(anchor_masks):
            raise ValueError(
                f"model {model.name} has {num_heads} output heads but the anchor masks "
                f"{anchor_masks} describe {len(anchor_masks)}"
            )
        channels = model.outputs[0].shape[-1] if getattr(model, "outputs", None) else None
        expected = len(anchor_masks[0]) * (5 + len(class_names))
        if channels is not None and channels != expected:
            raise ValueError(
                f"model {model.name} has heads for {channels // len(anchor_masks[0]) - 5} "
                f"classes ({channels} channels) but {len(class_names)} class names were given"
            )
        self.model = model
        self.anchors = np.asarray(anchors, dtype=np.float32)
        self.class_names = class_names
        self.anchor_masks = anchor_masks
        self.scale_x_y = scale_x_y_per_head(scale_x_y, len(anchor_masks), "scale_x_y")
        if isinstance(input_size, int):
            input_size = (input_size, input_size)
        self.input_hw = tuple(int(v) for v in input_size)
        if any(v % 32 for v in self.input_hw):
            raise ValueError(f"input size {self.input_hw} is not a multiple of 32")
        self.score_threshold = score_threshold
        self.iou_threshold = iou_threshold
        self.max_detections = max_detections
        self.resampling = resampling
        # A fixed signature with an open batch axis: one trace serves every batch size. The
        # thresholds are baked in at that trace, so they are fixed for the detector's life.
        self._predict = tf.function(
            self._predict_batch,
            input_signature=[
                tf.TensorSpec((None, *self.input_hw, 3), tf.float32),
                tf.TensorSpec((None, 2), tf.int32),
            ],
        )

    def letterbox(self, image):
        """The network input for one image: ``(H, W, 3)`` float32 in [0, 1]."""
        if self.resampling == "darknet":
            return letterbox_darknet(image, self.input_hw)
        return letterbox_image(image, self.input_hw).astype(np.float32) / np.float32(255)

    def _predict_batch(self, inputs, image_hw):
        outputs = self.model(inputs, training=False)
        return postprocess(
            list(outputs),
            self.anchors,
            len(self.class_names),
            image_hw,
            self.input_hw,
            anchor_masks=self.anchor_masks,
            scale_x_y=self.scale_x_y,
            score_threshold=self.score_threshold,
            iou_threshold=self.iou_threshold,
            max_detections=self.max_detections,
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


def _resolve_masks(anchors, anchor_masks, model_type):
    masks = anchor_masks or default_anchor_masks(len(anchors))
    masks = tuple(tuple(int(i) for i in mask) for mask in masks)
    if model_type is not None and len(masks) != NUM_HEADS[model_type]:
        raise ValueError(
            f"{model_type} has {NUM_HEADS[model_type]} heads but the anchor masks {masks} "
            f"describe {len(masks)}; give 9 anchors for yolov3 or 6 for tiny"
        )
    if len({len(mask) for mask in masks}) != 1:
        raise ValueError(f"anchor masks {masks} must give every head the same anchor count")
    if any(not 0 <= index < len(anchors) for mask in masks for index in mask):
        raise ValueError(f"anchor masks {masks} name anchors beyond the {len(anchors)} given")
    return masks


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
            (:func:`yolo3.evaluation.plots.legend_band`). Off by default, so that the picture keeps
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
        plots.draw_caption(draw, caption, (x_min, y_min, x_max, y_max), color, font, bounds)
    if not legend:
        return image
    band = plots.legend_band(image.width, class_names, detection["classes"])
    framed = Image.new("RGB", (image.width, image.height + band.height))
    framed.paste(image, (0, 0))
    framed.paste(band, (0, image.height))
    return framed
