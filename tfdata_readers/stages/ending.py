"""The reader's last stages: the step count Keras shows, the prefetch, the check that an iterator
restored from a checkpoint belongs to this reader, tf.data's options, and the tf.data service.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import tensorflow as tf

from tfdata_readers.config import ReadConfig
from tfdata_readers.service import reading as service_reading
from tfdata_readers.stages.plan import ReaderPlan

__all__ = ["finish_reader", "reader_identity"]


def finish_reader(plan: ReaderPlan, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The output batches of every pass -> what `make_dataset` returns."""
    config = plan.config
    if not plan.service and (not config.skip_corrupt or plan.batches_per_epoch is not None):
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(plan.total_batches))
    dataset = dataset.prefetch(config.prefetch)
    if not plan.service:
        return _refusing_other_readers_checkpoints(dataset, reader_identity(_identity(plan), config)).with_options(
            _reader_options()
        )
    dataset = dataset.with_options(_reader_options())
    # Everything above runs on the service's workers; only what follows runs here.
    return _through_service(plan, dataset)


def _identity(plan: ReaderPlan) -> dict[str, Any]:
    return {
        # The shards by content, not by place: a copy of the dataset elsewhere resumes alike.
        "shards": hashlib.sha256(" ".join(s.sha256 for s in plan.split_info.shards).encode()).hexdigest(),
        "version": plan.info.version,
        "split": plan.split,
        "batch_size": plan.batch_size,
        "training": plan.training,
        "seed": plan.base_seed if plan.training else None,
        "with_metadata": plan.with_metadata,
        "pipeline": [plan.pipeline_id, plan.share.num_pipelines],
    }


def _reader_options() -> tf.data.Options:
    tf_options = tf.data.Options()
    # Sharding is done from the InputContext (sources/files.py); TensorFlow must not shard again.
    tf_options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # So that `tf.train.Checkpoint(iterator=...)` can save the iterator mid-epoch: by default it refuses
    # any stateful op. Ours hold nothing the position depends on: the cache's counts of asked and
    # read shards (a restored piece asks for its shard again, see cached_reading.py), the tally of
    # skipped records, the counter that numbers a new iteration's epochs, and the shuffle's unused
    # seed generator (every order is a function of the seed and the epoch, and the shuffle buffers
    # are saved).
    tf_options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    # TensorFlow would add a prefetch after the identity check, whose restored buffer would hand on a
    # batch before the check compares the checkpoint's identity with this reader's.
    tf_options.experimental_optimization.inject_prefetch = False
    return tf_options


def _through_service(plan: ReaderPlan, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The batches the tf.data service's workers make of `dataset`, as this trainer receives them."""
    config, service = plan.config, plan.config.data_service
    assert service is not None
    dataset = service_reading.through_service(dataset, service, dynamic=plan.sharding == "dynamic")
    step_group = service_reading.replicas_per_step(plan.input_context) if plan.training else 1
    dataset = service_reading.ungroup_steps(dataset, step_group)
    if not plan.drop_remainder and config.num_epochs is not None:
        expected = plan.share.num_examples * config.num_epochs
        dataset = service_reading.expect_examples(
            dataset,
            expected,
            f"tfdata_readers: the tf.data service at {service} ({plan.sharding} sharding) did not deliver exactly "
            f"the {expected} examples of input pipeline {plan.pipeline_id} of {plan.share.num_pipelines} (split "
            f"{plan.split!r} of {plan.data_dir}, {config.num_epochs} epoch(s)): a service worker was lost during the "
            f"epoch. Dynamic sharding loses the pieces it was reading (fewer examples); static sharding reads its "
            f"whole part again when it restarts (more). These results are not exactly once: run the evaluation "
            f"again. Delivered:",
        )
    return dataset.prefetch(config.prefetch).with_options(_reader_options())


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
