"""Records -> the batches of every pass: an epoch's seeded shuffles in training, one fixed order
in evaluation, and the steps already taken skipped when resuming mid-epoch (read, never decoded).

Every order and crop is a pure function of (the seed, the epoch number): that is what lets a run
resumed at epoch k, or at step s of it, reproduce what the uninterrupted run had.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tfdata_readers.config import MAX_SEED
from tfdata_readers.stages.decode import decode_batches
from tfdata_readers.stages.plan import ReaderPlan

__all__ = ["evaluation_passes", "training_passes"]

# pieces (a `records.piece_dataset` in some order) -> (serialized, name) records
ReadPieces = Callable[[tf.data.Dataset], tf.data.Dataset]


def training_passes(plan: ReaderPlan, pieces: tf.data.Dataset, read_pieces: ReadPieces) -> tf.data.Dataset:
    """The output batches of epochs `initial_epoch`, `initial_epoch + 1`, ... (`num_epochs` of them)."""
    config, batch_size = plan.config, plan.batch_size
    cached = None
    if config.cache:
        # Cached once, outside the passes, so every pass reads memory; the piece order is then
        # epoch 0's, whatever `initial_epoch`, as an uninterrupted run's cache holds it.
        first = pieces
        if plan.shuffle_pieces:
            first = _seeded_shuffle(pieces, len(plan.share.pieces), _pass_seed(plan.local_seed, 0, _PIECES))
        cached = read_pieces(first).cache()

    def one_pass(epoch: tf.Tensor) -> tf.data.Dataset:
        """The batches of epoch `epoch`: every shuffle and crop is a pure function of it and the seed."""
        if cached is not None:
            records = cached
        else:
            ordered = pieces
            if plan.shuffle_pieces:
                ordered = _seeded_shuffle(pieces, len(plan.share.pieces), _pass_seed(plan.local_seed, epoch, _PIECES))
            records = read_pieces(ordered)
        records = _seeded_shuffle(records, config.shuffle_buffer_size, _pass_seed(plan.local_seed, epoch, _RECORDS))
        # Resuming mid-epoch: the steps already taken are read, never decoded.
        skipped = tf.where(tf.equal(epoch, plan.initial_epoch), tf.constant(plan.skipped_batches, tf.int64), 0)
        if plan.skipped_batches:
            records = records.skip(skipped * batch_size)
        batches = records.batch(batch_size, drop_remainder=plan.drop_remainder)  # ([B] serialized, [B] name)
        epoch_seed = _augment_seed(plan.base_seed, epoch)  # [2], with each key it seeds an example's crop and flip
        return decode_batches(plan, batches.map(lambda serialized, names: ((serialized, names), epoch_seed)), skipped)

    return _epoch_numbers(plan.initial_epoch, config.num_epochs).flat_map(one_pass)


def evaluation_passes(plan: ReaderPlan, pieces: tf.data.Dataset, read_pieces: ReadPieces) -> tf.data.Dataset:
    """The output batches of `num_epochs` passes in the share's order, the first from `initial_step` on."""
    config = plan.config
    records = read_pieces(pieces)
    if config.cache:
        records = records.cache()

    def eval_pass(skipped: int) -> tf.data.Dataset:
        skipping = records.skip(skipped * plan.batch_size) if skipped else records
        batches = skipping.batch(plan.batch_size, drop_remainder=plan.drop_remainder)  # ([B] serialized, [B] name)
        # An unused seed keeps one signature.
        seeded = batches.map(lambda serialized, names: ((serialized, names), tf.zeros([2], tf.int64)))
        return decode_batches(plan, seeded, skipped)

    dataset = eval_pass(plan.skipped_batches)
    if plan.skipped_batches and config.num_epochs != 1:
        # Resuming mid-epoch: only the first pass starts part-way.
        later = None if config.num_epochs is None else config.num_epochs - 1
        return dataset.concatenate(eval_pass(0).repeat(later))
    if config.num_epochs != 1:
        return dataset.repeat(config.num_epochs)
    return dataset


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
