"""`distribute`: the reader under a tf.distribute strategy, one input pipeline per worker."""

from __future__ import annotations

import os
from typing import Any

import tensorflow as tf

from tfdata_readers.config import check_batch_size
from tfdata_readers.pipeline import make_dataset

__all__ = ["distribute"]


def distribute(
    strategy: tf.distribute.Strategy,
    data_dir: str | os.PathLike[str],
    split: str,
    global_batch_size: int,
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
    """
    check_batch_size("global_batch_size", global_batch_size)
    if global_batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            f"global_batch_size {global_batch_size} is not divisible by the "
            f"{strategy.num_replicas_in_sync} replicas in sync"
        )

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        return make_dataset(data_dir, split, batch_size, input_context=input_context, **options)

    return strategy.distribute_datasets_from_function(dataset_fn)
