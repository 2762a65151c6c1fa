"""An annotated example's lists as fixed-shape training targets, in Keras's conventions.

- multi_label: `labels`, a multi-hot float32 [num_classes] vector (a sigmoid output and binary
  cross-entropy take it as it is);
- detection: also `boxes`, float32 [max_boxes, 4] as (ymin, xmin, ymax, xmax) normalised to
  [0, 1] (TensorFlow's image ops' order), and `classes`, int64 [max_boxes], padded with -1 (as
  KerasCV and KerasHub pad), and `is_crowd`, bool [max_boxes] (COCO's crowd regions, which
  COCO's evaluation and most detectors' losses ignore; False as padding). An image with more
  than `max_boxes` objects keeps the first `max_boxes`, and a line on stderr says how many were
  cut: never silently. With instance
  masks, also `masks`, uint8 [max_boxes, H, W], each object's 0/1 mask (zeros as padding).
"""

from __future__ import annotations

import sys

import tensorflow as tf

__all__ = ["TARGET_NAMES", "annotation_targets", "list_keys", "stored_boxes"]

TARGET_NAMES = {
    "multi_label": ("labels",),
    "detection": ("boxes", "classes", "is_crowd", "labels"),
    "segmentation": ("mask",),
}
_BOX_KEYS = tuple(f"image/object/bbox/{side}" for side in ("xmin", "ymin", "xmax", "ymax"))


def list_keys(task: str, *, instance_masks: bool = False) -> list[str]:
    """The list features a task's targets are made from (a semantic mask is one string, not a list)."""
    if task == "detection":
        return ["image/class/label", *_BOX_KEYS, "image/object/class/label", "image/object/is_crowd"] + (
            ["image/object/mask"] if instance_masks else []
        )
    return ["image/class/label"]


def stored_boxes(features: dict[str, tf.Tensor]) -> tf.Tensor:
    """An example's boxes as [N, 4] (ymin, xmin, ymax, xmax), the order of TensorFlow's image ops."""
    return tf.stack([features[f"image/object/bbox/{side}"] for side in ("ymin", "xmin", "ymax", "xmax")], axis=1)


def _multi_hot(ids: tf.Tensor, num_classes: int) -> tf.Tensor:
    return tf.reduce_max(tf.one_hot(ids, num_classes, dtype=tf.float32), axis=0) if num_classes else tf.zeros([0])


def annotation_targets(
    features: dict[str, tf.Tensor],
    boxes: tf.Tensor | None,
    *,
    num_classes: int,
    max_boxes: int,
    kept: tf.Tensor | None = None,
    instance_masks: tf.Tensor | None = None,
) -> dict[str, tf.Tensor]:
    """The targets of one example from its parsed lists (`boxes`: its [K, 4] ymin, xmin, ymax,
    xmax boxes after augmentation, for detection, and `kept` which of the stored ones they are)."""
    ids = features["image/class/label"]
    labels = tf.ensure_shape(
        tf.cond(tf.size(ids) > 0, lambda: _multi_hot(ids, num_classes), lambda: tf.zeros([num_classes])),
        [num_classes],
    )
    if boxes is None:
        return {"labels": labels}
    classes = features["image/object/class/label"]
    crowd = features["image/object/is_crowd"]
    if kept is not None:
        classes = tf.gather(classes, kept)
        crowd = tf.gather(crowd, kept)
    count = tf.shape(classes)[0]

    def report_cut() -> tf.Tensor:
        # The key is parsed only when the caller asks for it (or for a training crop's seed).
        which = (
            ["key", features["image/key/sha256"]]
            if "image/key/sha256" in features
            else ["(with_metadata=True names it)"]
        )
        tf.print(
            "tfdata_readers: an image has",
            count,
            f"objects; only max_boxes={max_boxes} are kept (ReadConfig.max_boxes);",
            *which,
            output_stream=sys.stderr,
        )
        return tf.constant(0)

    tf.cond(count > max_boxes, report_cut, lambda: tf.constant(0))
    kept = tf.minimum(count, max_boxes)
    padding = max_boxes - kept
    boxes = tf.pad(boxes[:kept], [[0, padding], [0, 0]])
    classes = tf.pad(classes[:kept], [[0, padding]], constant_values=-1)
    crowd = tf.pad(crowd[:kept], [[0, padding]]) > 0
    targets = {
        "boxes": tf.ensure_shape(boxes, [max_boxes, 4]),
        "classes": tf.ensure_shape(classes, [max_boxes]),
        "is_crowd": tf.ensure_shape(crowd, [max_boxes]),
        "labels": labels,
    }
    if instance_masks is not None:  # [K, H, W] of the kept objects, in the boxes' order
        height, width = instance_masks.shape[1], instance_masks.shape[2]
        masks = tf.pad(instance_masks[:kept], [[0, padding], [0, 0], [0, 0]])
        targets["masks"] = tf.ensure_shape(masks, [max_boxes, height, width])
    return targets
