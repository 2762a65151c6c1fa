"""([B] serialized, [B] name) batches -> output batches: parse, decode, augment or not, finish.

Where decoding runs is the plan's `placement`: "batch" decodes a whole batch in one map (fixed-size
images, fastest for evaluation); "element" unbatches the parsed features, decodes and augments each
example (per-image crops, own sizes, annotations) and batches them again at the same boundaries.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tfdata_readers.decoding import augment
from tfdata_readers.decoding.annotated import annotated_element
from tfdata_readers.decoding.decode import to_output
from tfdata_readers.decoding.parse import METADATA_KEYS, parse_batch
from tfdata_readers.decoding.targets import TARGET_NAMES, annotation_targets, stored_boxes
from tfdata_readers.service import reading as service_reading
from tfdata_readers.stages.plan import AUGMENT_KEY, HEIGHT, INSTANCE_KEY, MASK_KEY, WIDTH, ReaderPlan

__all__ = ["decode_batches"]


def decode_batches(plan: ReaderPlan, batches: tf.data.Dataset, skipped: tf.Tensor | int = 0) -> tf.data.Dataset:
    """(([B] serialized, [B] name), [2] epoch seed) batches of one pass -> the output batches.

    `skipped`: batches of the pass already skipped (resuming mid-epoch), so one fewer each to take."""
    parallel = dict(num_parallel_calls=plan.config.num_parallel_calls, deterministic=plan.deterministic)
    if plan.placement == "batch":
        # (image [B,H,W,C], label [B], {metadata})
        decoded = batches.map(
            lambda batch, seed: (lambda f: _finish(plan, f, _images(plan, f, True)))(_to_features(plan, batch, seed)),
            **parallel,
        )
    else:
        parsed = batches.map(lambda batch, seed: _to_features(plan, batch, seed), **parallel).unbatch()  # {key: scalar}
        elements = parsed.map(lambda f: _element(plan, f), **parallel)  # ({key: scalar, target: fixed}, [H,W,C])
        # Re-batching what was just unbatched gives the same batch boundaries.
        decoded = elements.batch(plan.batch_size, drop_remainder=plan.drop_remainder).map(
            lambda f, pixels: _finish(plan, f, pixels), **parallel
        )
    if plan.batches_per_epoch is not None and not plan.service:
        # Every pipeline yields the same number of batches per epoch, so their step counts agree.
        decoded = decoded.take(plan.batches_per_epoch - skipped)
    # Through the service in training, a global step's batches travel as one element of one
    # pass (see tfdata_readers.service.reading): otherwise a step could hold an example twice.
    return service_reading.group_steps(decoded, plan.replicas_per_step)


def _to_features(plan: ReaderPlan, batch: tuple[tf.Tensor, tf.Tensor], epoch_seed: tf.Tensor) -> dict[str, tf.Tensor]:
    serialized, names = batch
    # The names make a parse error (a missing key, a wrong type) name the shard, record and offset.
    features = parse_batch(serialized, plan.spec, names=names)
    if plan.training:
        features["seed"] = augment.example_seeds(epoch_seed, features[AUGMENT_KEY])
    else:
        features["seed"] = tf.zeros([tf.shape(serialized)[0], 2], tf.int64)
    return features


def _images(plan: ReaderPlan, features: dict[str, tf.Tensor], batched: bool) -> tf.Tensor:
    """The pixels of a batch ([B,H,W,C]) or of one example ([H,W,C]), cropped and flipped in training."""
    config, image, out_size = plan.config, plan.image, plan.out_size
    encoded = features["image/encoded"]
    area, aspect, dct = config.crop_area_range, config.crop_aspect_ratio_range, config.jpeg_dct_method
    if batched:
        if plan.training:
            return augment.train_batch(
                encoded,
                features["seed"],
                image,
                out_size=out_size,
                area_range=area,
                aspect_ratio_range=aspect,
                dct_method=dct,
            )
        return augment.eval_batch(encoded, image, out_size=out_size, dct_method=dct)
    size = tf.stack([features[HEIGHT], features[WIDTH]]) if image.keeps_size else None
    if plan.training:
        return augment.train_element(
            encoded,
            features["seed"],
            image,
            out_size=out_size,
            size=size,
            area_range=area,
            aspect_ratio_range=aspect,
            dct_method=dct,
        )
    return augment.eval_element(encoded, image, out_size=out_size, size=size, dct_method=dct)


def _element(plan: ReaderPlan, features: dict[str, Any]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """One parsed example -> (its fixed-shape features, its pixels): an annotated example's
    lists become its targets (annotation_targets), its boxes and mask moved with the pixels."""
    if not plan.annotated:
        return features, _images(plan, features, False)
    task, config, num_classes = plan.task, plan.config, plan.info.num_classes
    fixed = {key: value for key, value in features.items() if key not in plan.spec or key in plan.keys}
    if task == "multi_label" and not plan.semantic:
        pixels = _images(plan, features, False)  # the classification crop: no box or mask to move
        fixed.update(annotation_targets(features, None, num_classes=num_classes, max_boxes=config.max_boxes))
        return fixed, pixels
    size = tf.stack([features[HEIGHT], features[WIDTH]]) if plan.image.keeps_size else None
    view = annotated_element(
        features["image/encoded"],
        features["seed"],
        plan.image,
        stored_boxes(features) if task == "detection" else tf.zeros([0, 4]),
        out_size=plan.out_size,
        training=plan.training,
        mask_png=features[MASK_KEY] if plan.semantic else None,
        instance_pngs=features[INSTANCE_KEY] if plan.instance else None,
        size=size,
        area_range=config.object_crop_area_range,
        dct_method=config.jpeg_dct_method,
    )
    fixed.pop(MASK_KEY, None)
    fixed.pop(INSTANCE_KEY, None)
    fixed.update(
        annotation_targets(
            features,
            view["boxes"] if task == "detection" else None,
            kept=view["kept"],
            instance_masks=view.get("instance_masks"),
            num_classes=num_classes,
            max_boxes=config.max_boxes,
        )
    )
    if plan.semantic:
        fixed["mask"] = tf.ensure_shape(view["mask"], (*plan.out_size, 1))
    fixed["boxes_dropped"] = view["dropped"]
    return fixed, view["pixels"]


def _finish(plan: ReaderPlan, features: dict[str, tf.Tensor], pixels: tf.Tensor) -> tuple[Any, ...]:
    """The output batch: (pixels, label[, weight][, metadata]), or (pixels, targets[, metadata])
    for annotated examples, as Keras's conventions have it: (image, multi-hot labels), (image,
    mask), or (image, {targets})."""
    pixels = to_output(pixels, plan.config.dtype, plan.config.scale)
    if plan.annotated:
        names = TARGET_NAMES[plan.task] + (("mask",) if plan.semantic and plan.task == "detection" else ())
        names += ("masks",) if plan.instance else ()
        targets = {name: features[name] for name in names}
        annotated_out: tuple[Any, ...] = (pixels, targets if len(targets) > 1 else targets[names[0]])
        if plan.with_metadata:
            meta = {name: features[key] for name, key in METADATA_KEYS.items() if key in features}
            if "boxes_dropped" in features:
                meta["boxes_dropped"] = features["boxes_dropped"]
            annotated_out += (meta,)
        return annotated_out
    labels = features["image/class/label"]
    out: tuple[Any, ...] = (pixels, labels)
    if plan.weights is not None:
        out += (tf.gather(plan.weights, labels),)
    if plan.with_metadata:
        out += ({name: features[key] for name, key in METADATA_KEYS.items()},)
    return out
