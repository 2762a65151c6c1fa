"""What enters an annotated dataset: one rule for each way a list or a COCO file can say too little
or too much. Each case is one a user's export produced, and each was once stored as an image with
no boxes, or as a dataset that looked whole."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import beam_jobs
from beam_jobs.errors import BadInputError, JobError
from beam_jobs.imaging.geometry import place
from beam_jobs.imaging.masks import instance_mask
from beam_jobs.listing.coco import _categories, coco_image_input
from beam_jobs.listing.discover import parse_input_list
from tests.dataset_files import dead_letters, shard_paths
from tests.pasted_photos import PastedImage, make_pasted_images, write_coco, write_jsonl, write_masks

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

BOX = {"label": "cat", "xmin": 1, "ymin": 2, "xmax": 30, "ymax": 40}


@pytest.fixture(scope="module")
def pasted(tmp_path_factory) -> tuple[pathlib.Path, list[PastedImage]]:
    root = tmp_path_factory.mktemp("pasted")
    return root, make_pasted_images(root, count=6)


def _rows(text: str, name: str = "list.jsonl") -> list:
    return list(parse_input_list(text, list_uri=f"/data/{name}"))


@pytest.mark.parametrize(
    "row, detail",
    [
        ({"uri": "a.jpg", "labels": ["cat"], "object": [BOX]}, "unknown column 'object'"),
        ({"uri": "a.jpg", "label": "cat", "boxes": [[0, 1, 2, 3]]}, "unknown column 'boxes'"),
        ({"uri": "a.jpg", "label": "cat", "objects": None}, "objects is null"),
    ],
    ids=["misspelt-objects", "boxes-beside-a-label", "null-objects"],
)
def test_a_list_row_with_a_column_the_job_does_not_read_is_a_dead_letter(row, detail):
    good = {"uri": "b.jpg", "objects": [BOX]}
    listed = _rows(json.dumps(row) + "\n" + json.dumps(good) + "\n")
    assert listed[0].reason == "bad_manifest_row" and detail in listed[0].detail, listed[0]
    assert listed[1].annotations.objects[0].label == "cat"  # the next row is unaffected


def test_a_csv_header_with_a_column_the_job_does_not_read_refuses_the_list():
    with pytest.raises(JobError, match="unknown column 'bbox'"):
        _rows('uri,label,bbox\na.jpg,cat,"[1,2,3,4]"\n', name="list.csv")


def _coco_file(tmp_path: pathlib.Path, **parts) -> str:
    path = tmp_path / "coco.json"
    path.write_text(json.dumps({"images": [], "annotations": [], "categories": [], **parts}))
    return str(path)


@pytest.mark.parametrize(
    "categories, message",
    [
        ([{"id": 1, "name": "cat"}, {"id": 1, "name": "dog"}], "category id 1 is listed twice"),
        ([{"id": 1, "name": "cat"}, {"id": 2, "name": "cat "}], "categories 1 and 2 have one name"),
        ([{"id": "1", "name": "cat"}], "category id '1' .* is not an integer"),
        ([{"id": 1, "name": ""}], "category 1 has no name"),
    ],
    ids=["same-id", "same-name", "text-id", "no-name"],
)
def test_coco_categories_that_would_merge_or_shadow_a_class_refuse_the_file(tmp_path, categories, message):
    with pytest.raises(JobError, match=message):
        _categories(_coco_file(tmp_path, categories=categories))


def _inputs(annotations: list, *, image: dict | None = None, root: str = "/data/") -> list:
    image = image or {"file_name": "a.jpg", "width": 100, "height": 80}
    joined = (1, {"images": [image], "annotations": annotations})
    return list(coco_image_input(joined, {1: "cat"}, root=root, where="coco.json", split=None, keep_empty=True))


@pytest.mark.parametrize("crowd", ["0", "yes", 2, None])
def test_a_coco_iscrowd_that_is_not_0_or_1_is_a_dead_letter(crowd):
    (letter,) = _inputs([{"id": 5, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": crowd}])
    assert "annotation 5" in letter.detail and "iscrowd must be 0 or 1" in letter.detail


def test_coco_sizes_written_as_whole_floats_are_checked_like_ints():
    (listed,) = _inputs([], image={"file_name": "a.jpg", "width": 100.0, "height": 80.0})
    assert listed.annotations.declared_size == (100, 80)


@pytest.mark.parametrize("name", ["/etc/a.jpg", "../a.jpg"])
def test_a_coco_file_name_outside_the_image_root_is_refused_not_glued_onto_it(name):
    (letter,) = _inputs([], image={"file_name": name, "width": 10, "height": 10})
    assert letter.reason == "outside_input_root" and "/data//" not in letter.uri, letter


@pytest.mark.parametrize(
    "polygons, message",
    [
        ([[1, 1, 9, 1, 9, 9, 1]], r"polygon #0 \(7 values\)"),
        ([[1, 1, 9, 1, 9, "9"]], "polygon #0"),
        ([5], "polygon #0"),
    ],
    ids=["odd", "text", "not-a-list"],
)
def test_a_malformed_polygon_is_refused_naming_the_annotation(polygons, message):
    with pytest.raises(BadInputError, match=message):
        _mask(polygons)


def _mask(segmentation: list | dict, size: tuple[int, int] = (10, 10)) -> np.ndarray:
    """A segmentation as instance_mask stores it, on an upright image of ``size`` kept as it is."""
    return instance_mask(
        json.dumps(segmentation),
        size,
        upright=True,
        file_size=size,
        orientation=1,
        decoded_size=size,
        placement=place(size, size, "stretch"),
        ref="annotation 7",
    )


def test_a_polygon_of_fewer_than_three_points_adds_no_pixel_and_a_mask_of_none_is_refused():
    square = [2, 2, 8, 2, 8, 8, 2, 8]
    assert (_mask([[1, 1, 5, 5], square]) == _mask([square])).all()
    for nothing in ([], [[1, 1, 5, 5]]):
        with pytest.raises(BadInputError, match="annotation 7: its segmentation covers no pixel"):
            _mask(nothing)


@pytest.mark.parametrize("point", [(1e9, 5), (5, -1e12), (12, 5)])
def test_a_polygon_point_beyond_the_image_is_refused_before_it_is_rasterised(point):
    with pytest.raises(BadInputError, match=r"polygon #0 has the point .* outside the image, which is 10x10"):
        _mask([[2, 2, *point, 8, 8, 2, 8]])
    _mask([[-1, 0, 11, 0, 11, 10.5, 0, 10]])  # within a pixel of the edge: as labelling tools round


def test_whole_numbers_written_as_floats_are_taken_in_an_rle():
    _rle_mask({"size": [3.0, 4.0], "counts": [1.0, 11.0]})


def test_coco_ids_written_as_text_still_join_their_image(pasted, tmp_path):
    root, images = pasted
    coco = json.loads(write_coco(root, images).read_text())
    for annotation in coco["annotations"]:
        annotation["image_id"] = str(annotation["image_id"])  # "1" against the image's 1
    path = tmp_path / "text_ids.json"
    path.write_text(json.dumps(coco))
    info = beam_jobs.convert(
        str(root),
        coco_annotations=str(path),
        annotation_frame="stored",
        output_dir=str(tmp_path / "out"),
        image_size=64,
    )
    split = info["splits"]["train"]
    assert sum(split["object_counts"].values()) + split["objects_cut_by_crop"] == len(coco["annotations"])


def test_a_coco_file_without_an_annotations_array_is_refused(pasted, tmp_path):
    root, images = pasted
    coco = json.loads(write_coco(root, images).read_text())
    coco["annotation"] = coco.pop("annotations")  # misspelt
    path = tmp_path / "misspelt.json"
    path.write_text(json.dumps(coco))
    # The caller's own child process (a notebook's server, say) outlives the failed run, whose
    # cleanup ends the run's workers only.
    caller_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        with pytest.raises(Exception, match="has no annotations"):  # the runner's error, holding the job's
            beam_jobs.convert(
                str(root),
                coco_annotations=str(path),
                annotation_frame="stored",
                output_dir=str(tmp_path / "out"),
                image_size=64,
            )
        assert caller_child.poll() is None
    finally:
        caller_child.kill()
        caller_child.wait()
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def test_an_image_size_with_keep_is_refused_as_it_would_be_ignored(pasted, tmp_path):
    root, images = pasted
    # Through convert(), the message names the keywords the caller passed.
    with pytest.raises(beam_jobs.UsageError, match="image_size does not apply with resize_mode='keep'"):
        beam_jobs.convert(
            manifest=str(write_jsonl(root, images)), output_dir=str(tmp_path / "o"), resize_mode="keep", image_size=96
        )


def test_append_sees_redrawn_boxes_and_holds_unchanged_masks(pasted, tmp_path):
    root, images = pasted
    masks = write_masks(root, images)
    rows = [json.loads(line) for line in write_jsonl(root, images).read_text().splitlines()]
    for row in rows:
        row["mask"] = masks[row["uri"]]
    listing = root / "growing.jsonl"
    out = tmp_path / "out"
    options = dict(manifest=str(listing), output_dir=str(out), image_size=64)
    listing.write_text("\n".join(map(json.dumps, rows[:4])))
    first = beam_jobs.convert(**options)
    # The masks of held rows are as they were: the new rows alone are converted.
    listing.write_text("\n".join(map(json.dumps, rows)))
    second = beam_jobs.convert(**options, append=True)
    assert second["splits"]["train"]["num_examples"] == len(rows) and second["version"] == first["version"] + 1
    # A box redrawn in a held row is a changed input: refused, naming it.
    rows[0]["objects"][0]["xmax"] -= 3
    listing.write_text("\n".join(map(json.dumps, rows)))
    with pytest.raises(Exception, match=r"1 input of version 2 changed \(content, label, annotations, group or split"):
        beam_jobs.convert(**options, append=True)
    assert json.loads((out / "dataset_info.json").read_text())["version"] == second["version"]


def test_one_class_with_two_coco_ids_is_refused_in_a_run_and_across_an_append():
    from beam_jobs.planning.transforms import _category_ids  # pylint: disable=import-outside-toplevel
    from beam_jobs.writing.append import _merged_category_ids  # pylint: disable=import-outside-toplevel

    assert _category_ids([("dog", 18), ("cat", 17), ("cat", 17)]) == {"cat": 17, "dog": 18}
    with pytest.raises(JobError, match="'cat': ids \\[1, 17\\]"):
        _category_ids([("cat", 17), ("cat", 1)])
    base = {"label_names": ["cat"], "category_ids": {"cat": 17}}
    assert _merged_category_ids(base, {"label_names": ["cat", "dog"], "category_ids": {"dog": 18}}) == {
        "cat": 17,
        "dog": 18,
    }
    with pytest.raises(JobError, match="COCO category id: 'cat'"):
        _merged_category_ids(base, {"label_names": ["cat"], "category_ids": {"cat": 3}})


@pytest.mark.parametrize(
    "declared, file_size, orientation, frame, upright",
    [
        ((300, 400), (400, 300), 6, "auto", True),  # the upright size: drawn as shown
        ((400, 300), (400, 300), 6, "auto", False),  # the stored size: drawn as stored
        ((400, 300), (400, 300), 1, "auto", False),  # nothing turns: one frame
        ((400, 300), (400, 300), 3, "upright", True),
        ((400, 300), (400, 300), 3, "stored", False),
        (None, (400, 300), 6, "auto", False),  # an input list's boxes: as stored
        (None, (400, 300), 6, "upright", True),
    ],
)
def test_the_frame_of_a_turned_images_boxes_is_told_by_its_size_or_by_the_flag(
    declared, file_size, orientation, frame, upright
):
    from beam_jobs.imaging.annotate import drawn_upright  # pylint: disable=import-outside-toplevel

    assert drawn_upright(declared, file_size=file_size, orientation=orientation, frame=frame) is upright


@pytest.mark.parametrize(
    "declared, file_size, orientation, frame, message",
    [
        ((400, 300), (400, 300), 3, "auto", "EXIF orientation 3 turns it within its own size"),
        ((320, 320), (320, 320), 8, "auto", "--annotation_frame upright"),
        ((300, 400), (400, 300), 6, "stored", "--annotation_frame stored reads them"),
        ((10, 10), (400, 300), 1, "auto", "are they of another image"),
    ],
    ids=["mirror-or-180", "square-90", "forced-frame-misfits", "another-size"],
)
def test_a_frame_that_the_sizes_cannot_tell_or_that_misfits_refuses_the_image(
    declared, file_size, orientation, frame, message
):
    from beam_jobs.imaging.annotate import drawn_upright  # pylint: disable=import-outside-toplevel

    with pytest.raises(BadInputError, match=message):
        drawn_upright(declared, file_size=file_size, orientation=orientation, frame=frame)


def _upright_box(image: PastedImage, box: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """A stored-frame box as drawn on the image as shown, found by Pillow turning a mask of it
    (independent of the job's own geometry)."""
    from PIL import Image, ImageOps  # pylint: disable=import-outside-toplevel

    mask = Image.new("L", image.size, 0)
    mask.paste(255, box)
    exif = Image.Exif()
    exif[0x0112] = image.orientation
    mask.info["exif"] = exif.tobytes()
    mask.getexif()[0x0112] = image.orientation
    return ImageOps.exif_transpose(mask).getbbox()


def test_boxes_drawn_on_the_image_as_shown_store_what_boxes_drawn_as_stored_store(pasted, tmp_path):
    """Orientations 3 (a 180-degree turn) and 8 on a square image keep the file's size: by default
    such an image is refused naming the flag, never read in a guessed frame; with the flag, the
    same objects drawn in either frame give the same records."""
    root, images = pasted
    assert {3, 8} <= {i.orientation for i in images}
    stored_path = write_coco(root, images)
    coco = json.loads(stored_path.read_text())
    ambiguous = {
        n for n, i in enumerate(images, start=1) if i.orientation != 1 and i.upright_size == i.size and i.objects
    }
    assert ambiguous, "the pasted images hold an orientation 3 image or a turned square one"
    out = tmp_path / "auto"
    info = beam_jobs.convert(str(root), coco_annotations=str(stored_path), output_dir=str(out), max_bad_fraction=0.9)
    letters = dead_letters(out)
    assert len(letters) == len(ambiguous) and all("--annotation_frame" in d["detail"] for d in letters), letters
    assert info["splits"]["train"]["num_examples"] == len(images) - len(ambiguous)
    # The same objects drawn on the images as shown, their sizes as shown.
    for image_entry, image in zip(coco["images"], images, strict=True):
        image_entry["width"], image_entry["height"] = image.upright_size
    for annotation in coco["annotations"]:
        image = images[annotation["image_id"] - 1]
        x, y, w, h = annotation["bbox"]
        x0, y0, x1, y1 = _upright_box(image, (x, y, x + w, y + h))
        annotation["bbox"] = [x0, y0, x1 - x0, y1 - y0]
    upright_path = tmp_path / "upright.json"
    upright_path.write_text(json.dumps(coco))
    options = dict(input=str(root), image_size=96)
    beam_jobs.convert(
        coco_annotations=str(stored_path), annotation_frame="stored", output_dir=str(tmp_path / "s"), **options
    )
    beam_jobs.convert(
        coco_annotations=str(upright_path), annotation_frame="upright", output_dir=str(tmp_path / "u"), **options
    )
    assert _shard_bytes(tmp_path / "s") == _shard_bytes(tmp_path / "u")


def _shard_bytes(out: pathlib.Path) -> dict[str, bytes]:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    records = {}
    for path in shard_paths(out):
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            example = tf.train.Example.FromString(record)
            features = example.features.feature
            boxes = [
                list(features[f"image/object/bbox/{s}"].float_list.value) for s in ("xmin", "ymin", "xmax", "ymax")
            ]
            records[features["image/filename"].bytes_list.value[0].decode()] = (
                features["image/encoded"].bytes_list.value[0],
                [[round(v, 4) for v in side] for side in boxes],
            )
    assert records
    return records


def _rle_mask(rle: dict) -> None:
    _mask(rle, (4, 3))


@pytest.mark.parametrize(
    "rle, message",
    [
        ({"size": [3, 4], "counts": [2, 3]}, "runs adding up to 5 pixels, not the 12"),
        ({"size": [3, 4], "counts": [2, 30]}, "runs adding up to 32 pixels"),
        ({"size": [3, 4], "counts": [14, -2]}, "holding a negative run"),
        ({"size": [3, 4], "counts": None}, "unreadable"),
        ({"size": [3, 4]}, "a list of polygons or an RLE"),
        ({"size": [3, 4], "counts": "2"}, "runs adding up to 2 pixels"),  # compressed, too short
        ({"size": [3, 4], "counts": "~~~~~~~~"}, "unreadable"),  # not COCO's alphabet
        ({"size": [3, 4], "counts": "\x7f"}, "unreadable"),
        ({"size": [4, 3], "counts": [12]}, "its RLE is 3x4, the image 4x3"),
        ({"counts": [12]}, "needs its size"),
    ],
    ids=[
        "short",
        "long",
        "negative",
        "null-counts",
        "no-counts",
        "compressed-short",
        "garbage",
        "control",
        "other-size",
        "no-size",
    ],
)
def test_an_rle_that_does_not_cover_its_image_exactly_is_refused_before_it_is_decoded(rle, message):
    with pytest.raises(BadInputError, match=message):
        _rle_mask(rle)


def test_a_well_formed_rle_decodes_to_its_pixels():
    from pycocotools import mask as coco_mask  # pylint: disable=import-outside-toplevel

    bitmap = np.asfortranarray(np.array([[0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 1]], np.uint8))
    encoded = coco_mask.encode(bitmap)
    for counts in (encoded["counts"].decode(), [1, 1, 1, 2, 1, 1, 4, 1]):
        placed = _mask({"size": [3, 4], "counts": counts}, (4, 3))
        assert (placed == bitmap).all(), (counts, placed)


def test_a_boolean_category_id_is_not_taken_for_category_1():
    (letter,) = _inputs([{"id": 5, "image_id": 1, "category_id": True, "bbox": [1, 1, 5, 5], "iscrowd": 0}])
    assert "category_id True is not in categories" in letter.detail


def test_annotations_sharing_an_id_are_stored_in_one_order_whatever_the_join_gave():
    first = {"id": 5, "image_id": 1, "category_id": 1, "bbox": [1, 1, 5, 5], "iscrowd": 0}
    second = {"id": 5, "image_id": 1, "category_id": 1, "bbox": [20, 20, 5, 5], "iscrowd": 0}
    unnamed = {"image_id": 1, "category_id": 1, "bbox": [9, 9, 5, 5], "iscrowd": 0}
    one = _inputs([first, second, unnamed, dict(unnamed, bbox=[3, 3, 2, 2])])[0].annotations.objects
    other = _inputs([dict(unnamed, bbox=[3, 3, 2, 2]), unnamed, second, first])[0].annotations.objects
    assert one == other and len(one) == 4


def test_the_reader_yields_each_boxs_crowd_flag(pasted, tmp_path):
    import tfdata_readers as tfr  # pylint: disable=import-outside-toplevel

    root, images = pasted
    coco_path = write_coco(root, images)
    coco = json.loads(coco_path.read_text())
    crowd_ids = {a["id"] for a in coco["annotations"][::2]}
    for annotation in coco["annotations"]:
        annotation["iscrowd"] = int(annotation["id"] in crowd_ids)
    coco_path.write_text(json.dumps(coco))
    out = tmp_path / "out"
    beam_jobs.convert(
        str(root), coco_annotations=str(coco_path), annotation_frame="stored", output_dir=str(out), resize_mode="keep"
    )
    want = {}
    for record in _records_of(out):
        want[record["image/filename"]] = record["image/object/is_crowd"]
    seen = 0
    dataset = tfr.make_dataset(out, "train", 2, image_size=64, max_boxes=4, with_metadata=True)
    for _, targets, metadata in dataset:
        assert targets["is_crowd"].dtype == bool and targets["is_crowd"].shape[1] == 4
        for name, crowd, classes in zip(
            metadata["filename"].numpy(), targets["is_crowd"].numpy(), targets["classes"].numpy(), strict=True
        ):
            stored = want[name.decode()]
            assert list(crowd[: len(stored)]) == [bool(v) for v in stored[:4]] and not crowd[len(stored) :].any()
            assert (classes[len(stored) :] == -1).all()
            seen += 1
    assert seen == len(images) and any(any(v) for v in want.values())


def _records_of(out: pathlib.Path) -> list[dict]:
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    found = []
    for path in shard_paths(out):
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            features = tf.train.Example.FromString(record).features.feature
            found.append(
                {
                    "image/filename": features["image/filename"].bytes_list.value[0].decode(),
                    "image/object/is_crowd": list(features["image/object/is_crowd"].int64_list.value),
                }
            )
    return found


def test_a_box_wholly_past_the_edge_is_refused_not_counted_as_cut_by_a_crop():
    from beam_jobs.imaging.annotate import check_boxes_inside  # pylint: disable=import-outside-toplevel
    from beam_jobs.records import Annotations, BoxObject  # pylint: disable=import-outside-toplevel

    past = Annotations(objects=(BoxObject("cat", 100.2, 5, 100.8, 9, ref="annotation 3"),))
    with pytest.raises(BadInputError, match="annotation 3.* lies beyond the edge of the image, which is 100x80"):
        check_boxes_inside(past, (100, 80))
    check_boxes_inside(Annotations(objects=(BoxObject("cat", 99.2, 5, 100.8, 9),)), (100, 80))  # overshoots: clipped


def test_coco_masks_asked_of_a_file_without_segmentations_refuses_it(tmp_path):
    from beam_jobs.listing.coco import _keyed_annotations  # pylint: disable=import-outside-toplevel

    path = _coco_file(tmp_path, annotations=[{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 2, 2]}])
    assert len(list(_keyed_annotations(path, masks=False))) == 1
    with pytest.raises(JobError, match="--coco_masks: none of the 1 annotations .* has a segmentation"):
        list(_keyed_annotations(path, masks=True))


def test_a_category_name_no_dataset_can_hold_refuses_the_file_naming_it(tmp_path):
    with pytest.raises(JobError, match="category 3: the label .* contains control characters"):
        _categories(_coco_file(tmp_path, categories=[{"id": 3, "name": "cat\x07"}]))


def test_a_coco_file_that_is_not_json_is_one_line_naming_the_file(tmp_path):
    """The parser's message holds a snippet and a caret on lines of their own: only its verdict
    reaches the error, so the command's last word stays one line and nothing is printed before it."""
    from beam_jobs.listing.coco import _stream  # pylint: disable=import-outside-toplevel

    broken = tmp_path / "nan.json"
    broken.write_text('{"images": [], "annotations": [{"id": 1, "bbox": [10, 10, NaN, 17]}], "categories": []}')
    with pytest.raises(JobError) as refused:
        list(_stream(str(broken), "annotations.item"))
    message = str(refused.value)
    assert message.startswith(f"the COCO file {broken} is not valid JSON: ") and "\n" not in message
