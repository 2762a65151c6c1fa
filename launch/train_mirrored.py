"""Trains a small Keras CNN with model.fit under MirroredStrategy on the conversion job's shards.

    python launch/train_mirrored.py --data_dir OUT [--num_replicas 2] [--epochs 1] [--steps_per_epoch N]
                                    [--input_dtype uint8] [--data_service grpc://HOST:PORT]
                                    [--validation_split validation] [--save_path model.keras] [--initial_epoch K]

On GPUs the strategy mirrors over all of them. `--num_replicas N` splits the CPU into N logical
devices first, so the same script runs multi-replica on a laptop or in CI. Steps per epoch come
from the manifest (`steps_per_epoch`), not from counting records. `--input_dtype uint8` feeds uint8
batches and scales them inside the model (on each replica's device): a quarter of the bytes to copy,
and no float conversion on the host. `--data_service ADDRESS` runs the reader's pipeline on a
tf.data service (`launch/data_service.sh start` prints the address): this process only receives
batches, and its CPUs are left to the training step.

After every epoch the model is evaluated on the validation split (`--validation_split`, by default
"validation" when the manifest has one; "" for none), read once, in order, with no augmentation.
`--save_path PATH.keras` saves the trained model in Keras's format at the end. `--initial_epoch K`
resumes at epoch K: Keras counts from K, and the reader replays the order and crops an
uninterrupted run had from epoch K on.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # Imported where used, after the arguments: --help and a bad flag answer at once.
    import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import tfdata_readers  # noqa: E402
from tfdata_readers.service import dispatcher  # noqa: E402


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int (got {value})")
    return value


def make_strategy(num_replicas: int | None) -> tf.distribute.MirroredStrategy:
    """Mirrors over the GPUs; with num_replicas on a CPU-only machine, over N logical CPUs."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    gpus = tf.config.list_physical_devices("GPU")
    if gpus or not num_replicas:
        return tf.distribute.MirroredStrategy()
    # Must happen before anything initialises the TensorFlow runtime.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas)
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_replicas)])


def build_model(input_shape: tuple[int, int, int], num_classes: int, *, input_dtype: str = "float32") -> tf.keras.Model:
    """A small CNN: enough to check that gradients flow, cheap enough for CPUs.

    With uint8 input the first layer scales to [0, 1], as the reader does for float32 by default.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    scaling = [tf.keras.layers.Rescaling(1.0 / 255.0)] if input_dtype == "uint8" else []
    return tf.keras.Sequential(
        [
            tf.keras.Input(input_shape, dtype=input_dtype),
            *scaling,
            tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
            tf.keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
            tf.keras.layers.Conv2D(64, 3, strides=2, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(num_classes),
        ]
    )


def _validation_split(args: argparse.Namespace, info: tfdata_readers.DatasetInfo) -> str | None:
    """The split to evaluate on after each epoch, or None: the one named, else "validation" if present."""
    if args.validation_split is None:
        return "validation" if "validation" in info.splits and args.split != "validation" else None
    if args.validation_split == "":
        return None
    info.split(args.validation_split)  # an unknown split fails here, naming the manifest's splits
    return args.validation_split


def validation_batch_size(num_examples: int, global_batch_size: int, num_replicas: int) -> int | None:
    """The batch size closest to the training one (a multiple of the replicas, as it is) at which
    every validation batch, the last included, holds at least one example per replica; None when the
    split is smaller than that.

    Keras splits each global batch across the replicas, and a replica handed an empty part fails
    (AddN of [1, ...] and [0, ...]); every example is still evaluated once, none is dropped.
    """
    if num_examples < num_replicas:
        return None
    # Multiples of the replicas only: a full batch they do not divide fails the same way ([4] != [3]).
    candidates = [
        *range(global_batch_size, 0, -num_replicas),
        *range(global_batch_size + num_replicas, num_examples + 2 * num_replicas, num_replicas),
    ]
    return next(b for b in candidates if num_examples % b == 0 or num_examples % b >= num_replicas)


def _start(
    args: argparse.Namespace, strategy: tf.distribute.Strategy
) -> tuple[tfdata_readers.DatasetInfo, int, tuple[int, int], tf.distribute.DistributedDataset, tf.data.Dataset | None]:
    """(manifest, steps per epoch, image size, dataset, validation dataset or None); raises OSError
    or ValueError naming what is wrong."""
    # One version for everything below (steps, training, validation), resolved once: a commit
    # while this trainer starts must not give it the step count of one version and the data of another.
    info = tfdata_readers.load_manifest(args.data_dir, version=args.version)
    version = info.version
    full_batches = tfdata_readers.steps_per_epoch(
        args.data_dir, args.split, args.global_batch_size, drop_remainder=True, version=version
    )
    # Checked whether or not --steps_per_epoch is given: training drops the last partial batch, so
    # a split smaller than one global batch yields no batch at all, however many steps are asked for.
    if full_batches < 1:
        raise ValueError(
            f"split {args.split!r} has {info.split(args.split).num_examples} examples: fewer than one "
            f"global batch of {args.global_batch_size}"
        )
    steps = args.steps_per_epoch or full_batches
    size = (args.image_size, args.image_size) if args.image_size else (info.image.height, info.image.width)
    # num_epochs=None: Keras keeps one iterator across epochs when steps_per_epoch is given.
    dataset = tfdata_readers.distribute(
        strategy,
        args.data_dir,
        args.split,
        args.global_batch_size,
        training=True,
        seed=args.seed,
        num_epochs=None,
        image_size=size,
        dtype=args.input_dtype,
        data_service=args.data_service,
        data_service_timeout_s=args.data_service_timeout_s,
        initial_epoch=args.initial_epoch,
        version=version,
    )
    validation = None
    split = _validation_split(args, info)
    batch = None
    if split:
        count = info.split(split).num_examples
        batch = validation_batch_size(count, args.global_batch_size, strategy.num_replicas_in_sync)
        if batch is None:
            # An empty split (the job writes one when all its rows became dead letters, and warns)
            # ends Keras's fit with a bare StopIteration; one smaller than the replicas leaves one
            # an empty batch. Training on is what the user wants.
            why = (
                "has no examples"
                if count == 0
                else (f"has {count} example(s), fewer than the {strategy.num_replicas_in_sync} replicas")
            )
            print(f"{split} split {why}: not validating", file=sys.stderr)
    if batch is not None:
        # One ordered pass per evaluation, every example once; its cardinality gives Keras the steps.
        # A plain dataset of global batches, which Keras splits across the replicas: a distributed
        # one deals whole per-replica batches, so the last step can leave a replica an empty batch,
        # and TensorFlow's CPU convolution fails on one ("input depth must be evenly divisible").
        validation = tfdata_readers.make_dataset(
            args.data_dir,
            split,
            batch,
            image_size=size,
            dtype=args.input_dtype,
            version=version,
        )
    return info, steps, size, dataset, validation


def main(argv: Sequence[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(prog="train_mirrored.py", description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", required=True, help="directory (or gs://) with dataset_info.json")
    parser.add_argument("--split", default="train")
    parser.add_argument(
        "--version",
        type=_positive_int,
        default=None,
        help="train on this version of the dataset (default: the current one, resolved once at start)",
    )
    parser.add_argument(
        "--num_replicas",
        type=_positive_int,
        default=None,
        help="without GPUs: split the CPU into this many logical devices",
    )
    parser.add_argument("--global_batch_size", type=_positive_int, default=32)
    parser.add_argument("--epochs", type=_positive_int, default=1)
    parser.add_argument(
        "--steps_per_epoch",
        type=_positive_int,
        default=None,
        help="default: from the manifest (more than one epoch's batches repeats the data)",
    )
    parser.add_argument(
        "--image_size", type=_positive_int, default=None, help="train at this square size (default: stored)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--input_dtype",
        choices=("float32", "uint8"),
        default="float32",
        help="uint8: the reader hands on 0-255 pixels and the model scales them on the device",
    )
    parser.add_argument(
        "--data_service",
        default=None,
        metavar="ADDRESS",
        help="grpc://HOST:PORT of a tf.data service dispatcher: decode on its workers",
    )
    parser.add_argument(
        "--data_service_timeout_s",
        type=float,
        default=60.0,
        metavar="S",
        help="with --data_service: how long the dispatcher may not answer (at start-up, or while "
        "training) before this process stops with an error [60]",
    )
    parser.add_argument(
        "--validation_split",
        default=None,
        metavar="SPLIT",
        help="evaluate on this split after every epoch (default: 'validation' if the manifest has it; '' for none)",
    )
    parser.add_argument(
        "--save_path",
        type=pathlib.Path,
        default=None,
        metavar="PATH.keras",
        help="save the trained model here, in Keras's .keras format",
    )
    parser.add_argument(
        "--initial_epoch",
        type=int,
        default=0,
        metavar="K",
        help="resume at epoch K: Keras counts from K, and the reader replays epoch K's order and crops",
    )
    parser.add_argument("--history_json", type=pathlib.Path, help="write the loss history here")
    args = parser.parse_args(argv)
    from tfdata_readers._quiet_start import import_tensorflow_for_training  # pylint: disable=import-outside-toplevel

    # TensorFlow's start-up lines once each, not twice; without it: one line naming the extra, exit 2.
    import_tensorflow_for_training(parser.prog)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    if args.save_path is not None and args.save_path.suffix != ".keras":
        parser.error(f"--save_path must end in .keras (Keras's model format) (got {str(args.save_path)!r})")
    if not 0 <= args.initial_epoch < args.epochs:
        parser.error(f"--initial_epoch must be >= 0 and below --epochs {args.epochs} (got {args.initial_epoch})")
    if not args.data_service_timeout_s > 0:
        parser.error(f"--data_service_timeout_s must be > 0 (got {args.data_service_timeout_s})")

    strategy = make_strategy(args.num_replicas)
    try:
        info, steps, size, dataset, validation = _start(args, strategy)
    except (OSError, ValueError) as e:
        # A refusal at start-up (no manifest, an unknown split, a split smaller than a global batch,
        # a batch that the replicas do not divide, a bad shard or manifest) is the user's to fix: one
        # line naming it and exit 2, as argparse does for a bad flag, not a traceback.
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    with strategy.scope():
        model = build_model((*size, info.image.channels), info.num_classes, input_dtype=args.input_dtype)
        model.compile(
            optimizer=tf.keras.optimizers.Adam(1e-3),
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    print(
        f"training on {strategy.num_replicas_in_sync} replica(s), {steps} steps/epoch, "
        f"global batch {args.global_batch_size}, images {size} {args.input_dtype}"
        + (f", input from the tf.data service at {args.data_service}" if args.data_service else "")
        + (f", validating on {int(validation.cardinality())} steps" if validation is not None else "")
    )
    with contextlib.ExitStack() as stack:
        if args.data_service:
            # TensorFlow waits forever, silently, for a stopped service; this ends the process with
            # one line instead (the main thread is blocked inside TensorFlow, out of reach of an exception).
            stack.enter_context(
                dispatcher.DispatcherWatchdog(
                    args.data_service, args.data_service_timeout_s, prefix=f"{parser.prog}: error: "
                )
            )
        history = model.fit(
            dataset,
            epochs=args.epochs,
            steps_per_epoch=steps,
            initial_epoch=args.initial_epoch,
            validation_data=validation,
            validation_steps=None if validation is None else int(validation.cardinality()),
            shuffle=False,
            verbose=2,
        )
    losses = [float(v) for v in history.history["loss"]]
    if not all(math.isfinite(v) for v in losses):
        raise FloatingPointError(f"loss is not finite: {losses}")
    result = {"loss": losses, "num_replicas": [strategy.num_replicas_in_sync], "steps_per_epoch": [steps]}
    if validation is not None:
        result["val_loss"] = [float(v) for v in history.history["val_loss"]]
        result["val_accuracy"] = [float(v) for v in history.history["val_accuracy"]]
    if args.save_path is not None:
        args.save_path.parent.mkdir(parents=True, exist_ok=True)
        model.save(args.save_path)
        print(f"saved the model to {args.save_path}")
    if args.history_json:
        args.history_json.write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
