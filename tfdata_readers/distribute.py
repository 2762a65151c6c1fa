"""`distribute`: the reader under a tf.distribute strategy, one input pipeline per worker."""

from __future__ import annotations

import math
import os
from typing import Any, NoReturn

import tensorflow as tf

from tfdata_readers.config import ReadConfig, check_batch_size
from tfdata_readers.pipeline import make_dataset, s3_options
from tfdata_readers.sources import storage
from tfdata_readers.sources.manifest import load_manifest

__all__ = ["CLASS_WEIGHT_WITH_DISTRIBUTE", "distribute", "global_steps"]

CLASS_WEIGHT_WITH_DISTRIBUTE = (
    "model.fit(class_weight=...) cannot weight a tf.distribute dataset: Keras applies it with "
    "dataset.map, and a distributed dataset has none. Give the weights to the reader instead: "
    "tfdata_readers.distribute(strategy, data_dir, split, global_batch_size, class_weights={label id: weight}) "
    "yields (image, label, weight) batches, which Keras uses as sample weights "
    "(tfdata_readers.class_counts gives the counts for balanced weights)"
)


def global_steps(pipeline_batches: int, num_replicas: int, num_pipelines: int) -> int:
    """Global steps in `pipeline_batches` batches of one input pipeline (negative: INFINITE/UNKNOWN, as is).

    The strategy makes each global step of one batch per replica, dealing every pipeline's
    consecutive batches to the replicas it feeds; a last step may be partial.
    """
    if pipeline_batches < 0:
        return pipeline_batches
    replicas_per_pipeline = max(1, num_replicas // max(1, num_pipelines))
    return math.ceil(pipeline_batches / replicas_per_pipeline)


def distribute(
    strategy: tf.distribute.Strategy,
    data_dir: str | os.PathLike[str],
    split: str,
    global_batch_size: int,
    *,
    version: int | None = None,
    **options: Any,
) -> tf.distribute.DistributedDataset:
    """`make_dataset` per input pipeline via `distribute_datasets_from_function`.

    The InputContext picks each pipeline's share (a contiguous range of the split's records, equal
    to one record across pipelines) and the per-replica batch size, so every example is read by
    exactly one replica per epoch, and when training drops the remainder every pipeline yields the
    same number of batches. `options` are `make_dataset`'s
    keyword options (training, seed, with_metadata, config, ReadConfig fields).

    With `data_service="grpc://HOST:PORT"` each input pipeline registers its own share with the
    tf.data service and reads it as a job of its own, with itself as the only reader: under
    `MirroredStrategy` (one pipeline) that is one job whose batches the strategy deals to the
    replicas, as without the service; under `MultiWorkerMirroredStrategy` one job per trainer
    worker. A shared job with `consumer_index`/`num_consumers` (coordinated reads) is not used:
    it needs an endless dataset, so an evaluation epoch could not end, and the shares are exact
    already.

    Its `cardinality` is the number of global steps (per-replica batches over the replicas), so
    Keras shows the step total and never warns that the input "ran out of data" (TensorFlow
    itself reports the first pipeline's batch count, which counts each step once per replica).
    Weight classes with `class_weights={label id: weight}` (a `ReadConfig` field): Keras's
    `fit(class_weight=...)` cannot take a distributed dataset, and says so with the supported way.

    `version` (None: the current one) is resolved here, once, before the strategy builds any input
    pipeline: every pipeline this process builds, now or when the strategy calls the dataset
    function again, reads that same version. Each worker of a `MultiWorkerMirroredStrategy`
    resolves None in its own process, so a commit between two workers' start-ups would give them
    different versions: there, pass the version explicitly (e.g. `load_manifest(data_dir).version`
    read once by the launcher and handed to every worker).
    """
    check_batch_size("global_batch_size", global_batch_size)
    if global_batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not divisible by the "
            f"{strategy.num_replicas_in_sync} replicas in sync"
        )

    fields = {name: value for name, value in options.items() if name in ReadConfig.__dataclass_fields__}
    config = (options.get("config") or ReadConfig()).with_options(**fields)
    with storage.using(s3_options(config)):  # each pipeline's make_dataset sets them again for itself
        pinned = load_manifest(data_dir, version).version
    num_pipelines: list[int] = []  # as the strategy's InputContext says

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        num_pipelines.append(input_context.num_input_pipelines)
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        return make_dataset(data_dir, split, batch_size, input_context=input_context, version=pinned, **options)

    dataset = strategy.distribute_datasets_from_function(dataset_fn)
    # TensorFlow offers no way to give a dataset built from a function its step count, nor to
    # refuse a map; both are set on this object (the attributes TensorFlow and Keras read).
    dataset._cardinality = global_steps(  # noqa: SLF001
        int(dataset.cardinality), strategy.num_replicas_in_sync, num_pipelines[0] if num_pipelines else 1
    )
    dataset.map = _refuse_map
    return dataset


def _refuse_map(*args: Any, **kwargs: Any) -> NoReturn:
    """Keras's `class_weight` maps the dataset; instead of TensorFlow's bare AttributeError, say what works."""
    raise ValueError(CLASS_WEIGHT_WITH_DISTRIBUTE)
