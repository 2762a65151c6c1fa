"""Boxes and several labels per image: the job moves boxes with the pixels, in every resize mode.

The inputs are real-photo crops pasted onto real photos (tests/pasted_photos.py), some turned by
EXIF, so every box's truth is known: the stored image, cut at the stored box, must show the crop.
"""

from __future__ import annotations

import glob
import io
import json
import math
import pathlib

import numpy as np
import pytest
from PIL import Image

import beam_jobs
from beam_jobs.imaging.annotate import stored_objects
from beam_jobs.imaging.geometry import map_box, orient_box, place
from beam_jobs.imaging.preprocess import resize_image_by
from beam_jobs.records import Annotations, BoxObject
from tests.dataset_files import dead_letters
from tests.pasted_photos import (
    OBJECTS,
    PastedImage,
    make_pasted_images,
    object_view,
    write_coco,
    write_jsonl,
    write_masks,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _records(out: pathlib.Path) -> list[dict]:
    """Every example of the dataset as {key: list of values}, by the plain protobuf reader."""
    from tensorflow.core.example import example_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow.python.lib.io import tf_record  # pylint: disable=import-outside-toplevel

    found = []
    for path in sorted(glob.glob(str(out / "shards" / "*" / "*.tfrecord"))):
        for record in tf_record.tf_record_iterator(path):
            features = example_pb2.Example.FromString(record).features.feature
            found.append(
                {
                    key: list(getattr(f, f.WhichOneof("kind")).value) if f.WhichOneof("kind") else []
                    for key, f in features.items()
                }
            )
    return found


def _mad(a: Image.Image, b: Image.Image) -> float:
    return float(np.abs(np.asarray(a, float) - np.asarray(b.resize(a.size), float)).mean())


def _boxes(record: dict) -> list[tuple[str, tuple[float, float, float, float]]]:
    sides = [record[f"image/object/bbox/{s}"] for s in ("xmin", "ymin", "xmax", "ymax")]
    return [
        (t.decode(), box) for t, box in zip(record["image/object/class/text"], zip(*sides, strict=True), strict=True)
    ]


@pytest.fixture(scope="module")
def pasted(tmp_path_factory) -> tuple[pathlib.Path, list[PastedImage]]:
    root = tmp_path_factory.mktemp("pasted")
    return root, make_pasted_images(root)


def _check_boxes_frame_objects(out: pathlib.Path, images: list[PastedImage], *, cut_allowed: bool) -> int:
    """Checks that each stored box shows its pasted crop, turned as the image is; returns how many
    were checked. Boxes at the output's edge may have been cut by a crop (``cut_allowed``)."""
    by_name = {image.name: image for image in images}
    checked = 0
    for record in _records(out):
        image = by_name[record["image/filename"][0].decode()]
        stored = Image.open(io.BytesIO(record["image/encoded"][0])).convert("RGB")
        width, height = stored.size
        assert (record["image/width"][0], record["image/height"][0]) == (width, height)
        labels = {o.label: o for o in image.objects}
        for label, (x0, y0, x1, y1) in _boxes(record):
            assert 0 <= x0 < x1 <= 1 and 0 <= y0 < y1 <= 1, (image.name, label)
            if cut_allowed and (x0 < 1e-6 or y0 < 1e-6 or x1 > 1 - 1e-6 or y1 > 1 - 1e-6):
                continue  # maybe cut by the crop: it is clipped to the image, not checked by pixels
            region = stored.crop((round(x0 * width), round(y0 * height), round(x1 * width), round(y1 * height)))
            truth = object_view(labels[label], image.orientation)
            unturned = object_view(labels[label], 1)
            assert _mad(region, truth) < 14, (image.name, label, _mad(region, truth))
            if image.orientation != 1:  # the orientation is what made it match
                assert _mad(region, unturned) > _mad(region, truth) + 10, (image.name, label)
            checked += 1
    return checked


@pytest.mark.parametrize("resize_mode", ["crop", "pad", "stretch", "keep"])
def test_every_box_frames_its_pasted_object_in_each_resize_mode(pasted, tmp_path, resize_mode):
    root, images = pasted
    out = tmp_path / "out"
    size = {} if resize_mode == "keep" else {"image_size": "160x120"}
    info = beam_jobs.convert(
        manifest=str(write_jsonl(root, images)), output_dir=str(out), resize_mode=resize_mode, **size
    )
    assert info["task"] == "detection" and info["schema_version"] == 2
    assert info["label_names"] == sorted(OBJECTS)
    split = info["splits"]["train"]
    kept = sum(split["object_counts"].values())
    assert kept + split["objects_cut_by_crop"] == 2 * len(images)
    if resize_mode != "crop":
        assert split["objects_cut_by_crop"] == 0
    checked = _check_boxes_frame_objects(out, images, cut_allowed=resize_mode == "crop")
    assert checked >= (len(images) // 2 if resize_mode == "crop" else 2 * len(images))


def test_keep_mode_stores_an_upright_jpeg_byte_for_byte_and_turns_the_others(pasted, tmp_path):
    root, images = pasted
    out = tmp_path / "out"
    beam_jobs.convert(manifest=str(write_jsonl(root, images)), output_dir=str(out), resize_mode="keep")
    for record in _records(out):
        name = record["image/filename"][0].decode()
        image = next(i for i in images if i.name == name)
        source = (root / name).read_bytes()
        assert (record["image/encoded"][0] == source) == (image.orientation == 1), name
        assert (record["image/width"][0], record["image/height"][0]) == image.upright_size


def test_max_side_shrinks_only_larger_images_and_keeps_their_aspect(pasted, tmp_path):
    root, images = pasted
    out = tmp_path / "out"
    info = beam_jobs.convert(
        manifest=str(write_jsonl(root, images)), output_dir=str(out), resize_mode="keep", max_side=320
    )
    assert info["image"]["height"] is None and info["preprocessing"]["max_side"] == 320
    for record in _records(out):
        image = next(i for i in images if i.name == record["image/filename"][0].decode())
        w, h = image.upright_size
        got = (record["image/width"][0], record["image/height"][0])
        if max(w, h) <= 320:
            assert got == (w, h)
        else:
            assert max(got) == 320 and abs(got[0] / got[1] - w / h) < 0.02
    _check_boxes_frame_objects(out, images, cut_allowed=False)


def test_multi_label_rows_store_their_classes_as_lists(pasted, tmp_path):
    root, images = pasted
    rows = [{"uri": image.name, "labels": sorted({o.label for o in image.objects})} for image in images]
    rows[0]["labels"] = []  # an image of none of the classes
    listing = root / "labels.jsonl"
    listing.write_text("\n".join(map(json.dumps, rows)))
    info = beam_jobs.convert(manifest=str(listing), output_dir=str(tmp_path / "out"), image_size=64)
    assert info["task"] == "multi_label"
    by_name = {row["uri"]: row["labels"] for row in rows}
    counts = dict.fromkeys(info["label_names"], 0)
    for record in _records(tmp_path / "out"):
        expected = by_name[record["image/filename"][0].decode()]
        assert [t.decode() for t in record["image/class/text"]] == expected
        assert [info["label_names"][i] for i in record["image/class/label"]] == expected
        for name in expected:
            counts[name] += 1
    assert info["splits"]["train"]["class_counts"] == counts


def test_bad_annotations_are_dead_letters_naming_the_annotation(pasted, tmp_path):
    root, images = pasted
    extra = {
        "annotations": [
            {"id": 901, "image_id": 1, "category_id": 99, "bbox": [1, 1, 5, 5], "iscrowd": 0},  # unknown category
            {"id": 902, "image_id": 2, "category_id": 1, "bbox": [10, 10, 0, 5], "iscrowd": 0},  # no area
            {"id": 903, "image_id": 3, "category_id": 1, "bbox": [5000, 10, 20, 20], "iscrowd": 0},  # outside
            {"id": 904, "image_id": 555, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 0},  # no such image
        ],
        "images": [{"id": 4, "file_name": images[4].name, "width": 1, "height": 1}],  # id 4 listed twice
    }
    coco = write_coco(root, images, extra=extra)
    out = tmp_path / "out"
    info = beam_jobs.convert(
        str(root),
        coco_annotations=str(coco),
        annotation_frame="stored",
        output_dir=str(out),
        image_size=96,
        max_bad_fraction=0.9,
    )
    letters = dead_letters(out)
    text = json.dumps(letters)
    for needle in (
        "annotation 901",
        "category_id 99",
        "annotation 902",
        "has no area",
        "annotation 904",
        "image id 4 is listed 2 times",
    ):
        assert needle in text, needle
    outside = [d for d in letters if d["reason"] == "bad_annotation"]
    assert (
        len(outside) == 1 and "annotation 903" in outside[0]["detail"] and "outside the image" in outside[0]["detail"]
    )
    # Images 1, 2, 3 (refused with their bad annotation) and 4 (listed twice) are not in the dataset.
    assert info["splits"]["train"]["num_examples"] == len(images) - 4


def test_a_coco_file_converts_to_the_same_boxes_as_the_input_list(pasted, tmp_path):
    root, images = pasted
    from_list = beam_jobs.convert(
        manifest=str(write_jsonl(root, images)), output_dir=str(tmp_path / "a"), image_size=96
    )
    from_coco = beam_jobs.convert(
        str(root),
        coco_annotations=str(write_coco(root, images)),
        annotation_frame="stored",
        output_dir=str(tmp_path / "b"),
        image_size=96,
    )
    assert from_list["splits"]["train"]["object_counts"] == from_coco["splits"]["train"]["object_counts"]
    # Each class keeps its COCO id, for COCO's own evaluation; a list has none to keep.
    coco = json.loads(write_coco(root, images).read_text())
    assert (
        from_coco["category_ids"] == {c["name"]: c["id"] for c in coco["categories"]}
        and "category_ids" not in from_list
    )
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel

    assert tfr.load_manifest(tmp_path / "b").category_ids == from_coco["category_ids"]

    def boxes(out: pathlib.Path) -> dict:
        return {r["image/filename"][0]: _boxes(r) for r in _records(out)}

    a, b = boxes(tmp_path / "a"), boxes(tmp_path / "b")
    assert a.keys() == b.keys()
    for name in a:
        assert [label for label, _ in a[name]] == [label for label, _ in b[name]]
        np.testing.assert_allclose([box for _, box in a[name]], [box for _, box in b[name]], atol=1e-6)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orient_box_turns_a_box_as_pillow_turns_the_pixels(orientation):
    from PIL import ImageOps  # pylint: disable=import-outside-toplevel

    mask = Image.new("L", (50, 30))
    mask.paste(255, (7, 4, 20, 11))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    mask.save(buffer, "PNG", exif=exif.tobytes())
    turned = ImageOps.exif_transpose(Image.open(buffer))
    assert orient_box((7, 4, 20, 11), (50, 30), orientation) == turned.getbbox()


@pytest.mark.parametrize("mode", ["crop", "pad", "stretch"])
def test_map_box_agrees_with_the_resized_pixels(mode):
    """A white box on black, resized by a placement, lands where map_box says (within a pixel)."""
    source = Image.new("L", (300, 200))
    source.paste(255, (100, 50, 200, 150))
    placement = place(source.size, (90, 120), mode)
    resized = np.asarray(resize_image_by(source, placement, "bilinear"))
    rows, cols = np.nonzero(resized > 127)
    x0, y0, x1, y1 = map_box((100, 50, 200, 150), placement)
    assert abs(cols.min() - x0) <= 1 and abs(cols.max() + 1 - x1) <= 1
    assert abs(rows.min() - y0) <= 1 and abs(rows.max() + 1 - y1) <= 1


def test_a_box_cut_away_by_the_crop_is_dropped_and_counted():
    annotations = Annotations(
        objects=(BoxObject("a", 0, 0, 20, 20), BoxObject("b", 140, 40, 160, 60)), object_ids=(0, 1)
    )
    placement = place((300, 100), (100, 100), "crop")  # keeps x 100..200
    objects = stored_objects(
        annotations, file_size=(300, 100), orientation=1, decoded_size=(300, 100), placement=placement
    )
    assert objects.dropped == 1 and objects.label_texts == ("b",)
    assert objects.boxes == ((0.4, 0.4, 0.6, 0.6),)


def test_a_keras_detection_head_trains_under_mirrored_strategy_and_evaluates_each_example_once(pasted, tmp_path):
    """The reader's detection targets feed a real Keras model under a real MirroredStrategy."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    root, images = pasted
    out = tmp_path / "out"
    info = beam_jobs.convert(
        manifest=str(write_jsonl(root, images, labels=True)), output_dir=str(out), resize_mode="keep"
    )
    results = tmp_path / "results.json"
    check = pathlib.Path(__file__).parent / "readers" / "detection_mirrored_check.py"
    proc = subprocess.run(
        [sys.executable, str(check), str(results), str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(results.read_text())
    losses = seen["loss"]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert sorted(seen["eval_keys"]) == sorted(r["image/key/sha256"][0].decode() for r in _records(out))
    assert len(seen["eval_keys"]) == info["splits"]["train"]["num_examples"]


def test_the_reader_flips_boxes_with_the_pixels_and_pads_to_max_boxes(pasted, tmp_path):
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel

    root, images = pasted
    out = tmp_path / "out"
    beam_jobs.convert(manifest=str(write_jsonl(root, images)), output_dir=str(out), image_size="96x64")
    stored = {r["image/key/sha256"][0].decode(): _boxes(r) for r in _records(out)}
    evaluation = tfr.make_dataset(out, "train", 8, with_metadata=True, max_boxes=3)
    # The whole image as the training crop, so that the flip is the only change to the boxes.
    training = tfr.make_dataset(
        out, "train", 8, with_metadata=True, max_boxes=3, training=True, seed=5, object_crop_area_range=(1.0, 1.0)
    )
    flips = 0
    for (_, eval_targets, eval_meta), (_, train_targets, train_meta) in zip(evaluation, training, strict=True):
        train_by_key = {k.decode(): i for i, k in enumerate(train_meta["key"].numpy())}
        for i, key in enumerate(k.decode() for k in eval_meta["key"].numpy()):
            boxes, classes = eval_targets["boxes"][i].numpy(), eval_targets["classes"][i].numpy()
            want = stored[key]
            assert list(classes[len(want) :]) == [-1] * (3 - len(want))
            np.testing.assert_allclose(boxes[: len(want)], [[b[1], b[0], b[3], b[2]] for _, b in want], atol=1e-6)
            train_boxes = train_targets["boxes"][train_by_key[key]].numpy()[: len(want)]
            mirrored = np.stack(
                [boxes[: len(want), 0], 1 - boxes[: len(want), 3], boxes[: len(want), 2], 1 - boxes[: len(want), 1]], 1
            )
            if np.allclose(train_boxes, mirrored, atol=1e-6) and not np.allclose(train_boxes, boxes[: len(want)]):
                flips += 1
            else:
                np.testing.assert_allclose(train_boxes, boxes[: len(want)], atol=1e-6)
    assert 0 < flips < len(stored)


def _png(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)))


@pytest.mark.parametrize("resize_mode", ["crop", "pad", "keep"])
def test_semantic_masks_follow_the_pixels_and_hold_only_their_class_ids(pasted, tmp_path, resize_mode):
    from tests.pasted_photos import write_masks  # pylint: disable=import-outside-toplevel

    root, images = pasted
    masks = write_masks(root, images)
    rows = [json.loads(line) for line in write_jsonl(root, images).read_text().splitlines()]
    for row in rows:
        row["mask"] = masks[row["uri"]]
    listing = root / "seg.jsonl"
    listing.write_text("\n".join(map(json.dumps, rows)))
    size = {} if resize_mode == "keep" else {"image_size": "128x96"}
    out = tmp_path / "out"
    info = beam_jobs.convert(manifest=str(listing), output_dir=str(out), resize_mode=resize_mode, **size)
    assert info["annotations"]["semantic_masks"] and info["features"]["image/segmentation/class/encoded"]
    ids = {name: index + 1 for index, name in enumerate(sorted(OBJECTS))}
    seen: set[int] = set()
    for record in _records(out):
        mask = _png(record["image/segmentation/class/encoded"][0])
        seen.update(int(i) for i in np.unique(mask))
        assert record["image/segmentation/class/format"] == [b"png"]
        assert mask.shape == (record["image/height"][0], record["image/width"][0])
        allowed = {0, *ids.values()} | ({255} if resize_mode == "pad" else set())
        assert set(np.unique(mask)) <= allowed
        height, width = mask.shape
        for label, (x0, y0, x1, y1) in _boxes(record):
            # Inside the box, a pixel away from its edges (where rounding may fall either way): all its class.
            top, left = math.ceil(y0 * height) + 1, math.ceil(x0 * width) + 1
            inside = mask[top : math.floor(y1 * height) - 1, left : math.floor(x1 * width) - 1]
            assert (inside == ids[label]).all(), (label, (inside == ids[label]).mean())
        if resize_mode == "keep":  # nearest-neighbour at full size: the mask's pixels exactly where the box is
            assert (mask > 0).sum() == pytest.approx(
                sum((x1 - x0) * width * (y1 - y0) * height for _, (x0, y0, x1, y1) in _boxes(record)), abs=1
            )
    # A mask's ids are the user's own numbers: the manifest records those its masks hold.
    assert info["splits"]["train"]["mask_class_ids"] == sorted(seen)
    assert {0, *ids.values()} <= seen


def test_coco_instance_masks_from_polygons_and_rle_match_their_boxes(pasted, tmp_path):
    from pycocotools import mask as coco_mask  # pylint: disable=import-outside-toplevel

    from tests.pasted_photos import polygon_of  # pylint: disable=import-outside-toplevel

    root, images = pasted
    coco_path = write_coco(root, images)
    coco = json.loads(coco_path.read_text())
    for index, annotation in enumerate(coco["annotations"]):
        x, y, w, h = annotation["bbox"]
        image = images[annotation["image_id"] - 1]
        if index % 2:  # every other one as compressed RLE
            bitmap = np.zeros((image.size[1], image.size[0]), np.uint8, order="F")
            bitmap[y : y + h, x : x + w] = 1
            rle = coco_mask.encode(bitmap)
            annotation["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
        else:
            annotation["segmentation"] = polygon_of((x, y, x + w, y + h))
    coco_path.write_text(json.dumps(coco))
    out = tmp_path / "out"
    info = beam_jobs.convert(
        str(root),
        coco_annotations=str(coco_path),
        annotation_frame="stored",
        coco_masks=True,
        output_dir=str(out),
        image_size=112,
    )
    assert info["annotations"]["instance_masks"]
    checked = 0
    for record in _records(out):
        masks = record["image/object/mask"]
        assert len(masks) == len(record["image/object/class/label"])
        for png, (_, (x0, y0, x1, y1)) in zip(masks, _boxes(record), strict=True):
            mask = _png(png)
            assert set(np.unique(mask)) <= {0, 1}
            rows, cols = np.nonzero(mask)
            assert abs(cols.min() - x0 * 112) <= 1 and abs(cols.max() + 1 - x1 * 112) <= 1
            assert abs(rows.min() - y0 * 112) <= 1 and abs(rows.max() + 1 - y1 * 112) <= 1
            checked += 1
    assert checked >= len(images)
    # verify knows an instance mask is 0/1: one holding other values is named.
    from tensorflow.core.example import example_pb2  # pylint: disable=import-outside-toplevel
    from tensorflow.python.lib.io import tf_record  # pylint: disable=import-outside-toplevel

    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel
    from tfdata_readers.checking.verification import content_problem  # pylint: disable=import-outside-toplevel

    manifest = tfr.load_manifest(out)
    record = next(iter(tf_record.tf_record_iterator(sorted(glob.glob(str(out / "shards" / "*" / "*.tfrecord")))[0])))
    assert content_problem(record, manifest) == ""
    example = example_pb2.Example.FromString(record)
    first = _png(example.features.feature["image/object/mask"].bytes_list.value[0])
    spoiled = io.BytesIO()
    Image.fromarray((first * 7).astype(np.uint8)).save(spoiled, "PNG")
    example.features.feature["image/object/mask"].bytes_list.value[0] = spoiled.getvalue()
    assert "instance mask 0 holds [7], not only 0 and 1" in content_problem(example.SerializeToString(), manifest)
    # The reader's training crop and flip move each object's mask as they move its box.

    moved = 0
    for _, targets in tfr.make_dataset(out, "train", 4, max_boxes=3, training=True, seed=3, image_size=96):
        assert targets["masks"].shape[1:] == (3, 96, 96) and targets["masks"].dtype == np.uint8
        for boxes, classes, masks in zip(*(targets[k].numpy() for k in ("boxes", "classes", "masks")), strict=True):
            for (y0, x0, y1, x1), cls, mask in zip(boxes, classes, masks, strict=True):
                if cls < 0:
                    assert not mask.any()  # padding
                    continue
                rows, cols = np.nonzero(mask)
                assert abs(cols.min() - x0 * 96) <= 1.5 and abs(cols.max() + 1 - x1 * 96) <= 1.5, (cols, x0, x1)
                assert abs(rows.min() - y0 * 96) <= 1.5 and abs(rows.max() + 1 - y1 * 96) <= 1.5, (rows, y0, y1)
                moved += 1
    assert moved >= len(images)
    # inspect tints each object's mask by its class.
    from tfdata_readers.inspection.gather import _annotations_of  # pylint: disable=import-outside-toplevel,protected-access

    _, targets = next(iter(tfr.make_dataset(out, "train", 4, max_boxes=3, image_size=96)))
    for i in range(4):
        drawn = _annotations_of(targets, i, manifest)["mask"]
        held = {int(c) + 1 for c in targets["classes"][i].numpy() if c >= 0}
        assert drawn.shape == (96, 96) and set(np.unique(drawn)) - {0} <= held and drawn.any() == bool(held)


def test_an_input_without_its_mask_or_with_another_images_mask_is_refused(pasted, tmp_path):
    from tests.pasted_photos import write_masks  # pylint: disable=import-outside-toplevel

    root, images = pasted
    masks = write_masks(root, images)
    rows = [{"uri": image.name, "mask": masks[image.name], "labels": [image.objects[0].label]} for image in images]
    del rows[0]["mask"]  # no mask, in a dataset of masks
    rows[1]["mask"] = masks[images[2].name]  # another image's (of another size)
    listing = root / "badseg.jsonl"
    listing.write_text("\n".join(map(json.dumps, rows)))
    out = tmp_path / "out"
    info = beam_jobs.convert(manifest=str(listing), output_dir=str(out), image_size=64, max_bad_fraction=0.5)
    letters = {d["uri"]: d for d in dead_letters(out)}
    assert "no mask" in letters[str(root / images[0].name)]["detail"]
    assert "the mask is" in letters[str(root / images[1].name)]["detail"]
    assert info["task"] == "segmentation" and info["splits"]["train"]["num_examples"] == len(images) - 2
    assert len(letters) == 2


def test_model_gardens_own_decoders_read_every_record_unchanged(pasted, tmp_path):
    """Model Garden's TfExampleDecoder (with masks), segmentation decoder and parser, and
    multi-label classification decoder read our records, and return the values we stored."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    from tests.pasted_photos import polygon_of, write_masks  # pylint: disable=import-outside-toplevel

    garden = pathlib.Path(sys.prefix) / "modelgarden"
    assert (garden / "official").is_dir(), "launch/ensure_venv.sh test installs Model Garden there"
    root, images = pasted
    coco_path = write_coco(root, images)
    coco = json.loads(coco_path.read_text())
    for annotation in coco["annotations"]:
        x, y, w, h = annotation["bbox"]
        annotation["segmentation"] = polygon_of((x, y, x + w, y + h))
    coco["annotations"][0]["iscrowd"] = 1
    coco_path.write_text(json.dumps(coco))
    detection, segmentation, multilabel = tmp_path / "det", tmp_path / "seg", tmp_path / "ml"
    beam_jobs.convert(
        str(root),
        coco_annotations=str(coco_path),
        annotation_frame="stored",
        coco_masks=True,
        output_dir=str(detection),
        resize_mode="keep",
    )
    masks = write_masks(root, images)
    listing = root / "mg-seg.jsonl"
    listing.write_text("\n".join(json.dumps({"uri": i.name, "mask": masks[i.name]}) for i in images))
    beam_jobs.convert(manifest=str(listing), output_dir=str(segmentation), image_size=80, resize_mode="pad")
    ml_info = beam_jobs.convert(
        manifest=str(write_jsonl(root, images, labels=True)), output_dir=str(multilabel), image_size=48
    )
    out = tmp_path / "decoded.json"
    check = pathlib.Path(__file__).parent / "readers" / "modelgarden_check.py"
    proc = subprocess.run(
        [sys.executable, str(check), str(out), str(garden), str(detection), str(segmentation), str(multilabel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    decoded = json.loads(out.read_text())

    ours = _records(detection)
    assert len(decoded["detection"]) == len(ours) == len(images)
    for mine, theirs in zip(ours, decoded["detection"], strict=True):
        height, width = mine["image/height"][0], mine["image/width"][0]
        assert theirs["source_id"] == mine["image/source_id"][0].decode()
        assert theirs["image_shape"] == [height, width, 3] and (theirs["height"], theirs["width"]) == (height, width)
        boxes = [[b[1], b[0], b[3], b[2]] for _, b in _boxes(mine)]  # theirs: ymin, xmin, ymax, xmax
        np.testing.assert_allclose(theirs["boxes"], boxes, atol=1e-6)
        assert theirs["classes"] == mine["image/object/class/label"]
        assert theirs["is_crowd"] == [bool(c) for c in mine["image/object/is_crowd"]]
        np.testing.assert_allclose(theirs["area"], mine["image/object/area"], rtol=1e-6)
        assert theirs["mask_shapes"] == [len(boxes), height, width]
        # Each instance mask holds its box's pixels (the pasted rectangles), as 0/1.
        expected = [(b[2] - b[0]) * width * (b[3] - b[1]) * height for _, b in _boxes(mine)]
        np.testing.assert_allclose(theirs["mask_pixels"], expected, rtol=0.02)
    assert any(any(t["is_crowd"]) for t in decoded["detection"])

    ids = {0, *range(1, len(OBJECTS) + 1)}
    assert len(decoded["segmentation"]) == len(images)
    for seg in decoded["segmentation"]:
        assert seg["image_shape"] == [64, 64, 3]
        assert set(seg["ids"]) <= ids | {255} and set(seg["ids"]) & (ids - {0})

    names = ml_info["label_names"]
    by_key = {tuple(sorted({o.label for o in i.objects})) for i in images}
    assert {tuple(names[j] for j in ml["labels"]) for ml in decoded["multilabel"]} == by_key


def _segmented_detection_set(root: pathlib.Path, images: list[PastedImage], out: pathlib.Path, **options) -> dict:
    from tests.pasted_photos import write_masks  # pylint: disable=import-outside-toplevel

    masks = write_masks(root, images)
    rows = [json.loads(line) for line in write_jsonl(root, images).read_text().splitlines()]
    for row in rows:
        row["mask"] = masks[row["uri"]]
    listing = root / "segdet.jsonl"
    listing.write_text("\n".join(map(json.dumps, rows)))
    return beam_jobs.convert(manifest=str(listing), output_dir=str(out), **options)


def test_training_crops_move_boxes_and_masks_together_and_count_what_they_drop(pasted, tmp_path):
    """In every training view the mask's class region is where its box says: one window, one flip."""
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel

    root, images = pasted
    out = tmp_path / "out"
    _segmented_detection_set(root, images, out, resize_mode="keep")
    ids = {name: index + 1 for index, name in enumerate(sorted(OBJECTS))}
    names = tfr.load_manifest(out).label_names
    dropped = boxes_seen = 0
    for seed in range(3):
        dataset = tfr.make_dataset(out, "train", 4, image_size=96, training=True, seed=seed, with_metadata=True)
        for _, targets, meta in dataset:
            dropped += int(meta["boxes_dropped"].numpy().sum())
            for i in range(targets["mask"].shape[0]):
                mask = targets["mask"][i, :, :, 0].numpy()
                for box, cls in zip(targets["boxes"][i].numpy(), targets["classes"][i].numpy(), strict=True):
                    if cls < 0:
                        continue
                    top, left, bottom, right = box * 96
                    region = mask[
                        math.ceil(top) + 1 : math.floor(bottom) - 1, math.ceil(left) + 1 : math.floor(right) - 1
                    ]
                    if region.size:
                        assert (region == ids[names[cls]]).mean() > 0.95
                    boxes_seen += 1
    assert boxes_seen > 0
    assert dropped + boxes_seen == 3 * 2 * len(images)  # every stored box is either kept or counted


def test_a_segmentation_dataset_reads_as_image_and_mask_pairs(pasted, tmp_path):
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel
    from tests.pasted_photos import write_masks  # pylint: disable=import-outside-toplevel

    root, images = pasted
    masks = write_masks(root, images)
    listing = root / "seg-only.jsonl"
    listing.write_text("\n".join(json.dumps({"uri": i.name, "mask": masks[i.name]}) for i in images))
    out = tmp_path / "out"
    info = beam_jobs.convert(manifest=str(listing), output_dir=str(out), resize_mode="keep")
    assert info["task"] == "segmentation"
    pixels, mask = next(iter(tfr.make_dataset(out, "train", 2, image_size=(48, 64))))
    assert pixels.shape == (2, 48, 64, 3) and mask.shape == (2, 48, 64, 1) and mask.dtype.name == "uint8"
    assert set(np.unique(mask.numpy())) <= {0, 1, 2, 3}
    # inspect draws it, each tile named by the ids its mask holds.
    from tfdata_readers.inspect import main as inspect_main  # pylint: disable=import-outside-toplevel
    from tfdata_readers.inspection.sheet import TILES_CHUNK  # pylint: disable=import-outside-toplevel

    assert inspect_main([str(out), "--out", str(tmp_path / "report")]) == 0
    tiles = json.loads(Image.open(tmp_path / "report" / "contact_sheet-train.png").text[TILES_CHUNK])
    assert len(tiles) == len(images) and all(t["label"].startswith("mask ids 0+") for t in tiles), tiles


def test_verify_names_a_box_outside_the_image_and_a_mask_of_another_size(pasted, tmp_path):
    from tensorflow.core.example import example_pb2  # pylint: disable=import-outside-toplevel

    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel
    from tfdata_readers.checking.verification import content_problem  # pylint: disable=import-outside-toplevel

    root, images = pasted
    out = tmp_path / "out"
    _segmented_detection_set(root, images, out, image_size=64)
    assert tfr.verify(out) == []
    info = tfr.load_manifest(out)
    path = sorted(glob.glob(str(out / "shards" / "*" / "*.tfrecord")))[0]
    from tensorflow.python.lib.io import tf_record  # pylint: disable=import-outside-toplevel

    record = next(iter(tf_record.tf_record_iterator(path)))
    assert content_problem(record, info) == ""
    example = example_pb2.Example.FromString(record)
    example.features.feature["image/object/bbox/xmax"].float_list.value[0] = 1.5
    assert "not inside [0, 1]" in content_problem(example.SerializeToString(), info)
    example = example_pb2.Example.FromString(record)
    small = io.BytesIO()
    Image.new("L", (8, 8)).save(small, "PNG")
    example.features.feature["image/segmentation/class/encoded"].bytes_list.value[0] = small.getvalue()
    assert "the semantic mask is (8, 8), the image 64x64" in content_problem(example.SerializeToString(), info)
    example = example_pb2.Example.FromString(record)
    example.features.feature["image/object/class/label"].int64_list.value[0] = 7
    assert "objects: id 7, not in [0, num_classes=3)" in content_problem(example.SerializeToString(), info)


def test_inspect_draws_boxes_and_masks_and_reports_objects_per_class(pasted, tmp_path):
    """The contact sheet's tile list names each drawn box, the boxes' pixels are drawn in a box
    colour, and the summary gives the objects per class and the boxes cut."""
    import subprocess  # pylint: disable=import-outside-toplevel
    import sys  # pylint: disable=import-outside-toplevel

    from tfdata_readers.inspection.sheet import TILES_CHUNK  # pylint: disable=import-outside-toplevel

    root, images = pasted
    out = tmp_path / "out"
    info = _segmented_detection_set(root, images, out, image_size=96)
    report = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "tfdata_readers.inspect", str(out), "--out", str(report), "--augmented"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = ", ".join(f"{name} {n}" for name, n in info["splits"]["train"]["object_counts"].items())
    cut = info["splits"]["train"]["objects_cut_by_crop"]
    assert f"train: objects per class: {counts}; boxes the crop cut away: {cut}" in proc.stdout
    sheet = Image.open(report / "contact_sheet-train.png")
    tiles = json.loads(sheet.text[TILES_CHUNK])
    stored = {r["image/filename"][0].decode(): _boxes(r) for r in _records(out)}
    for tile in tiles:
        drawn = sorted((name, round(xmin, 4)) for name, _, xmin, _, _ in tile["objects"])
        assert drawn == sorted((name, round(box[0], 4)) for name, box in stored[tile["filename"]])
    # A box's outline is drawn in one of the palette's colours at its left edge.
    tile = tiles[0]
    left, top, right, bottom = tile["box"]
    picture_w = (right - left - 5) // 2
    name, ymin, xmin, ymax, xmax = tile["objects"][0]
    x = left + round(xmin * picture_w)
    y = top + round((ymin + ymax) / 2 * (bottom - top))
    pixels = np.asarray(sheet.convert("RGB"))
    from tfdata_readers.inspection.sheet import _PALETTE  # pylint: disable=import-outside-toplevel,protected-access

    near = pixels[y, max(x - 1, left) : x + 2]
    assert any(min(np.abs(near.astype(int) - np.array(c)).sum(axis=1)) < 40 for c in _PALETTE)


@pytest.mark.slow
def test_a_100_mb_coco_file_is_streamed_not_loaded(pasted, tmp_path):
    """COCO files are mostly segmentation numbers: a 100 MB one is read as a stream (the parse of
    its annotations holds well under a megabyte at any time), and the job converts it."""
    import tracemalloc  # pylint: disable=import-outside-toplevel

    from beam_jobs.listing.coco import _keyed_annotations  # pylint: disable=import-outside-toplevel

    root, images = pasted
    coco = json.loads(write_coco(root, images).read_text())
    polygon = json.dumps([[round(i * 0.37 % 50 + 10, 2) for i in range(5000)]])  # about 37 kB of numbers
    path = tmp_path / "big.json"
    with path.open("w") as handle:
        handle.write(json.dumps({"images": coco["images"], "categories": coco["categories"]})[:-1])
        handle.write(', "annotations": [')
        for index in range(3000):
            image = images[index % len(images)]
            x0, y0, x1, y1 = image.objects[0].box
            if index:
                handle.write(",")
            handle.write(
                f'{{"id": {index + 1}, "image_id": {index % len(images) + 1}, "category_id": 1, '
                f'"bbox": [{x0}, {y0}, {x1 - x0}, {y1 - y0}], "iscrowd": 0, "segmentation": {polygon}}}'
            )
        handle.write("]}")
    size = path.stat().st_size
    assert size > 100e6
    tracemalloc.start()
    try:
        assert sum(1 for _ in _keyed_annotations(str(path), masks=False)) == 3000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 100, peak
    info = beam_jobs.convert(
        str(root),
        coco_annotations=str(path),
        annotation_frame="stored",
        output_dir=str(tmp_path / "out"),
        image_size=64,
    )
    assert info["splits"]["train"]["num_examples"] == len(images)
    split = info["splits"]["train"]
    assert sum(split["object_counts"].values()) + split["objects_cut_by_crop"] == 3000


def test_append_adds_annotated_rows_and_refuses_rows_of_another_kind(pasted, tmp_path):
    root, images = pasted
    out = tmp_path / "out"
    rows = [json.loads(line) for line in write_jsonl(root, images).read_text().splitlines()]
    listing = root / "growing.jsonl"
    listing.write_text("\n".join(map(json.dumps, rows[:5])))
    first = beam_jobs.convert(manifest=str(listing), output_dir=str(out), image_size=64, resize_mode="pad")
    listing.write_text("\n".join(map(json.dumps, rows)))
    second = beam_jobs.convert(
        manifest=str(listing), output_dir=str(out), image_size=64, resize_mode="pad", append=True
    )
    assert second["version"] == first["version"] + 1
    assert second["splits"]["train"]["num_examples"] == len(images)
    assert sum(second["splits"]["train"]["object_counts"].values()) == 2 * len(images)
    assert second["task"] == "detection" and len(_records(out)) >= len(images)
    # A one-label row appended to a detection set is an image of its class with no object, as it
    # would be in the run that made the set.
    plain = tmp_path / "plain"
    plain.mkdir()
    Image.open(root / images[0].name).save(plain / "extra.jpg")
    listing.write_text(listing.read_text() + "\n" + json.dumps({"uri": str(plain / "extra.jpg"), "label": "cup"}))
    options = dict(manifest=str(listing), output_dir=str(out), image_size=64, resize_mode="pad", append=True)
    third = beam_jobs.convert(**options, allow_outside_root=True)
    assert third["task"] == "detection" and third["splits"]["train"]["num_examples"] == len(images) + 1
    (extra,) = [r for r in _records(out) if r["image/filename"][0].endswith(b"extra.jpg")]
    assert extra["image/class/text"] == [b"cup"] and extra["image/object/bbox/xmin"] == []
    # Rows with a mask would be examples of another layout (a mask the others lack): refused.
    masks = write_masks(root, images)
    Image.open(root / masks[images[0].name]).save(plain / "extra2.png")
    # Other bytes than extra.jpg's: the same bytes under the same label would be a duplicate of a
    # held example (a dead letter), and nothing would be left to refuse.
    Image.open(root / images[0].name).save(plain / "extra2.jpg", quality=90)
    row = {"uri": str(plain / "extra2.jpg"), "label": "cup", "mask": str(plain / "extra2.png")}
    listing.write_text(listing.read_text() + "\n" + json.dumps(row))
    with pytest.raises(Exception, match="an append must write examples laid out as the version it appends to"):
        beam_jobs.convert(**options, allow_outside_root=True)
    second = third
    assert json.loads((out / "dataset_info.json").read_text())["version"] == second["version"]
