"""The reader's plan: the manifest, the split and the options resolved into what every stage reads.

Everything that can be wrong is refused here, at start-up and naming the feature, shard or option,
rather than in the middle of an epoch; every number the stages share (batches per pass, batches to
skip, seeds, where decoding runs) is derived here, once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
from typing import Any, cast

import tensorflow as tf

from tfdata_readers.config import MAX_SEED, ReadConfig, check_batch_size, check_seed
from tfdata_readers.decoding.parse import METADATA_KEYS, feature_spec, list_feature_spec
from tfdata_readers.decoding.targets import list_keys as _list_keys
from tfdata_readers.service import reading as service_reading
from tfdata_readers.sources import storage
from tfdata_readers.sources.files import (
    PipelineShare,
    check_no_unlisted_shards,
    check_shards,
    old_version_note,
    share_for_pipeline,
)
from tfdata_readers.sources.manifest import (
    MANIFEST_NAME,
    DatasetInfo,
    ImageInfo,
    SplitInfo,
    current_version,
    load_manifest,
)

__all__ = [
    "AUGMENT_KEY",
    "HEIGHT",
    "INSTANCE_KEY",
    "MASK_KEY",
    "WIDTH",
    "ReaderPlan",
    "check_initial_epoch",
    "check_initial_step",
    "class_weight_table",
    "plan_reader",
    "replicas_per_pipeline",
]

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

_MAX_AUTO_CYCLE_LENGTH = 16
# The feature that seeds each training example's augmentation.
AUGMENT_KEY = "image/key/sha256"
HEIGHT, WIDTH = "image/height", "image/width"
MASK_KEY = "image/segmentation/class/encoded"
INSTANCE_KEY = "image/object/mask"


@dataclasses.dataclass(frozen=True)
class ReaderPlan:
    """One reader, resolved: what `make_dataset` was asked for and what follows from the manifest."""

    info: DatasetInfo
    split: str
    split_info: SplitInfo
    share: PipelineShare  # this input pipeline's shard pieces
    batch_size: int
    training: bool
    with_metadata: bool
    config: ReadConfig
    input_context: tf.distribute.InputContext | None
    initial_epoch: int
    initial_step: int
    spec: dict[str, Any]  # the features to parse
    keys: tuple[str, ...]  # those of them that reach the output (an annotated example's lists become targets)
    semantic: bool  # a semantic mask per example
    instance: bool  # instance masks per object
    weights: tf.Tensor | None  # float32 [num_classes] class weights
    sharding: str | None  # "static" or "dynamic" through the tf.data service, else None
    out_size: tuple[int, int]
    drop_remainder: bool
    deterministic: bool
    batches_per_epoch: int | None  # what every pipeline yields per epoch under tf.distribute, else None
    per_pass: int  # this pipeline's batches in one pass
    skipped_batches: int  # this pipeline's batches that the global steps already taken hold
    base_seed: int  # seeds augmentation: it depends on the example, not the pipeline
    local_seed: int  # seeds this pipeline's piece and record shuffles
    placement: str  # "batch" or "element": where decoding runs
    cycle_length: int

    @property
    def data_dir(self) -> str:
        """The dataset's folder, resolved once by the manifest."""
        return self.info.data_dir

    @property
    def image(self) -> ImageInfo:
        """How the dataset's images are stored."""
        return self.info.image

    @property
    def task(self) -> str:
        """classification, multi_label, detection or segmentation."""
        return self.info.task

    @property
    def annotated(self) -> bool:
        """Whether examples carry lists (labels, boxes, masks) that become targets."""
        return self.info.task != "classification"

    @property
    def service(self) -> str | None:
        """The tf.data service's address, None without one."""
        return self.config.data_service

    @property
    def pipeline_id(self) -> int:
        """This input pipeline's index among them."""
        return self.share.pipeline_id

    @property
    def total_batches(self) -> int:
        """The true number of batches this pipeline yields over all its epochs (INFINITE_CARDINALITY
        without num_epochs): without it Keras shows no step total and warns that the input "ran out
        of data" every epoch."""
        if self.config.num_epochs is None:
            return int(tf.data.INFINITE_CARDINALITY)
        return self.per_pass * self.config.num_epochs - self.initial_step * replicas_per_pipeline(self.input_context)

    @property
    def records_needed(self) -> int | None:
        """The records one epoch of this pipeline must hold for its equal step count (None when its
        count is not held to the others')."""
        return None if self.batches_per_epoch is None else self.batches_per_epoch * self.batch_size

    @property
    def replicas_per_step(self) -> int:
        """How many batches of this pipeline travel as one element through the tf.data service in
        training (a global step's), so that no step holds an example twice; 1 otherwise."""
        if self.service and self.training:
            return service_reading.replicas_per_step(self.input_context)
        return 1

    @property
    def shuffle_pieces(self) -> bool:
        """Whether each pass shuffles the order of the shard pieces."""
        return self.training and self.config.shuffle_files and len(self.share.pieces) > 1


def plan_reader(
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
) -> ReaderPlan:
    """`make_dataset`'s arguments, checked and resolved against the manifest (read once, here)."""
    _check_arguments(
        data_dir,
        batch_size,
        training=training,
        seed=seed,
        initial_epoch=initial_epoch,
        initial_step=initial_step,
        config=config,
    )
    # The manifest resolves a local data_dir to an absolute path, once: the service's workers open
    # the shard paths in their own working directory, and this process may chdir between passes.
    info = load_manifest(data_dir, version)
    split_info = info.split(split)
    if not split_info.shards:
        raise ValueError(f"split {split!r} of {info.data_dir} has no shards")
    # ReadConfig normalises a mapping of weights to sorted pairs when it is made.
    weights = class_weight_table(cast("tuple[tuple[int, float], ...] | None", config.class_weights), info)
    keys, spec, semantic, instance = _features(info, with_metadata=with_metadata, training=training)
    share = _checked_share(info, split, split_info, input_context, config)
    sharding = _checked_service(config, training, share, split, info.data_dir)
    _check_output_size(info, config)
    drop_remainder = training if config.drop_remainder is None else config.drop_remainder
    batches_per_epoch, per_pass, skipped = _batch_counts(
        split_info, share, batch_size, input_context, drop_remainder, initial_epoch, initial_step, split, info.data_dir
    )
    # Without a seed, each dataset draws its own: the epochs still differ from one another.
    base_seed = seed if seed is not None else random.SystemRandom().randrange(MAX_SEED)
    return ReaderPlan(
        info=info,
        split=split,
        split_info=split_info,
        share=share,
        batch_size=batch_size,
        training=training,
        with_metadata=with_metadata,
        config=config,
        input_context=input_context,
        initial_epoch=initial_epoch,
        initial_step=initial_step,
        spec=spec,
        keys=tuple(keys),
        semantic=semantic,
        instance=instance,
        weights=weights,
        sharding=sharding,
        # ReadConfig normalises one int to a (height, width) pair when it is made.
        out_size=cast("tuple[int, int]", config.image_size or (info.image.height, info.image.width)),
        drop_remainder=drop_remainder,
        deterministic=config.resolved_deterministic(seed, training=training),
        batches_per_epoch=batches_per_epoch,
        per_pass=per_pass,
        skipped_batches=skipped,
        base_seed=base_seed,
        # Per-pipeline seeds for the piece and record shuffles, so that pipelines draw different orders.
        local_seed=(base_seed + 7919 * share.pipeline_id) % MAX_SEED,
        placement=_placement(config, info, training),
        cycle_length=config.cycle_length or max(1, min(len(share.pieces), _MAX_AUTO_CYCLE_LENGTH)),
    )


def _check_arguments(
    data_dir: str | os.PathLike[str],
    batch_size: int,
    *,
    training: bool,
    seed: int | None,
    initial_epoch: int,
    initial_step: int,
    config: ReadConfig,
) -> None:
    """Refuses the arguments that are wrong whatever the manifest says, before it is read."""
    check_batch_size("batch_size", batch_size)
    check_seed(seed)
    check_initial_epoch(initial_epoch)
    check_initial_step(initial_step, training=training, num_epochs=config.num_epochs, service=config.data_service)
    if storage.is_s3(os.fspath(data_dir)) and config.cache_dir is None:
        raise ValueError(
            f"cannot read {os.fspath(data_dir)} without a cache: TensorFlow has no s3:// filesystem, so its shards "
            "are read through a local cache; give ReadConfig(cache_dir=..., cache_limit_bytes=...)"
        )


def _check_output_size(info: DatasetInfo, config: ReadConfig) -> None:
    """Refuses to batch images that keep their own sizes without an `image_size` to resize them to."""
    if info.image.keeps_size and config.image_size is None:
        raise ValueError(
            f"{info.manifest_path}: the images of this dataset keep their own sizes (converted with "
            f"--resize_mode keep), so a batch needs an output size: give image_size=(height, width)"
        )


def _features(
    info: DatasetInfo, *, with_metadata: bool, training: bool
) -> tuple[list[str], dict[str, Any], bool, bool]:
    """(the keys that reach the output, the parse spec, semantic masks?, instance masks?), checked
    against the manifest's features so that a missing one fails now, naming it."""
    task = info.task
    annotated = task != "classification"
    keys = ["image/encoded"] if annotated else ["image/encoded", "image/class/label"]
    if with_metadata:
        # An annotated example's class names are a list: its ids are in the targets.
        keys += [key for name, key in METADATA_KEYS.items() if not (annotated and name == "label_text")]
    elif training:
        keys.append(AUGMENT_KEY)  # each example's crop and flip are seeded from its key
    if info.image.keeps_size:
        keys += [HEIGHT, WIDTH]  # each example's own size: RAW bytes do not say it
    spec: dict[str, Any] = feature_spec(keys, info.features, where=info.manifest_path)
    semantic = bool(info.raw.get("annotations", {}).get("semantic_masks"))
    instance = task == "detection" and bool(info.raw.get("annotations", {}).get("instance_masks"))
    if annotated:
        list_keys = _list_keys(task, instance_masks=instance)
        spec.update(list_feature_spec(list_keys, info.features, where=info.manifest_path))
    if semantic:
        spec[MASK_KEY] = tf.io.FixedLenFeature([], tf.string)  # declared with the annotations (verify checks it)
    return keys, spec, semantic, instance


def _checked_share(
    info: DatasetInfo,
    split: str,
    split_info: SplitInfo,
    input_context: tf.distribute.InputContext | None,
    config: ReadConfig,
) -> PipelineShare:
    """This pipeline's share of the split, its shards checked to be there and whole."""
    check_no_unlisted_shards(info, split)
    share = share_for_pipeline(split_info, input_context)
    # Only an older version's manifest (read from versions/) can list files the writer has since deleted.
    from_history = info.manifest_path != os.path.join(info.data_dir, MANIFEST_NAME)
    note = old_version_note(info, current_version(info.data_dir)) if from_history else ""
    check_shards(share.shards(split_info), skip_corrupt=config.skip_corrupt, missing_note=note)
    return share


def _checked_service(config: ReadConfig, training: bool, share: PipelineShare, split: str, data_dir: str) -> str | None:
    """The tf.data service's sharding, its dispatcher and workers checked; None without a service."""
    service = config.data_service
    if not service:
        return None
    wanted = _service_sharding(config, training)  # refuses what cannot hold, before any connection
    workers = service_reading.check_dispatcher(service, config.data_service_timeout_s)
    sharding = _static_or_fallback(config, wanted, len(share.pieces), len(workers), split, data_dir)
    service_reading.check_workers_see(service, [p.path for p in share.pieces], config.data_service_timeout_s)
    return sharding


def _batch_counts(
    split_info: SplitInfo,
    share: PipelineShare,
    batch_size: int,
    input_context: tf.distribute.InputContext | None,
    drop_remainder: bool,
    initial_epoch: int,
    initial_step: int,
    split: str,
    data_dir: str,
) -> tuple[int | None, int, int]:
    """(batches every pipeline yields per epoch or None, this pipeline's batches per pass, batches
    of the first pass to skip), refusing a split smaller than one batch and a step past the epoch."""
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
    # Each global step is `replicas_per_pipeline` consecutive batches of each pipeline.
    skipped = initial_step * replicas_per_pipeline(input_context)
    if skipped and skipped >= per_pass:
        raise ValueError(
            f"initial_step={initial_step} is not within an epoch of split {split!r} of {data_dir}: an epoch has "
            f"{-(-per_pass // replicas_per_pipeline(input_context))} steps of this batch size; resume at the "
            f"next epoch with initial_epoch={initial_epoch + 1}, initial_step=0"
        )
    return batches_per_epoch, per_pass, skipped


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
    return steps * replicas_per_pipeline(input_context)


def _placement(config: ReadConfig, info: DatasetInfo, training: bool) -> str:
    """Where decoding runs: "element" (a parallel map per example) or "batch" (`map_fn` per batch)."""
    if info.task != "classification" or info.image.keeps_size:
        # Per example: images of varying sizes, and lists of varying lengths, form a batch only
        # once each is resized and padded.
        return "element"
    if config.decode_placement != "auto":
        return config.decode_placement
    return _AUTO_PLACEMENT[info.image.format, training]


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


def replicas_per_pipeline(input_context: tf.distribute.InputContext | None) -> int:
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
