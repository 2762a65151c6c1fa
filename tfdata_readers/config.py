"""`ReadConfig`: every tuning knob of the reader, documented and validated in one frozen dataclass."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any, Literal, TypeGuard

import tensorflow as tf

from tfdata_readers.sources import storage

__all__ = [
    "AUTOTUNE",
    "MAX_SEED",
    "PILLOWS_DCT_METHOD",
    "JpegDctMethod",
    "ReadConfig",
    "check_batch_size",
    "check_seed",
]

AUTOTUNE = tf.data.AUTOTUNE
DecodePlacement = Literal["auto", "element", "batch"]
ServiceSharding = Literal["auto", "static", "dynamic"]
OutputDtype = Literal["float32", "uint8"]
# tf.io.decode_jpeg's IDCTs: the accurate one is libjpeg's JDCT_ISLOW, the one Pillow decodes with.
JpegDctMethod = Literal["INTEGER_ACCURATE", "INTEGER_FAST"]
PILLOWS_DCT_METHOD: JpegDctMethod = "INTEGER_ACCURATE"
_DEFAULT_SCALE = 1.0 / 255.0


def _check_positive_or_autotune(name: str, value: int | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or (value < 1 and value != AUTOTUNE):
        raise ValueError(f"ReadConfig.{name} must be a positive int or tf.data.AUTOTUNE (got {value!r})")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> TypeGuard[float]:
    """A finite int or float (not a bool): inf and nan are refused wherever a number is expected."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_optional_bool(value: object) -> bool:
    """None, True or False themselves: 1, 1.0 and 0.0 compare equal to True/False but are refused."""
    return value is None or value is True or value is False


# Seeds are int64 in TensorFlow's ops; a seed must be an int in [0, MAX_SEED).
MAX_SEED = 2**63


def check_batch_size(name: str, value: object) -> int:
    """`value` if it is a positive int (not a bool); else a ValueError naming `name`."""
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be a positive int (got {value!r})")
    return value


def check_seed(seed: object) -> int | None:
    """`seed` if it is None or an int (not a bool) with 0 <= seed < 2**63; else a ValueError naming seed."""
    if seed is not None and (not _is_int(seed) or not 0 <= seed < MAX_SEED):
        raise ValueError(f"seed must be None or an int with 0 <= seed < 2**63 (got {seed!r})")
    return seed


def _is_pair_of_reals(value: object) -> bool:
    return isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_real(v) for v in value)


def _class_weights(value: object) -> tuple[tuple[int, float], ...] | None:
    """None, or sorted (label id, weight) pairs from a mapping or pairs; ids ints >= 0, weights finite >= 0."""
    if value is None:
        return None
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(pairs, (list, tuple)) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in pairs):
        raise ValueError(f"ReadConfig.class_weights must be None or a mapping {{label id: weight}} (got {value!r})")
    ids = [p[0] for p in pairs]
    for label, weight in pairs:
        if not _is_int(label) or label < 0:
            raise ValueError(f"ReadConfig.class_weights: label id {label!r} is not an int >= 0 (in {value!r})")
        if not _is_real(weight) or weight < 0:
            raise ValueError(
                f"ReadConfig.class_weights: weight {weight!r} of label {label!r} is not a finite number >= 0"
            )
    if len(set(ids)) != len(ids) or not pairs:
        raise ValueError(f"ReadConfig.class_weights must give each label id once, and at least one (got {value!r})")
    return tuple(sorted((int(label), float(weight)) for label, weight in pairs))


def _image_size(value: object) -> tuple[int, int] | None:
    """None, or (height, width) from a pair or from one int (a square); anything else is refused."""
    if value is None:
        return None
    if _is_int(value) and value >= 1:
        return (value, value)
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(_is_int(v) and v >= 1 for v in value):
        return (value[0], value[1])
    raise ValueError(
        f"ReadConfig.image_size must be None, an int > 0 (a square) or (height, width) ints > 0 (got {value!r})"
    )


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """How `make_dataset` reads. The defaults are tuned for a few cores per accelerator.

    Attributes:
      cycle_length: shard pieces read at once by `interleave`. None: min(this pipeline's pieces, 16).
        A piece is a whole shard file, or the part of one that a pipeline shares with a neighbour.
      block_length: consecutive records taken from one file before moving to the next. 1 mixes
        files best; larger values give slightly cheaper reads.
      num_parallel_reads: parallelism of `interleave` (tf.data.AUTOTUNE or a positive int).
      read_buffer_size: bytes of read-ahead per TFRecord file (larger helps on gs://).
      shuffle_buffer_size: examples held by the record shuffle when training (per input pipeline).
      shuffle_files: when training, shuffle the order of the pipeline's shard pieces with the seed,
        differently each epoch.
      num_parallel_calls: parallelism of the decode/augment map (tf.data.AUTOTUNE or a positive int).
      deterministic: produce elements in a reproducible order. None (default): True when
        evaluating (`training=False`: every pass, and every iterator, yields the same order, so
        labels gathered from one pass pair with predictions from another), and when training
        with a `seed`; False when training without one. False lets parallel stages return
        elements out of order, which can be faster, and every element is still seen once: an
        explicit choice, for training throughput, also honoured when evaluating.
      drop_remainder: drop the last partial batch. None: True when training, False when evaluating
        (so evaluation sees every example exactly once).
      cache: keep the serialized records in memory after the first epoch. The record shuffle still
        changes every epoch; the piece order is then fixed by the first epoch.
      num_epochs: passes over the data in one iteration of the dataset. 1 (default): one epoch per
        iteration, so `model.fit(epochs=k)` re-iterates and reshuffles. None: repeat forever
        (for `model.fit(steps_per_epoch=steps_per_epoch(...))`); every pass reshuffles.
      prefetch: batches prefetched at the end of the pipeline (tf.data.AUTOTUNE or a positive int).
      decode_placement: decode each element in a parallel map ("element"), or each batch with
        `map_fn` ("batch"). "auto" uses the placement measured faster: per batch for
        evaluation (for RAW one vectorised op), per element for training (crops differ in size).
      max_boxes: a detection dataset's boxes and classes are padded (classes with -1) to this
        many per image; an image with more has the rest cut, and a line on stderr says so.
      cache_dir: a local folder of its own through which an s3:// dataset's shards are read (required for
        s3://; optional for gs://). Each shard is downloaded there (parallel ranged GETs, with
        retries), checked against the manifest's sha256 before it is read, and shared with every
        reader on the host that uses the same folder. Credentials, region and endpoint come from
        the AWS default chain (`AWS_ENDPOINT_URL` for MinIO, R2 and other S3-compatible stores).
      cache_limit_bytes: the most the cache folder holds of shards no reader has open; the least
        recently used of those are removed to make room. Shards being read are never removed and
        never waited for: when they alone fill the limit, a reader downloads the shard it needs
        anyway, so the folder holds at most this limit plus the shards the live readers sharing
        it have open (`cycle_length` of each). It must hold one reader's own `cycle_length`
        largest shards (a smaller limit is refused at start-up), so a reader alone stays under it;
        a shard announced ahead (`cache_lookahead`) is only fetched early when there is room.
      cache_lookahead: how many shards beyond those being read are downloaded ahead, in the
        order the reader will read them.
      s3_endpoint_url: an s3:// dataset's endpoint ("http://127.0.0.1:9000" for MinIO, an R2
        account's URL), instead of the AWS default chain's (`AWS_ENDPOINT_URL`, else AWS).
      s3_profile: the named profile of ~/.aws whose credentials and region read an s3://
        dataset, instead of the default chain's (`AWS_PROFILE`, the environment, instance roles).
      image_size: (height, width) of the output images, or one int for a square (as the
        converter's `--image_size`). None: the size stored in the manifest.
      scale: factor applied to the float32 pixels; 1/255 gives [0, 1]. None keeps [0, 255].
      dtype: "float32" (default) or "uint8". uint8 hands on pixel values 0-255 unscaled (resized
        or cropped pixels are rounded back), a quarter of the bytes: convert on the accelerator
        instead, for example with a `tf.keras.layers.Rescaling(1 / 255)` first layer. On a host
        with few cores this saves the float32 conversion, about a tenth of the JPEG reader's CPU
        time, and 4x the bytes copied to each device. With uint8, `scale` must be None or 1/255
        (which the pixel values then imply).
      jpeg_dct_method: the IDCT that decodes JPEG. "INTEGER_ACCURATE" (default) gives exactly
        the pixels Pillow gives for the stored bytes (the converter's, and a Pillow-based
        server's), on every path: evaluation, training crops, annotated examples, the tf.data
        service. "INTEGER_FAST" is TensorFlow's own default, up to ~20 levels off Pillow's on
        real photos; docs/reading.md gives what each costs in the reader's throughput.
      crop_area_range: fraction of the image area the training random-resized crop keeps.
      crop_aspect_ratio_range: width/height range of the training random-resized crop.
      object_crop_area_range: for a detection or segmentation dataset, the fraction of the image
        area its training crop keeps (the crop also covers at least 30% of one of its objects,
        and boxes and mask move with it). (1.0, 1.0) turns the crop off, leaving the flip.
      skip_corrupt: when False (default), a corrupt or truncated shard fails with an error naming it
        and the byte offset of its first unreadable record. When True, reading that shard stops at
        the corrupt record, the records lost are counted per shard (see `skipped_records()`:
        distinct records, so a record lost every epoch counts once) and logged to stderr, and the
        epoch goes on. A shard whose size differs from the manifest (truncated) is then read too,
        with a warning, instead of being refused at start-up. Under tf.distribute when dropping
        the remainder (training), a pipeline that lost more records than its share can spare
        would yield fewer batches than the others, so step counts would disagree: it fails at the
        end of its reads instead, naming the cause. A record that is readable but does not match
        the format (a missing key, a wrong type) always fails, naming the shard, record and key.
      data_service: None (default) reads in this process. "grpc://HOST:PORT" (or "HOST:PORT"):
        the address of a tf.data service dispatcher (`launch/data_service.sh start` prints it).
        The whole pipeline then runs on the service's workers, and this process only receives
        batches. Training needs `num_epochs=None` (with `model.fit(steps_per_epoch=...)`): the
        workers stream batches without end, every one full. Evaluation delivers every example of
        the pipeline's share exactly once per epoch, checked by count at the end of the epoch:
        a worker lost mid-epoch makes the epoch fail with an error saying so rather than return
        a wrong metric. `skip_corrupt` is refused (its counts would stay in the workers).
        The workers open the shard paths this process reads (a local `data_dir` is made
        absolute first), so the shards must be readable on every worker at the same path (gs://,
        or a shared file system); every worker checks this at start-up.
      data_service_sharding: how the service's workers split the shard pieces. "auto" (default):
        "static" when evaluating, "dynamic" when training. "static" (`ShardingPolicy.FILE`) deals
        every worker a fixed part of the pieces, which needs the dispatcher's fixed worker list;
        "dynamic" (`distributed_epoch`) hands out pieces one at a time to whichever worker asks.
        Training is always dynamic ("static" is refused): a static worker would repeat its own
        part at its own speed, so examples would be seen at different rates. Static sharding
        needs at least one shard piece per service worker: with fewer, "auto" evaluates with
        dynamic sharding (also exactly once, and counted) and "static" is refused.
      class_weights: None (default), or `{label id: weight}`: each batch is then
        `(image, label, weight)`, the float32 [B] weight of each example looked up in-graph from
        its label, as Keras's `sample_weight`. This is the way to weight classes with a
        `distribute` dataset, where Keras's own `model.fit(class_weight=...)` cannot be used (it
        maps the dataset, and a distributed dataset has no `map`). As in Keras, a label id
        missing from the mapping gets weight 1.0; every id must be a label id of the manifest
        (0 <= id < num_classes), every weight a finite number >= 0. Stored as sorted
        (id, weight) pairs, so the config stays hashable. See `class_counts` for balanced
        weights.
      data_service_timeout_s: the start-up checks' deadline, after which they fail naming the
        address (TensorFlow itself would retry silently and without end): the dispatcher must
        answer as a tf.data dispatcher (nothing listening, another program, or no answer all
        fail), and every worker must report that it sees the shard files (that check's job may
        take up to `tfdata_readers.service.reading.START_UP_S`, 120 s, to start while the dispatcher answers: a
        first service job on a cold machine is slow to start). A service lost later,
        while reading, is not covered here: see `tfdata_readers.dispatcher_client.DispatcherWatchdog`.

    `deterministic` and `drop_remainder` take None, True or False only (not 1 or 0.0); `scale` and
    the crop ranges take finite numbers only.

    A seed is None or an int (not a bool) with 0 <= seed < 2**63; anything else is a ValueError.
    What a seed reproduces (`make_dataset(..., training=True, seed=s)`):
      - Always, whatever `deterministic`: each example's crop and flip are a pure function of
        (`s`, the epoch, the example's `image/key/sha256`), where the epoch is the k-th pass over
        the dataset (a new draw each pass). The same example gets the same crop in the same
        epoch whatever order it arrives in, whatever the batch size, and whichever input
        pipeline reads it.
      - With `deterministic` True (the default once a seed is given): also the order of the
        examples, the batches, and which examples the dropped remainder holds, for the same data,
        `ReadConfig` and number of input pipelines. With `deterministic=False` the record order
        (and so the batches) may differ between runs.
      - Not across TensorFlow versions (shuffle and stateless random algorithms may change), and
        not with `seed=None`.
    """

    cycle_length: int | None = None
    block_length: int = 1
    num_parallel_reads: int = AUTOTUNE
    read_buffer_size: int = 1 << 20
    shuffle_buffer_size: int = 1024
    shuffle_files: bool = True
    num_parallel_calls: int = AUTOTUNE
    deterministic: bool | None = None
    drop_remainder: bool | None = None
    cache: bool = False
    num_epochs: int | None = 1
    prefetch: int = AUTOTUNE
    decode_placement: DecodePlacement = "auto"
    image_size: tuple[int, int] | int | None = None
    scale: float | None = _DEFAULT_SCALE
    dtype: OutputDtype = "float32"
    jpeg_dct_method: JpegDctMethod = PILLOWS_DCT_METHOD
    crop_area_range: tuple[float, float] = (0.08, 1.0)
    crop_aspect_ratio_range: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    object_crop_area_range: tuple[float, float] = (0.3, 1.0)
    skip_corrupt: bool = False
    data_service: str | None = None
    data_service_sharding: ServiceSharding = "auto"
    data_service_timeout_s: float = 10.0
    class_weights: Mapping[int, float] | tuple[tuple[int, float], ...] | None = None
    max_boxes: int = 100
    cache_dir: str | None = None
    cache_limit_bytes: int = 16 * 2**30
    cache_lookahead: int = 2
    s3_endpoint_url: str | None = None
    s3_profile: str | None = None

    def __post_init__(self) -> None:
        # Frozen: normalised values are set through object.__setattr__, so `image_size` is always
        # None or a pair, `class_weights` None or sorted pairs, and `cache_dir` absolute.
        self._check_reading()
        object.__setattr__(self, "image_size", _image_size(self.image_size))
        self._check_switches()
        self._check_pixels()
        self._check_crops()
        self._check_service()
        object.__setattr__(self, "class_weights", _class_weights(self.class_weights))
        self._check_cache()
        self._check_s3()
        if not _is_optional_bool(self.drop_remainder):
            raise ValueError(f"ReadConfig.drop_remainder must be None, True or False (got {self.drop_remainder!r})")

    def _check_reading(self) -> None:
        """The interleave, shuffle, map and prefetch sizes, the epochs, and the decode placement."""
        _check_positive_or_autotune("cycle_length", self.cycle_length, allow_none=True)
        if self.cycle_length == AUTOTUNE:
            raise ValueError("ReadConfig.cycle_length must be a positive int or None (got AUTOTUNE)")
        for name in ("num_parallel_reads", "num_parallel_calls", "prefetch"):
            _check_positive_or_autotune(name, getattr(self, name))
        for name in ("block_length", "read_buffer_size", "shuffle_buffer_size", "max_boxes", "cache_limit_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ReadConfig.{name} must be a positive int (got {value!r})")
        if self.num_epochs is not None and (not _is_int(self.num_epochs) or self.num_epochs < 1):
            raise ValueError(f"ReadConfig.num_epochs must be None or a positive int (got {self.num_epochs!r})")
        if self.decode_placement not in ("auto", "element", "batch"):
            raise ValueError(
                f"ReadConfig.decode_placement is {self.decode_placement!r}; expected 'auto', 'element' or 'batch'"
            )

    def _check_switches(self) -> None:
        """The on/off options: True or False themselves, and `deterministic` also None."""
        for name in ("shuffle_files", "cache", "skip_corrupt"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"ReadConfig.{name} must be True or False (got {getattr(self, name)!r})")
        if not _is_optional_bool(self.deterministic):
            raise ValueError(f"ReadConfig.deterministic must be None, True or False (got {self.deterministic!r})")

    def _check_pixels(self) -> None:
        """The output pixels: `scale`, `dtype` and the JPEG IDCT, and that uint8 is not scaled."""
        if self.scale is not None and (not _is_real(self.scale) or not self.scale > 0):
            raise ValueError(f"ReadConfig.scale must be None or a finite number > 0 (got {self.scale!r})")
        if self.dtype not in ("float32", "uint8"):
            raise ValueError(f"ReadConfig.dtype is {self.dtype!r}; expected 'float32' or 'uint8'")
        if self.jpeg_dct_method not in ("INTEGER_ACCURATE", "INTEGER_FAST"):
            raise ValueError(
                f"ReadConfig.jpeg_dct_method is {self.jpeg_dct_method!r}; expected 'INTEGER_ACCURATE' (Pillow's "
                "pixels) or 'INTEGER_FAST'"
            )
        if self.dtype == "uint8" and self.scale not in (None, _DEFAULT_SCALE):
            raise ValueError(
                f"ReadConfig.dtype='uint8' hands on unscaled pixel values 0-255, so it cannot apply "
                f"scale={self.scale!r}; scale the pixels on the device instead"
            )

    def _check_crops(self) -> None:
        """The training crops' area and aspect-ratio ranges: finite, positive, low <= high."""
        for name in ("crop_area_range", "object_crop_area_range"):
            area = getattr(self, name)
            if not _is_pair_of_reals(area) or not 0 < area[0] <= area[1] <= 1:
                raise ValueError(f"ReadConfig.{name} must be finite numbers with 0 < low <= high <= 1 (got {area!r})")
        ratio = self.crop_aspect_ratio_range
        if not _is_pair_of_reals(ratio) or not 0 < ratio[0] <= ratio[1]:
            raise ValueError(
                "ReadConfig.crop_aspect_ratio_range must be finite numbers with 0 < low <= high (got "
                f"{self.crop_aspect_ratio_range!r})"
            )

    def _check_service(self) -> None:
        """The tf.data service options; normalises `data_service` to a grpc:// address."""
        if self.data_service is not None:
            from tfdata_readers.service.reading import normalize_address

            object.__setattr__(self, "data_service", normalize_address(self.data_service))
            if self.skip_corrupt:
                raise ValueError(
                    "ReadConfig.skip_corrupt=True cannot be used with data_service: the records lost would "
                    "be counted in the service's workers, not here; repair the shard or read without the service"
                )
        if self.data_service_sharding not in ("auto", "static", "dynamic"):
            raise ValueError(
                f"ReadConfig.data_service_sharding is {self.data_service_sharding!r}; expected 'auto', 'static' "
                "or 'dynamic'"
            )
        if not _is_real(self.data_service_timeout_s) or not self.data_service_timeout_s > 0:
            raise ValueError(
                f"ReadConfig.data_service_timeout_s must be a finite number > 0 (got {self.data_service_timeout_s!r})"
            )

    def _check_cache(self) -> None:
        """The shard cache's look-ahead and folder; makes `cache_dir` absolute."""
        if (
            not isinstance(self.cache_lookahead, int)
            or isinstance(self.cache_lookahead, bool)
            or self.cache_lookahead < 0
        ):
            raise ValueError(f"ReadConfig.cache_lookahead must be an int >= 0 (got {self.cache_lookahead!r})")
        if self.cache_dir is not None:
            if not isinstance(self.cache_dir, (str, os.PathLike)) or "://" in os.fspath(self.cache_dir):
                raise ValueError(f"ReadConfig.cache_dir must be a local folder (got {self.cache_dir!r})")
            object.__setattr__(self, "cache_dir", os.path.abspath(os.fspath(self.cache_dir)))
            if self.data_service is not None:
                raise ValueError(
                    "ReadConfig.cache_dir cannot be used with data_service: the service's workers read the shards, "
                    "and this process's cache is not theirs"
                )

    def _check_s3(self) -> None:
        """The s3:// endpoint (an http(s) URL) and profile (a non-blank name), when given."""
        if not storage.is_endpoint_url(self.s3_endpoint_url):
            raise ValueError(
                f"ReadConfig.s3_endpoint_url must be an http:// or https:// URL (got {self.s3_endpoint_url!r})"
            )
        if self.s3_profile is not None and not (isinstance(self.s3_profile, str) and self.s3_profile.strip()):
            raise ValueError(f"ReadConfig.s3_profile must be a profile name (got {self.s3_profile!r})")

    def resolved_deterministic(self, seed: int | None, *, training: bool) -> bool:
        """`deterministic`, with None meaning: deterministic when evaluating, and when training with a seed.

        Evaluation has no randomness, so its order must not vary either: Keras users gather
        `y_true` in one pass and `model.predict` in another, and pair them by position.
        """
        if self.deterministic is not None:
            return self.deterministic
        return not training or seed is not None

    def with_options(self, **overrides: Any) -> ReadConfig:
        """A copy with `overrides` applied; an unknown name is an error that names it."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"unknown ReadConfig option(s) {unknown}; expected some of {sorted(known)}")
        return dataclasses.replace(self, **overrides)
