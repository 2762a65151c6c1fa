"""`make_dataset`: manifest -> files -> interleave -> shuffle -> batch -> parse -> decode -> prefetch."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
from typing import Any, cast

import tensorflow as tf

from tfdata_readers.config import MAX_SEED, ReadConfig, check_batch_size, check_seed
from tfdata_readers.decoding import augment
from tfdata_readers.decoding.annotated import annotated_element
from tfdata_readers.decoding.decode import to_output
from tfdata_readers.decoding.parse import METADATA_KEYS, feature_spec, list_feature_spec, parse_batch
from tfdata_readers.decoding.targets import TARGET_NAMES, annotation_targets, stored_boxes
from tfdata_readers.decoding.targets import list_keys as _list_keys
from tfdata_readers.service import reading as service_reading
from tfdata_readers.sources import storage
from tfdata_readers.sources.cached_reading import CachedShards, shared_cache
from tfdata_readers.sources.files import check_no_unlisted_shards, check_shards, old_version_note, share_for_pipeline
from tfdata_readers.sources.manifest import MANIFEST_NAME, DatasetInfo, ImageInfo, current_version, load_manifest
from tfdata_readers.sources.records import read_shard

__all__ = ["make_dataset"]

# Measured with benchmarks/reader.py on 2 cores, 224x224 JPEG, batch 32, each figure the median of
# several fresh processes: eval decode per batch (map_fn inside one parallel map) beat per element
# (a parallel map between unbatch and batch): 2951 vs 2673 and 2914 vs 2754 img/s. RAW eval decodes
# a whole batch in one vectorised op (4269 vs 3961 img/s). Training crops have per-image sizes, and
# per-element crop+resize beat a batched crop_and_resize (830 vs 250 img/s on RAW).
_AUTO_PLACEMENT = {
    ("JPEG", False): "batch",
    ("PNG", False): "batch",
    ("RAW", False): "batch",
    ("JPEG", True): "element",
    ("PNG", True): "element",
    ("RAW", True): "element",
}
_MAX_AUTO_CYCLE_LENGTH = 16
# The feature that seeds each training example's augmentation.
_AUGMENT_KEY = "image/key/sha256"
_HEIGHT, _WIDTH = "image/height", "image/width"
_MASK_KEY = "image/segmentation/class/encoded"
_INSTANCE_KEY = "image/object/mask"


def _global_batch(batch_size: int, input_context: tf.distribute.InputContext | None) -> int:
    return batch_size * input_context.num_replicas_in_sync if input_context else batch_size


def _batches_per_epoch(
    num_examples: int, batch_size: int, input_context: tf.distribute.InputContext | None, drop_remainder: bool
) -> int | None:
    """Batches every pipeline yields per epoch when dropping the remainder; None: all it reads.

    Under tf.distribute (any `input_context`, one pipeline or several) each pipeline yields exactly
    `steps_per_epoch(global batch) x replicas it feeds` batches, the same for all. The strategy
    deals a pipeline's consecutive batches to its replicas, so a global step is made of that many
    consecutive batches: with one more batch (a pipeline feeding 2 replicas holds 3 full batches
    of 60 examples at 16 a replica) the epoch's last global step would join this epoch's last
    batch with the next epoch's first, and with `num_epochs=None` hold the same example twice.
    Every pipeline holds at least that many full batches, because the shares differ by at most
    one record and the split holds that many full global batches. A pipeline whose share is one
    record longer drops one more record per epoch (a different one each epoch, after the
    shuffle). Without `drop_remainder` the count is None: evaluation reads everything, and the
    last batches may be partial or empty.
    """
    if not drop_remainder:
        return None
    global_batch = _global_batch(batch_size, input_context)
    steps = num_examples // global_batch
    if not input_context:
        return 0 if steps == 0 else None  # 0: the caller refuses a split smaller than one global batch
    return steps * _replicas_per_pipeline(input_context)


def _require_records(records: tf.data.Dataset, needed: int, message: str) -> tf.data.Dataset:
    """`records` ((serialized, name) pairs), failing with `message` at their end if there were fewer
    than `needed`. Only used with `skip_corrupt` under tf.distribute, where a pipeline that lost more
    records than its share can spare would yield fewer batches than the others."""
    end = tf.data.Dataset.from_tensors((tf.constant(""), tf.constant(""), tf.constant(True)))
    marked = records.map(lambda serialized, name: (serialized, name, tf.constant(False))).concatenate(end)

    def count(read: tf.Tensor, element: tuple[tf.Tensor, tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, Any]:
        serialized, name, is_end = element
        ok = tf.logical_or(tf.logical_not(is_end), read >= needed)
        checked = tf.debugging.Assert(ok, [message, read], summarize=1)
        with tf.control_dependencies([checked]):
            return read + tf.cast(tf.logical_not(is_end), tf.int64), (tf.identity(serialized), name, is_end)

    return (
        marked.scan(tf.constant(0, tf.int64), count)
        .filter(lambda serialized, name, is_end: tf.logical_not(is_end))
        .map(lambda serialized, name, is_end: (serialized, name))
    )


def _placement(config: ReadConfig, image: ImageInfo, training: bool) -> str:
    if config.decode_placement != "auto":
        return config.decode_placement
    return _AUTO_PLACEMENT[image.format, training]


def _service_sharding(config: ReadConfig, training: bool) -> str:
    """ "static" or "dynamic": how the service's workers split the pieces; refuses what cannot hold."""
    sharding = config.data_service_sharding
    if sharding == "auto":
        sharding = "dynamic" if training else "static"
    if training and sharding == "static":
        raise ValueError(
            "data_service_sharding='static' is for evaluation: in training each worker would repeat its own "
            "part at its own speed, so examples would be seen at different rates; use 'dynamic' (or 'auto')"
        )
    if training and config.num_epochs is not None:
        raise ValueError(
            f"training through the tf.data service needs num_epochs=None (got {config.num_epochs!r}): its "
            f"workers each drop their own last partial batch, so a finite pass ends after a number of batches "
            f"nobody knows in advance, and every new iteration is a new job that restarts the shuffle and "
            f"augmentation seeds; stream with num_epochs=None and give model.fit steps_per_epoch=steps_per_epoch(...)"
        )
    return sharding


def _static_or_fallback(
    config: ReadConfig, sharding: str, num_pieces: int, num_workers: int, split: str, data_dir: str
) -> str:
    """`sharding`, or "dynamic" when static sharding cannot deal every service worker a piece.

    Static (FILE) sharding needs at least one shard piece per worker; with fewer TensorFlow fails
    mid-read ("Could not apply FILE based sharding"). Dynamic sharding also delivers every example
    exactly once while no worker fails, and the end-of-epoch count still catches a lost worker, so
    "auto" falls back to it; an explicit "static" is refused, naming the fixes.
    """
    if sharding != "static" or num_pieces >= num_workers:
        return sharding
    if config.data_service_sharding == "auto":
        logging.getLogger(__name__).info(
            "split %r of %s: %d shard piece(s) for %d tf.data service workers, too few for static "
            "sharding; reading with dynamic sharding (also exactly once, and counted)",
            split,
            data_dir,
            num_pieces,
            num_workers,
        )
        return "dynamic"
    raise ValueError(
        f"data_service_sharding='static' needs at least one shard piece per tf.data service worker: split "
        f"{split!r} of {data_dir} gives this input pipeline {num_pieces}, and the dispatcher at "
        f"{config.data_service} has {num_workers} workers; use data_service_sharding='auto' or 'dynamic', "
        f"convert with more shards (--num_shards), or start fewer workers"
    )


def check_initial_epoch(initial_epoch: object) -> int:
    """`initial_epoch` if it is an int (not a bool) >= 0; else a ValueError naming it."""
    if not isinstance(initial_epoch, int) or isinstance(initial_epoch, bool) or initial_epoch < 0:
        raise ValueError(f"initial_epoch must be an int >= 0 (got {initial_epoch!r})")
    return initial_epoch


# ReadConfig fields that change how fast or where a reader reads, never what it yields.
_NOT_IN_IDENTITY = frozenset(
    {
        "cache_dir",
        "cache_limit_bytes",
        "cache_lookahead",
        "s3_endpoint_url",
        "s3_profile",
        "prefetch",
        "num_parallel_calls",
        "num_parallel_reads",
        "read_buffer_size",
        "data_service_timeout_s",
    }
)


def reader_identity(identity: dict[str, Any], config: ReadConfig) -> str:
    """What makes one reader's stream of batches (data, version, split, batch, seed, the ReadConfig
    fields that change what it yields), as one line of JSON."""
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in _NOT_IN_IDENTITY}
    return json.dumps({**identity, "config": fields}, sort_keys=True, default=repr)


def _refusing_other_readers_checkpoints(dataset: tf.data.Dataset, identity: str) -> tf.data.Dataset:
    """`dataset`, failing loudly if its iterator is restored from another reader's checkpoint.

    An iterator checkpoint holds positions and buffers, not what they index: restored into a reader
    built with another seed, batch size or dataset version, it would go on from the same positions
    in another order, silently. So a `scan` carries the identity of the reader that made the
    iterator: a checkpoint keeps the scan's state, and the next batch compares it with this reader's.
    It is the pipeline's last step, after the prefetch, so that the batches a checkpoint's prefetch
    buffer holds are checked too: the very first batch after such a restore fails, before a loop
    trains a step on it.
    """

    def check(saved: tf.Tensor, *element: Any) -> tuple[tf.Tensor, Any]:
        same = tf.debugging.Assert(
            tf.equal(saved, identity),
            [
                "tfdata_readers: this iterator was restored from a checkpoint saved by a reader built differently; "
                "build make_dataset as the run that saved it did (pass version= the version it read). Saved by:",
                saved,
                "This reader:",
                tf.constant(identity),
            ],
            summarize=-1,
        )
        with tf.control_dependencies([same]):
            checked = tf.nest.map_structure(tf.identity, element)
        return saved, checked if len(checked) > 1 else checked[0]

    return dataset.scan(tf.constant(identity), check)


def check_initial_step(initial_step: object, *, training: bool, num_epochs: int | None, service: str | None) -> int:
    """`initial_step` if it is an int (not a bool) >= 0 that this reader can resume at; else a ValueError."""
    if not isinstance(initial_step, int) or isinstance(initial_step, bool) or initial_step < 0:
        raise ValueError(f"initial_step must be an int >= 0 (got {initial_step!r})")
    if initial_step and service:
        raise ValueError(
            "initial_step cannot be used with data_service: the service's workers read ahead of the trainer and "
            "its jobs restart their passes, so a position in the epoch is not theirs to resume"
        )
    if initial_step and training and num_epochs is not None:
        raise ValueError(
            f"initial_step in training needs num_epochs=None (got {num_epochs!r}): it resumes the one stream of "
            f"epochs such an iterator yields. With num_epochs=N each new iteration is the next N epochs, and "
            f"only the first would start mid-epoch"
        )
    return initial_step


def _replicas_per_pipeline(input_context: tf.distribute.InputContext | None) -> int:
    """How many consecutive batches of one pipeline make one global step."""
    if not input_context:
        return 1
    return max(1, input_context.num_replicas_in_sync // input_context.num_input_pipelines)


def class_weight_table(pairs: tuple[tuple[int, float], ...] | None, info: DatasetInfo) -> tf.Tensor | None:
    """float32 [num_classes] weights (1.0 where not given, as Keras's `class_weight`), None without any."""
    if pairs is None:
        return None
    table = [1.0] * info.num_classes
    for label, weight in pairs:
        if label >= info.num_classes:
            raise ValueError(
                f"ReadConfig.class_weights gives label id {label!r}, but {info.manifest_path} "
                f"has {info.num_classes} classes (ids 0 to {info.num_classes - 1}: {list(info.label_names)})"
            )
        table[label] = weight
    return tf.constant(table, tf.float32)


# Which of a pass's shuffles a seed is for.
_PIECES, _RECORDS = 0, 1


def _pass_seed(local_seed: int, epoch: tf.Tensor | int, which: int) -> tf.Tensor:
    """An int64 shuffle seed, a pure function of (the pipeline's seed, the epoch, which shuffle).

    Deriving every pass's seeds from its epoch number (rather than drawing them from a seed
    generator, one draw per pass) is what lets a run resumed at epoch k reproduce epoch k.
    """
    key = tf.stack([tf.constant(local_seed, tf.int64), tf.cast(epoch, tf.int64) * 2 + which])
    drawn = tf.random.stateless_uniform([], seed=key, minval=None, maxval=None, dtype=tf.int64)
    return tf.bitwise.bitwise_and(drawn, tf.constant(MAX_SEED - 1, tf.int64))


# The seed pair Dataset.shuffle gives its kernel for an op seed s when no global seed is set:
# (DEFAULT_GRAPH_SEED, s mod 2**31 - 1), in tensorflow/python/framework/random_seed.py.
_GRAPH_SEED = 87654321
_MAXINT32 = 2**31 - 1


def _seeded_shuffle(dataset: tf.data.Dataset, buffer_size: int, seed: tf.Tensor) -> tf.data.Dataset:
    """``dataset.shuffle(buffer_size, seed, reshuffle_each_iteration=False)`` as it orders in a
    process with no global seed, whatever the process's global seed is.

    ``Dataset.shuffle`` mixes TensorFlow's global seed (``tf.random.set_seed``,
    ``keras.utils.set_random_seed``) into its own: the same ``seed`` of ours would order an epoch
    differently in a trainer that sets another global seed (a resumed one, say), and with a global
    seed of 0 a tensor seed cannot even be built into a dataset (TensorFlow compares it with 0 in
    Python). So the same kernel (``ShuffleDatasetV3``, which ``Dataset.shuffle`` runs) is given the
    seed pair itself: the pair ``Dataset.shuffle`` gives it when no global seed is set, so the
    orders are those of earlier releases for a trainer that set none.
    """
    flat = tf.nest.flatten(dataset.element_spec)
    variant = tf.raw_ops.ShuffleDatasetV3(
        input_dataset=tf.data.experimental.to_variant(dataset),
        buffer_size=tf.constant(buffer_size, tf.int64),
        seed=tf.constant(_GRAPH_SEED, tf.int64),
        seed2=tf.math.floormod(tf.cast(seed, tf.int64), _MAXINT32),
        seed_generator=tf.raw_ops.DummySeedGenerator(),
        output_types=[spec.dtype for spec in flat],
        output_shapes=[spec.shape for spec in flat],
        reshuffle_each_iteration=False,
    )
    return tf.data.experimental.from_variant(variant, dataset.element_spec)


def _augment_seed(base_seed: int, epoch: tf.Tensor) -> tf.Tensor:
    """The [2] int64 seed of epoch `epoch`'s augmentation (with each key, it seeds one example)."""
    key = tf.stack([tf.constant(base_seed, tf.int64), tf.cast(epoch, tf.int64)])
    return tf.random.stateless_uniform([2], seed=key, minval=None, maxval=None, dtype=tf.int64)


def _epoch_numbers(initial_epoch: int, num_epochs: int | None) -> tf.data.Dataset:
    """The epoch number of each pass, from `initial_epoch` on.

    With num_epochs=None one iteration is every epoch (Keras keeps one iterator when given
    steps_per_epoch). With num_epochs=N each new iteration of the same dataset is the next N
    epochs: `model.fit(epochs=k)` iterates once per epoch and must get a new shuffle each time.
    tf.data has no counter that survives from one iterator to the next, so a TensorFlow
    resource holds it: each new iterator reads the number of iterations begun before it and
    adds one (`data_service` training needs num_epochs=None, so this never runs on a service
    worker).

    The resource is a one-entry hash table rather than a `tf.Variable`: a variable made under a
    strategy's scope (where many users build their input) becomes a distributed variable, which a
    tf.data function cannot update. It is not a Python generator (`from_generator`), as it was:
    tf.data's prefetch thread called that generator, which needs the GIL, so a process that
    dropped a reading iterator (after an error, at exit, or on `break`) could deadlock, its main
    thread holding the GIL while it waited for that thread to stop.
    """
    if num_epochs is None:
        return tf.data.Dataset.counter(start=initial_epoch)
    key = tf.constant(0, tf.int64)
    iterations = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)

    def first_epoch_of_iteration(_: tf.Tensor) -> tf.Tensor:
        begun = iterations.lookup(key)
        with tf.control_dependencies([iterations.insert(key, begun + 1)]):
            return initial_epoch + begun * num_epochs

    return (
        tf.data.Dataset.range(1)
        .map(first_epoch_of_iteration)
        .flat_map(lambda first: tf.data.Dataset.range(first, first + num_epochs))
    )


def make_dataset(
    data_dir: str | os.PathLike[str],
    split: str,
    batch_size: int,
    *,
    training: bool = False,
    seed: int | None = None,
    initial_epoch: int = 0,
    initial_step: int = 0,
    input_context: tf.distribute.InputContext | None = None,
    with_metadata: bool = False,
    config: ReadConfig | None = None,
    version: int | None = None,
    **options: Any,
) -> tf.data.Dataset:
    """A dataset of `(image, label)` batches (plus a weight with `class_weights`, then a metadata
    dict with `with_metadata`).

    `image` is float32 [B, H, W, C] (scaled by `config.scale`, [0, 1] by default; uint8 0-255 with
    `dtype="uint8"`), `label` int64 [B], the weight float32 [B].
    Each iteration is one epoch (`num_epochs` of them). With `training`, shard pieces and records
    are shuffled and each example is augmented with stateless ops, all seeded from (`seed`, the
    epoch, and for augmentation the example's key); otherwise there is no randomness, and every
    pass yields the same order. The epochs are numbered from `initial_epoch` (an int >= 0): the
    first pass of the first iteration is that epoch, and each pass after it the next, so a trainer
    resuming at epoch k (Keras `BackupAndRestore`, `fit(initial_epoch=k)`) gets exactly the order,
    shuffles and crops an uninterrupted run had from epoch k on. `initial_step` (an int >= 0) resumes
    within that epoch: the global steps of epoch `initial_epoch` already taken are skipped, by
    reading their records without decoding them, so the batches that follow are exactly those an
    uninterrupted run had next (see docs/reading.md, "Resuming mid-epoch"). See `ReadConfig` for exactly what
    a seed reproduces. `input_context` (from `distribute`) selects this pipeline's share of the
    data: a contiguous range of the split's records, equal to one record across pipelines.
    `options` override fields of `config` (see `ReadConfig`). `batch_size` is a positive int (not a
    bool); `seed` is None or an int (not a bool) with 0 <= seed < 2**63.

    `version` is the dataset version to read: None (default) is the current one (the root
    dataset_info.json), an int N that version's manifest (see `load_manifest`). Either way the
    manifest is read once, here: the dataset holds that version's shard paths, so every epoch of
    every iterator reads the same version, whatever is committed meanwhile (the writer never
    rewrites a committed file, and keeps old versions' files for its retention window).

    `cardinality()` is the true number of batches (per epoch times `num_epochs`; INFINITE with
    `num_epochs=None`), from the manifest, so Keras shows the step total. It is unknown only where
    it cannot be known in advance: with `skip_corrupt` (unless the pipeline is held to a fixed
    count under tf.distribute) and through the tf.data service.

    With `data_service` ("grpc://HOST:PORT"), the same pipeline runs on the tf.data service's
    workers and this dataset only fetches its batches (see `tfdata_readers.service.reading`).
    """
    config = (config or ReadConfig()).with_options(**options)
    with storage.using(s3_options(config)):
        return _make_dataset(
            data_dir,
            split,
            batch_size,
            training=training,
            seed=seed,
            initial_epoch=initial_epoch,
            initial_step=initial_step,
            input_context=input_context,
            with_metadata=with_metadata,
            config=config,
            version=version,
        )


def s3_options(config: ReadConfig) -> storage.S3Options | None:
    """The S3 store `config` names, None where it leaves both to the AWS default chain."""
    if config.s3_endpoint_url is None and config.s3_profile is None:
        return None
    return storage.S3Options(endpoint_url=config.s3_endpoint_url, profile=config.s3_profile)


def _make_dataset(
    data_dir: str | os.PathLike[str],
    split: str,
    batch_size: int,
    *,
    training: bool,
    seed: int | None,
    initial_epoch: int,
    initial_step: int,
    input_context: tf.distribute.InputContext | None,
    with_metadata: bool,
    config: ReadConfig,
    version: int | None,
) -> tf.data.Dataset:
    """`make_dataset` with its options resolved, its S3 store in effect."""
    check_batch_size("batch_size", batch_size)
    check_seed(seed)
    check_initial_epoch(initial_epoch)
    check_initial_step(initial_step, training=training, num_epochs=config.num_epochs, service=config.data_service)
    # The manifest resolves a local data_dir to an absolute path, once: the service's workers open
    # the shard paths in their own working directory, and this process may chdir between passes.
    if storage.is_s3(os.fspath(data_dir)) and config.cache_dir is None:
        raise ValueError(
            f"cannot read {os.fspath(data_dir)} without a cache: TensorFlow has no s3:// filesystem, so its shards "
            "are read through a local cache; give ReadConfig(cache_dir=..., cache_limit_bytes=...)"
        )
    info = load_manifest(data_dir, version)
    data_dir = info.data_dir
    split_info = info.split(split)
    if not split_info.shards:
        raise ValueError(f"split {split!r} of {data_dir} has no shards")
    # ReadConfig normalises a mapping of weights to sorted pairs when it is made.
    weights = class_weight_table(cast("tuple[tuple[int, float], ...] | None", config.class_weights), info)
    task = info.task
    annotated = task != "classification"
    keys = ["image/encoded"] if annotated else ["image/encoded", "image/class/label"]
    if with_metadata:
        # An annotated example's class names are a list: its ids are in the targets.
        keys += [key for name, key in METADATA_KEYS.items() if not (annotated and name == "label_text")]
    elif training:
        keys.append(_AUGMENT_KEY)  # each example's crop and flip are seeded from its key
    if info.image.keeps_size:
        keys += [_HEIGHT, _WIDTH]  # each example's own size: RAW bytes do not say it
    # Fail at start-up, naming the feature or the shard, rather than in the middle of an epoch.
    spec: dict[str, Any] = feature_spec(keys, info.features, where=info.manifest_path)
    semantic = bool(info.raw.get("annotations", {}).get("semantic_masks"))
    instance = task == "detection" and bool(info.raw.get("annotations", {}).get("instance_masks"))
    if annotated:
        list_keys = _list_keys(task, instance_masks=instance)
        spec.update(list_feature_spec(list_keys, info.features, where=info.manifest_path))
    if semantic:
        spec[_MASK_KEY] = tf.io.FixedLenFeature([], tf.string)  # declared with the annotations (verify checks it)
    check_no_unlisted_shards(info, split)
    share = share_for_pipeline(split_info, input_context)
    # Only an older version's manifest (read from versions/) can list files the writer has since deleted.
    from_history = info.manifest_path != os.path.join(data_dir, MANIFEST_NAME)
    note = old_version_note(info, current_version(data_dir)) if from_history else ""
    check_shards(share.shards(split_info), skip_corrupt=config.skip_corrupt, missing_note=note)

    service = config.data_service
    sharding = None
    if service:
        wanted = _service_sharding(config, training)  # refuses what cannot hold, before any connection
        workers = service_reading.check_dispatcher(service, config.data_service_timeout_s)
        sharding = _static_or_fallback(config, wanted, len(share.pieces), len(workers), split, data_dir)
        service_reading.check_workers_see(service, [p.path for p in share.pieces], config.data_service_timeout_s)

    image = info.image
    if image.keeps_size and config.image_size is None:
        raise ValueError(
            f"{info.manifest_path}: the images of this dataset keep their own sizes (converted with "
            f"--resize_mode keep), so a batch needs an output size: give image_size=(height, width)"
        )
    # ReadConfig normalises one int to a (height, width) pair when it is made.
    out_size = cast("tuple[int, int]", config.image_size or (image.height, image.width))
    drop_remainder = training if config.drop_remainder is None else config.drop_remainder
    deterministic = config.resolved_deterministic(seed, training=training)
    batches_per_epoch = _batches_per_epoch(split_info.num_examples, batch_size, input_context, drop_remainder)
    if batches_per_epoch == 0:
        raise ValueError(
            f"split {split!r} of {data_dir} has {split_info.num_examples} examples: fewer than one "
            f"{'global ' if input_context else ''}batch of {_global_batch(batch_size, input_context)}, so "
            f"drop_remainder=True leaves no batch to read; use a smaller batch or drop_remainder=False"
        )
    per_pass = batches_per_epoch
    if per_pass is None:
        per_pass = share.num_examples // batch_size if drop_remainder else math.ceil(share.num_examples / batch_size)
    # Batches of this pipeline that the global steps already taken hold: each step is
    # `_replicas_per_pipeline` consecutive batches of each pipeline.
    skipped_batches = initial_step * _replicas_per_pipeline(input_context)
    if skipped_batches and skipped_batches >= per_pass:
        raise ValueError(
            f"initial_step={initial_step} is not within an epoch of split {split!r} of {data_dir}: an epoch has "
            f"{-(-per_pass // _replicas_per_pipeline(input_context))} steps of this batch size; resume at the "
            f"next epoch with initial_epoch={initial_epoch + 1}, initial_step=0"
        )
    pipeline_id = share.pipeline_id
    # Without a seed, each dataset draws its own: the epochs still differ from one another.
    base_seed = seed if seed is not None else random.SystemRandom().randrange(MAX_SEED)
    # Per-pipeline seeds for the piece and record shuffles, so that pipelines draw different orders.
    # Augmentation uses `base_seed` itself: it depends on the example, not the pipeline.
    local_seed = (base_seed + 7919 * pipeline_id) % MAX_SEED
    placement = _placement(config, image, training)
    if annotated or image.keeps_size:
        # Per example: images of varying sizes, and lists of varying lengths, form a batch only
        # once each is resized and padded.
        placement = "element"

    # (path, records in the shard, records to skip, records to take, shard bytes) per shard piece
    # this pipeline reads.
    pieces = share.pieces
    shard_bytes = {s.path: s.bytes for s in split_info.shards}
    piece_ds = tf.data.Dataset.from_tensor_slices(
        (
            tf.constant([p.path for p in pieces], tf.string),
            tf.constant([p.shard_examples for p in pieces], tf.int64),
            tf.constant([p.skip for p in pieces], tf.int64),
            tf.constant([p.take for p in pieces], tf.int64),
            tf.constant([shard_bytes[p.path] for p in pieces], tf.int64),
        )
    )
    shuffle_pieces = training and config.shuffle_files and len(pieces) > 1

    cycle_length = config.cycle_length or max(1, min(len(pieces), _MAX_AUTO_CYCLE_LENGTH))
    # With a cache, each shard piece is read from a verified local copy (cached_reading.py).
    through_cache = (
        CachedShards(
            shared_cache(config.cache_dir, config.cache_limit_bytes, s3_options(config)),
            split_info.shards,
            open_at_once=cycle_length,
            where=f"split {split!r}",
        )
        if config.cache_dir is not None
        else None
    )

    def read_piece(path: tf.Tensor, count: tf.Tensor, skip: tf.Tensor, take: tf.Tensor, size: tf.Tensor):
        def read(local: tf.Tensor) -> tf.data.Dataset:
            return read_shard(
                local,
                count,
                skip,
                take,
                expected_bytes=size,
                buffer_size=config.read_buffer_size,
                skip_corrupt=config.skip_corrupt,
                # A service worker cannot call back into this process's Python to re-read the shard for
                # TensorFlow's reason; the error still names the shard and the byte offset.
                describe_errors=not service,
            )

        if through_cache is None:
            return read(path)
        return through_cache.read_through(path, read)

    def read_pieces(pieces_ds: tf.data.Dataset) -> tf.data.Dataset:
        if through_cache is not None and config.cache_lookahead:
            # The prefetch pulls the next pieces, in this pass's order, ahead of the interleave: their
            # downloads start while the pieces before them are read.
            pieces_ds = pieces_ds.map(lambda path, *rest: (through_cache.announce(path), *rest)).prefetch(
                config.cache_lookahead
            )
        records = pieces_ds.interleave(
            read_piece,
            cycle_length=cycle_length,
            block_length=config.block_length,
            # Through the cache, the pieces open are exactly `cycle_length`: a parallel interleave also
            # opens pieces ahead, whose leases would take a small cache over its limit (the start-up
            # check counts `cycle_length`). Reading local copies one record at a time is not what
            # limits speed.
            **(
                dict(num_parallel_calls=config.num_parallel_reads, deterministic=deterministic)
                if through_cache is None
                else {}
            ),
        )  # (serialized, name)
        if config.skip_corrupt and batches_per_epoch is not None:
            records = _require_records(
                records,
                batches_per_epoch * batch_size,
                f"tfdata_readers: input pipeline {pipeline_id} of {share.num_pipelines} (split {split!r} of "
                f"{data_dir}) read fewer than the {batches_per_epoch * batch_size} records it needs for the "
                f"{batches_per_epoch} batches of {batch_size} that every pipeline must yield per epoch under "
                f"tf.distribute: skip_corrupt=True skipped corrupt records of its share (see skipped_records() "
                f"and the warnings above). Yielding fewer batches would make pipelines disagree on step counts "
                f"and global steps straddle two passes, so the reader stops instead. Repair or re-convert the "
                f"shard (python -m tfdata_readers.verify names it), or evaluate (drop_remainder=False), "
                f"which reads what is left. Records read:",
            )
        return records

    def to_features(batch: tuple[tf.Tensor, tf.Tensor], epoch_seed: tf.Tensor) -> dict[str, tf.Tensor]:
        serialized, names = batch
        # The names make a parse error (a missing key, a wrong type) name the shard, record and offset.
        features = parse_batch(serialized, spec, names=names)
        if training:
            features["seed"] = augment.example_seeds(epoch_seed, features[_AUGMENT_KEY])
        else:
            features["seed"] = tf.zeros([tf.shape(serialized)[0], 2], tf.int64)
        return features

    def images(features: dict[str, tf.Tensor], batched: bool) -> tf.Tensor:
        encoded = features["image/encoded"]
        area, aspect, dct = config.crop_area_range, config.crop_aspect_ratio_range, config.jpeg_dct_method
        if batched:
            if training:
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
        size = tf.stack([features[_HEIGHT], features[_WIDTH]]) if image.keeps_size else None
        if training:
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

    def element(features: dict[str, Any]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """One parsed example -> (its fixed-shape features, its pixels): an annotated example's
        lists become its targets (annotation_targets), its boxes and mask moved with the pixels."""
        if not annotated:
            return features, images(features, False)
        if task == "multi_label" and not semantic:
            pixels = images(features, False)  # the classification crop: no box or mask to move
            fixed = {key: value for key, value in features.items() if key not in spec or key in keys}
            fixed.update(annotation_targets(features, None, num_classes=info.num_classes, max_boxes=config.max_boxes))
            return fixed, pixels
        size = tf.stack([features[_HEIGHT], features[_WIDTH]]) if image.keeps_size else None
        view = annotated_element(
            features["image/encoded"],
            features["seed"],
            image,
            stored_boxes(features) if task == "detection" else tf.zeros([0, 4]),
            out_size=out_size,
            training=training,
            mask_png=features[_MASK_KEY] if semantic else None,
            instance_pngs=features[_INSTANCE_KEY] if instance else None,
            size=size,
            area_range=config.object_crop_area_range,
            dct_method=config.jpeg_dct_method,
        )
        fixed = {key: value for key, value in features.items() if key not in spec or key in keys}
        fixed.pop(_MASK_KEY, None)
        fixed.pop(_INSTANCE_KEY, None)
        fixed.update(
            annotation_targets(
                features,
                view["boxes"] if task == "detection" else None,
                kept=view["kept"],
                instance_masks=view.get("instance_masks"),
                num_classes=info.num_classes,
                max_boxes=config.max_boxes,
            )
        )
        if semantic:
            fixed["mask"] = tf.ensure_shape(view["mask"], (*out_size, 1))
        fixed["boxes_dropped"] = view["dropped"]
        return fixed, view["pixels"]

    def finish(features: dict[str, tf.Tensor], pixels: tf.Tensor) -> tuple[Any, ...]:
        pixels = to_output(pixels, config.dtype, config.scale)
        if annotated:
            names = TARGET_NAMES[task] + (("mask",) if semantic and task == "detection" else ())
            names += ("masks",) if instance else ()
            targets = {name: features[name] for name in names}
            # Keras's conventions: (image, multi-hot labels), (image, mask), or (image, {targets}).
            annotated_out: tuple[Any, ...] = (pixels, targets if len(targets) > 1 else targets[names[0]])
            if with_metadata:
                meta = {name: features[key] for name, key in METADATA_KEYS.items() if key in features}
                if "boxes_dropped" in features:
                    meta["boxes_dropped"] = features["boxes_dropped"]
                annotated_out += (meta,)
            return annotated_out
        labels = features["image/class/label"]
        out: tuple[Any, ...] = (pixels, labels)
        if weights is not None:
            out += (tf.gather(weights, labels),)
        if with_metadata:
            out += ({name: features[key] for name, key in METADATA_KEYS.items()},)
        return out

    parallel = dict(num_parallel_calls=config.num_parallel_calls, deterministic=deterministic)
    step_group = service_reading.replicas_per_step(input_context) if service and training else 1

    def decode(batches: tf.data.Dataset, skipped: tf.Tensor | int = 0) -> tf.data.Dataset:
        """(([B] serialized, [B] name), [2] epoch seed) batches of one pass -> the output batches.

        `skipped`: batches of the pass already skipped (resuming mid-epoch), so one fewer each to take."""
        if placement == "batch":
            # (image [B,H,W,C], label [B], {metadata})
            decoded = batches.map(
                lambda batch, seed: (lambda f: finish(f, images(f, True)))(to_features(batch, seed)), **parallel
            )
        else:
            parsed = batches.map(to_features, **parallel).unbatch()  # {key: scalar}
            elements = parsed.map(element, **parallel)  # ({key: scalar, target: fixed shape}, [H,W,C])
            # Re-batching what was just unbatched gives the same batch boundaries.
            decoded = elements.batch(batch_size, drop_remainder=drop_remainder).map(finish, **parallel)
        if batches_per_epoch is not None and not service:
            # Every pipeline yields the same number of batches per epoch, so their step counts agree.
            decoded = decoded.take(batches_per_epoch - skipped)
        # Through the service in training, a global step's batches travel as one element of one
        # pass (see tfdata_readers.service.reading): otherwise a step could hold an example twice.
        return service_reading.group_steps(decoded, step_group)

    if training:
        cached = None
        if config.cache:
            # Cached once, outside the passes, so every pass reads memory; the piece order is then
            # epoch 0's, whatever `initial_epoch`, as an uninterrupted run's cache holds it.
            first = piece_ds
            if shuffle_pieces:
                first = _seeded_shuffle(piece_ds, len(pieces), _pass_seed(local_seed, 0, _PIECES))
            cached = read_pieces(first).cache()

        def one_pass(epoch: tf.Tensor) -> tf.data.Dataset:
            """The batches of epoch `epoch`: every shuffle and crop is a pure function of it and the seed."""
            if cached is not None:
                records = cached
            else:
                ordered = piece_ds
                if shuffle_pieces:
                    ordered = _seeded_shuffle(piece_ds, len(pieces), _pass_seed(local_seed, epoch, _PIECES))
                records = read_pieces(ordered)
            records = _seeded_shuffle(records, config.shuffle_buffer_size, _pass_seed(local_seed, epoch, _RECORDS))
            # Resuming mid-epoch: the steps already taken are read, never decoded.
            skipped = tf.where(tf.equal(epoch, initial_epoch), tf.constant(skipped_batches, tf.int64), 0)
            if skipped_batches:
                records = records.skip(skipped * batch_size)
            batches = records.batch(batch_size, drop_remainder=drop_remainder)  # ([B] serialized, [B] name)
            epoch_seed = _augment_seed(base_seed, epoch)  # [2], with each key it seeds an example's crop and flip
            return decode(batches.map(lambda serialized, names: ((serialized, names), epoch_seed)), skipped)

        dataset = _epoch_numbers(initial_epoch, config.num_epochs).flat_map(one_pass)
    else:
        records = read_pieces(piece_ds)
        if config.cache:
            records = records.cache()

        def eval_pass(skipped: int) -> tf.data.Dataset:
            skipping = records.skip(skipped * batch_size) if skipped else records
            batches = skipping.batch(batch_size, drop_remainder=drop_remainder)  # ([B] serialized, [B] name)
            # An unused seed keeps one signature.
            seeded = batches.map(lambda serialized, names: ((serialized, names), tf.zeros([2], tf.int64)))
            return decode(seeded, skipped)

        dataset = eval_pass(skipped_batches)
        if skipped_batches and config.num_epochs != 1:
            # Resuming mid-epoch: only the first pass starts part-way.
            later = None if config.num_epochs is None else config.num_epochs - 1
            dataset = dataset.concatenate(eval_pass(0).repeat(later))
        elif config.num_epochs != 1:
            dataset = dataset.repeat(config.num_epochs)
    if not service:
        identity = {
            # The shards by content, not by place: a copy of the dataset elsewhere resumes alike.
            "shards": hashlib.sha256(" ".join(s.sha256 for s in split_info.shards).encode()).hexdigest(),
            "version": info.version,
            "split": split,
            "batch_size": batch_size,
            "training": training,
            "seed": base_seed if training else None,
            "with_metadata": with_metadata,
            "pipeline": [pipeline_id, share.num_pipelines],
        }
        identity_line = reader_identity(identity, config)
    if not service and (not config.skip_corrupt or batches_per_epoch is not None):
        # The manifest knows the count; without it Keras shows no step total and warns that the
        # input "ran out of data" every epoch. Under skip_corrupt a pass may hold fewer batches,
        # unless `_require_records` holds the pipeline to its count.
        total = (
            tf.data.INFINITE_CARDINALITY
            if config.num_epochs is None
            else per_pass * config.num_epochs - initial_step * _replicas_per_pipeline(input_context)
        )
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(total))
    dataset = dataset.prefetch(config.prefetch)
    if not service:
        dataset = _refusing_other_readers_checkpoints(dataset, identity_line)

    tf_options = tf.data.Options()
    # Sharding is done above from the InputContext; TensorFlow must not shard again.
    tf_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # So that `tf.train.Checkpoint(iterator=...)` can save the iterator mid-epoch: by default it refuses
    # any stateful op. Ours hold nothing the position depends on: the cache's counts of asked and
    # read shards (a restored piece asks for its shard again, see cached_reading.py), the tally of skipped records, the
    # counter that numbers a new iteration's epochs, and the shuffle's unused seed generator (every
    # order is a function of the seed and the epoch, and the shuffle buffers are saved).
    tf_options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    # TensorFlow would add a prefetch after the identity check, whose restored buffer would hand on a
    # batch before the check compares the checkpoint's identity with this reader's.
    tf_options.experimental_optimization.inject_prefetch = False
    dataset = dataset.with_options(tf_options)
    if not service:
        return dataset

    # Everything above runs on the service's workers; only what follows runs here.
    dataset = service_reading.through_service(dataset, service, dynamic=sharding == "dynamic")
    dataset = service_reading.ungroup_steps(dataset, step_group)
    if not drop_remainder and config.num_epochs is not None:
        expected = share.num_examples * config.num_epochs
        dataset = service_reading.expect_examples(
            dataset,
            expected,
            f"tfdata_readers: the tf.data service at {service} ({sharding} sharding) did not deliver exactly the "
            f"{expected} examples of input pipeline {pipeline_id} of {share.num_pipelines} (split {split!r} of "
            f"{data_dir}, {config.num_epochs} epoch(s)): a service worker was lost during the epoch. Dynamic "
            f"sharding loses the pieces it was reading (fewer examples); static sharding reads its whole part again "
            f"when it restarts (more). These results are not exactly once: run the evaluation again. Delivered:",
        )
    return dataset.prefetch(config.prefetch).with_options(tf_options)
