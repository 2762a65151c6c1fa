"""Tests of make_dataset on one device: shapes, exactly-once, shuffling, seeding, augmentation, options."""

from __future__ import annotations

import collections
import io
import pathlib

import numpy as np
import pytest
import reader_fixtures
import tensorflow as tf
from PIL import Image

import tfdata_readers


def _epoch(
    dataset: tf.data.Dataset, dtype: tf.DType = tf.float32
) -> tuple[list[str], dict[str, np.ndarray], list[int]]:
    """(keys in order, {key: image}, batch sizes) of one pass over a with_metadata dataset."""
    keys, images, sizes = [], {}, []
    for image, label, meta in dataset:
        sizes.append(int(image.shape[0]))
        assert label.dtype == tf.int64 and image.dtype == dtype
        for key, pixels in zip(meta["key"].numpy(), image.numpy(), strict=True):
            keys.append(key.decode())
            images[key.decode()] = pixels
    return keys, images, sizes


def _records_by_key(data_dir: pathlib.Path, split: str) -> dict[str, tf.train.Example]:
    info = tfdata_readers.load_manifest(data_dir)
    out = {}
    for shard in info.split(split).shards:
        for record in tf.data.TFRecordDataset(shard.path):
            example = tf.train.Example.FromString(record.numpy())
            out[example.features.feature["image/key/sha256"].bytes_list.value[0].decode()] = example
    return out


@pytest.mark.parametrize("encoding", ["jpeg", "png", "raw"])
@pytest.mark.parametrize("placement", ["element", "batch"])
@pytest.mark.parametrize("training", [False, True])
def test_batches_have_the_promised_types(datasets, encoding: str, placement: str, training: bool) -> None:
    ds = tfdata_readers.make_dataset(
        datasets[encoding], "train", 8, training=training, seed=0, with_metadata=True, decode_placement=placement
    )
    image, label, meta = next(iter(ds))
    assert image.shape == (8, 32, 32, 3) and image.dtype == tf.float32
    assert label.shape == (8,) and label.dtype == tf.int64
    assert 0.0 <= float(tf.reduce_min(image)) and float(tf.reduce_max(image)) <= 1.0
    assert float(tf.reduce_max(image)) > 0.5  # real photos, not zeros
    assert set(meta) >= {"filename", "key"}
    assert all(len(k) == 64 for k in meta["key"].numpy())
    names = reader_fixtures.LABEL_NAMES
    for lab, text in zip(label.numpy(), meta["label_text"].numpy(), strict=True):
        assert names[lab] == text.decode()


@pytest.mark.parametrize("encoding", ["jpeg", "png", "raw"])
@pytest.mark.parametrize("split, batch", [("train", 8), ("train", 50), ("validation", 4), ("validation", 20)])
def test_eval_sees_every_example_exactly_once(datasets, encoding: str, split: str, batch: int) -> None:
    expected = reader_fixtures.expected_keys(datasets[encoding], split)
    keys, _, sizes = _epoch(tfdata_readers.make_dataset(datasets[encoding], split, batch, with_metadata=True))
    assert sorted(keys) == sorted(expected)
    # One partial batch at most; without `deterministic` it may arrive before the full ones.
    assert sum(size != batch for size in sizes) <= 1 and max(sizes) <= batch


@pytest.mark.parametrize("encoding", ["png", "raw", "jpeg"])
@pytest.mark.parametrize("placement", ["element", "batch"])
def test_eval_pixels_match_the_stored_image(datasets, encoding: str, placement: str) -> None:
    data_dir = datasets[encoding]
    records = _records_by_key(data_dir, "validation")
    _, images, _ = _epoch(
        tfdata_readers.make_dataset(data_dir, "validation", 5, with_metadata=True, decode_placement=placement)
    )
    for key, image in images.items():
        encoded = records[key].features.feature["image/encoded"].bytes_list.value[0]
        if encoding == "raw":
            want = np.frombuffer(encoded, np.uint8).reshape(32, 32, 3)
        else:
            want = np.asarray(Image.open(io.BytesIO(encoded)).convert("RGB"))
        # JPEG too: the reader decodes with Pillow's IDCT, so Pillow's pixels exactly.
        np.testing.assert_allclose(image * 255.0, want, atol=1e-3)


def test_eval_has_no_randomness_and_deterministic_order(jpeg_dir) -> None:
    def run():
        return _epoch(tfdata_readers.make_dataset(jpeg_dir, "train", 8, with_metadata=True, deterministic=True))

    keys1, images1, _ = run()
    keys2, images2, _ = run()
    assert keys1 == keys2
    for key in keys1:
        np.testing.assert_array_equal(images1[key], images2[key])


def test_training_drops_at_most_batch_minus_one_and_never_duplicates(jpeg_dir) -> None:
    expected = set(reader_fixtures.expected_keys(jpeg_dir, "train"))
    ds = tfdata_readers.make_dataset(jpeg_dir, "train", 8, training=True, seed=1, with_metadata=True)
    for _ in range(2):  # two epochs
        keys, _, sizes = _epoch(ds)
        assert len(keys) == len(set(keys)) and set(keys) <= expected
        assert len(expected) - len(keys) <= 7
        assert sizes == [8] * 6  # drop_remainder defaults to on when training


def test_training_order_changes_between_epochs(jpeg_dir) -> None:
    ds = tfdata_readers.make_dataset(
        jpeg_dir, "train", 8, training=True, seed=1, with_metadata=True, drop_remainder=False
    )
    epoch1, _, _ = _epoch(ds)
    epoch2, _, _ = _epoch(ds)
    expected = sorted(reader_fixtures.expected_keys(jpeg_dir, "train"))
    assert sorted(epoch1) == expected and sorted(epoch2) == expected
    assert epoch1 != epoch2


def test_training_is_reproducible_from_the_seed(jpeg_dir) -> None:
    def run(seed):
        ds = tfdata_readers.make_dataset(
            jpeg_dir, "train", 8, training=True, seed=seed, with_metadata=True, deterministic=True
        )
        return _epoch(ds)[:2]

    keys_a, images_a = run(5)
    keys_b, images_b = run(5)
    keys_c, _ = run(6)
    assert keys_a == keys_b
    for key in keys_a:
        np.testing.assert_array_equal(images_a[key], images_b[key])
    assert keys_a != keys_c


@pytest.mark.parametrize("encoding, placement", [("jpeg", "auto"), ("raw", "batch")])
def test_seeded_training_is_reproducible_under_the_default_config(datasets, encoding: str, placement: str) -> None:
    """No `deterministic=True`: a seed alone reproduces order, batches, the dropped remainder and crops."""

    def run():
        ds = tfdata_readers.make_dataset(
            datasets[encoding],
            "train",
            8,
            training=True,
            seed=0,
            with_metadata=True,
            decode_placement=placement,
        )
        return [_epoch(ds)[:2] for _ in range(2)]

    first, second = run(), run()
    for (keys_a, images_a), (keys_b, images_b) in zip(first, second, strict=True):
        assert keys_a == keys_b
        for key in keys_a:
            np.testing.assert_array_equal(images_a[key], images_b[key])
    assert first[0][0] != first[1][0]  # still a new order every epoch


@pytest.mark.parametrize("encoding, placement", [("jpeg", "element"), ("jpeg", "batch"), ("raw", "batch")])
def test_an_examples_crop_depends_on_its_key_not_its_position(datasets, encoding: str, placement: str) -> None:
    """The same seed and epoch give an example the same crop and flip whatever the batch size, the
    order the records arrive in, or how many input pipelines share the data."""
    data_dir = datasets[encoding]
    options = dict(training=True, seed=7, with_metadata=True, drop_remainder=False, decode_placement=placement)

    def epochs(batch: int, pipelines: int = 1, **extra) -> list[dict[str, np.ndarray]]:
        out = [{}, {}]
        for pipeline_id in range(pipelines):
            context = tf.distribute.InputContext(pipelines, pipeline_id, pipelines) if pipelines > 1 else None
            ds = tfdata_readers.make_dataset(data_dir, "train", batch, input_context=context, **options, **extra)
            for number in range(2):
                out[number].update(_epoch(ds)[1])
        return out

    reference = epochs(8)
    for other in (epochs(5, deterministic=False), epochs(3, pipelines=2, shuffle_buffer_size=7)):
        for number in range(2):
            assert sorted(other[number]) == sorted(reference[number])
            for key, image in reference[number].items():
                np.testing.assert_allclose(other[number][key], image, atol=1e-6, err_msg=f"epoch {number + 1} {key}")
    redrawn = [k for k in reference[0] if not np.allclose(reference[0][k], reference[1][k])]
    assert len(redrawn) > 40  # and a new crop every epoch


@pytest.mark.parametrize("encoding", ["jpeg", "raw"])
def test_training_augments_and_eval_does_not(datasets, encoding: str) -> None:
    data_dir = datasets[encoding]
    _, plain, _ = _epoch(tfdata_readers.make_dataset(data_dir, "train", 10, with_metadata=True))
    ds = tfdata_readers.make_dataset(
        data_dir, "train", 10, training=True, seed=3, with_metadata=True, drop_remainder=False
    )
    _, aug1, _ = _epoch(ds)
    _, aug2, _ = _epoch(ds)
    changed = [k for k in plain if not np.allclose(plain[k], aug1[k], atol=0.02)]
    assert len(changed) > 40  # random resized crops almost never keep the whole image unflipped
    redrawn = [k for k in aug1 if not np.allclose(aug1[k], aug2[k])]
    assert len(redrawn) > 40  # a new crop every epoch


def test_flip_only_augmentation_is_a_mirror(datasets) -> None:
    """With the crop pinned to the whole image, training images are the eval images or their mirror."""
    data_dir = datasets["raw"]
    _, plain, _ = _epoch(tfdata_readers.make_dataset(data_dir, "train", 10, with_metadata=True))
    for placement in ("element", "batch"):
        _, aug, _ = _epoch(
            tfdata_readers.make_dataset(
                data_dir,
                "train",
                10,
                training=True,
                seed=0,
                with_metadata=True,
                drop_remainder=False,
                crop_area_range=(1.0, 1.0),
                crop_aspect_ratio_range=(1.0, 1.0),
                decode_placement=placement,
            )
        )
        flips = collections.Counter()
        for key, image in aug.items():
            same = np.allclose(image, plain[key], atol=1e-5)
            mirrored = np.allclose(image, plain[key][:, ::-1], atol=1e-5)
            assert same or mirrored, key
            flips[mirrored] += 1
        assert flips[True] > 10 and flips[False] > 10


def test_scale_and_image_size_options(jpeg_dir) -> None:
    image, _ = next(iter(tfdata_readers.make_dataset(jpeg_dir, "train", 4, scale=None)))
    assert 200.0 < float(tf.reduce_max(image)) <= 255.0
    for training in (False, True):
        image, _ = next(
            iter(tfdata_readers.make_dataset(jpeg_dir, "train", 4, image_size=(24, 20), training=training, seed=0))
        )
        assert image.shape == (4, 24, 20, 3)


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_uint8_output_is_the_float_output_unscaled(jpeg_dir, training: bool) -> None:
    """dtype="uint8" gives the same pixels as float32, times 255: exactly when nothing is resized,
    rounded to the nearest value when it is (training crops, image_size)."""
    options = dict(training=training, seed=3, with_metadata=True, deterministic=True, drop_remainder=False)
    if training:
        options["image_size"] = (20, 24)
    _, floats, _ = _epoch(tfdata_readers.make_dataset(jpeg_dir, "train", 5, **options))
    _, ints, _ = _epoch(tfdata_readers.make_dataset(jpeg_dir, "train", 5, dtype="uint8", **options), tf.uint8)
    assert sorted(ints) == sorted(floats)
    for key, image in ints.items():
        assert image.dtype == np.uint8
        scaled = floats[key] * 255.0
        if training:
            assert np.abs(image.astype(np.float32) - scaled).max() <= 0.5 + 1e-3, key
        else:
            assert np.array_equal(image, np.round(scaled).astype(np.uint8)), key


def test_cache_and_num_epochs(jpeg_dir) -> None:
    expected = sorted(reader_fixtures.expected_keys(jpeg_dir, "train"))
    cached = tfdata_readers.make_dataset(jpeg_dir, "train", 8, with_metadata=True, cache=True)
    assert sorted(_epoch(cached)[0]) == expected
    assert sorted(_epoch(cached)[0]) == expected
    twice = tfdata_readers.make_dataset(jpeg_dir, "train", 8, with_metadata=True, num_epochs=2)
    assert sorted(_epoch(twice)[0]) == sorted(expected * 2)


@pytest.fixture(scope="module")
def shard_count_dirs(tmp_path_factory) -> dict[int, pathlib.Path]:
    root = tmp_path_factory.mktemp("shard_counts")
    return {
        n: reader_fixtures.write_dataset(root / f"s{n}", splits={"train": (23, n)}, image_size=(16, 16), seed=n)
        for n in (1, 2, 3, 5, 8, 11)
    }


@pytest.mark.parametrize(
    "pipelines, shards",
    [(2, 1), (3, 2), (8, 5), (2, 2), (3, 3), (8, 8), (2, 5), (3, 5), (8, 11)],
)
@pytest.mark.parametrize("training", [False, True])
def test_input_pipelines_split_the_data_exactly_once(
    shard_count_dirs, pipelines: int, shards: int, training: bool
) -> None:
    """Fewer, as many or more files than pipelines: the shares partition the split and differ by at
    most one example (whole files dealt out would give 3 files to 2 pipelines as 2:1)."""
    data_dir = shard_count_dirs[shards]
    expected = sorted(reader_fixtures.expected_keys(data_dir, "train"))
    seen, counts = [], []
    for pipeline_id in range(pipelines):
        context = tf.distribute.InputContext(
            num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=pipelines
        )
        ds = tfdata_readers.make_dataset(
            data_dir,
            "train",
            2,
            input_context=context,
            with_metadata=True,
            training=training,
            seed=11,
            drop_remainder=False,
        )
        keys = _epoch(ds)[0]
        seen += keys
        counts.append(len(keys))
    assert sorted(seen) == expected
    assert max(counts) - min(counts) <= 1, counts
