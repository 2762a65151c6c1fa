"""What enters an annotated dataset: one rule for each way a list or a COCO file can say too little
or too much. Each case is one a user's export produced, and each was once stored as an image with
no boxes, or as a dataset that looked whole."""

from __future__ import annotations

import json
import pathlib

import pytest

import beam_jobs
from beam_jobs.errors import BadInputError, JobError
from beam_jobs.imaging.geometry import place
from beam_jobs.imaging.masks import instance_mask
from beam_jobs.listing.coco import _categories, coco_image_input
from beam_jobs.listing.discover import parse_input_list
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
        instance_mask(
            json.dumps(polygons),
            (10, 10),
            upright=True,
            file_size=(10, 10),
            orientation=1,
            decoded_size=(10, 10),
            placement=place((10, 10), (10, 10), "stretch"),
            ref="annotation 7",
        )


def test_a_polygon_of_fewer_than_three_points_adds_no_pixel_and_fails_nothing():
    mask = instance_mask(
        json.dumps([[1, 1, 5, 5]]),
        (10, 10),
        upright=True,
        file_size=(10, 10),
        orientation=1,
        decoded_size=(10, 10),
        placement=place((10, 10), (10, 10), "stretch"),
        ref="annotation 7",
    )
    assert mask.shape == (10, 10) and not mask.any()


def test_coco_ids_written_as_text_still_join_their_image(pasted, tmp_path):
    root, images = pasted
    coco = json.loads(write_coco(root, images).read_text())
    for annotation in coco["annotations"]:
        annotation["image_id"] = str(annotation["image_id"])  # "1" against the image's 1
    path = tmp_path / "text_ids.json"
    path.write_text(json.dumps(coco))
    info = beam_jobs.convert(str(root), coco_annotations=str(path), output_dir=str(tmp_path / "out"), image_size=64)
    split = info["splits"]["train"]
    assert sum(split["object_counts"].values()) + split["objects_cut_by_crop"] == len(coco["annotations"])


def test_a_coco_file_without_an_annotations_array_is_refused(pasted, tmp_path):
    root, images = pasted
    coco = json.loads(write_coco(root, images).read_text())
    coco["annotation"] = coco.pop("annotations")  # misspelt
    path = tmp_path / "misspelt.json"
    path.write_text(json.dumps(coco))
    with pytest.raises(Exception, match="has no annotations"):  # the runner's error, holding the job's
        beam_jobs.convert(str(root), coco_annotations=str(path), output_dir=str(tmp_path / "out"), image_size=64)
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def test_an_image_size_with_keep_is_refused_as_it_would_be_ignored(pasted, tmp_path):
    root, images = pasted
    with pytest.raises(beam_jobs.UsageError, match="--image_size does not apply with --resize_mode keep"):
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
    with pytest.raises(Exception, match=r"1 input of version 2 changed \(content, label, annotations or split\)"):
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
