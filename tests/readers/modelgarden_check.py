"""Run in a subprocess: TensorFlow Model Garden's own decoders read every record of our datasets.

Usage: python modelgarden_check.py OUT.json MODELGARDEN_DIR DETECTION_DIR SEGMENTATION_DIR MULTILABEL_DIR
Writes, per record, what each decoder returned, for the test to compare with the records.

`official/vision/__init__.py` imports every task and config of the Vision library (and with them
tensorflow-datasets, pycocotools, ...), none of which the three decoder modules need: the three
packages whose __init__ does so are given as empty packages over their own folders, so that only
the decoder modules and what they import are loaded, from Model Garden's own files.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import types


def _import_decoders(garden: str):
    sys.path.insert(0, garden)
    for name in ("official.vision", "official.vision.configs", "official.core"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(garden, *name.split("."))]
        sys.modules[name] = package
    from official.vision.dataloaders import classification_input, segmentation_input, tf_example_decoder

    return tf_example_decoder, segmentation_input, classification_input


def _records(data_dir: str):
    import tensorflow as tf

    paths = sorted(glob.glob(os.path.join(data_dir, "shards", "*", "*.tfrecord")))
    return list(tf.data.TFRecordDataset(paths))


def main(out: str, garden: str, detection: str, segmentation: str, multilabel: str) -> None:
    tf_example_decoder, segmentation_input, classification_input = _import_decoders(garden)
    import tensorflow as tf

    results: dict[str, list] = {"detection": [], "segmentation": [], "multilabel": []}
    decoder = tf_example_decoder.TfExampleDecoder(include_mask=True)
    for record in _records(detection):
        decoded = decoder.decode(record)
        results["detection"].append(
            {
                "source_id": decoded["source_id"].numpy().decode(),
                "image_shape": decoded["image"].shape.as_list(),
                "height": int(decoded["height"]),
                "width": int(decoded["width"]),
                "boxes": decoded["groundtruth_boxes"].numpy().tolist(),
                "classes": decoded["groundtruth_classes"].numpy().tolist(),
                "is_crowd": decoded["groundtruth_is_crowd"].numpy().tolist(),
                "area": decoded["groundtruth_area"].numpy().tolist(),
                "mask_shapes": decoded["groundtruth_instance_masks"].shape.as_list(),
                "mask_pixels": decoded["groundtruth_instance_masks"].numpy().sum(axis=(1, 2)).tolist(),
            }
        )
    parser = segmentation_input.Parser(output_size=[64, 64])
    parse = parser.parse_fn(is_training=False)
    seg_decoder = segmentation_input.Decoder()
    for record in _records(segmentation):
        image, labels = parse(seg_decoder.decode(record))
        mask = labels["masks"].numpy()
        results["segmentation"].append(
            {"image_shape": image.shape.as_list(), "ids": sorted({int(v) for v in mask.ravel()})}
        )
    ml_decoder = classification_input.Decoder(is_multilabel=True)
    for record in _records(multilabel):
        decoded = ml_decoder.decode(record)
        results["multilabel"].append(
            {
                "labels": tf.sparse.to_dense(decoded["image/class/label"]).numpy().tolist(),
                "image_bytes": len(decoded["image/encoded"].numpy()),
            }
        )
    with open(out, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
