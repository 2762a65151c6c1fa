"""Run in a subprocess: one half of a run stopped mid-epoch and resumed in another process.

Usage:
  python resume_check.py save OUT.json DATA_DIR CKPT_DIR STEPS [--training] [--cache DIR]
      reads STEPS batches, saves `tf.train.Checkpoint(iterator=...)` in CKPT_DIR, and stops there.
  python resume_check.py restore OUT.json DATA_DIR CKPT_DIR STEPS [--training] [--cache DIR]
      restores that checkpoint into a fresh iterator and reads STEPS more batches (or to the end).
  python resume_check.py step OUT.json DATA_DIR GLOBAL_BATCH STEPS --replicas R --initial_step K [--training]
      under MirroredStrategy on R logical CPUs, reads from step K of epoch 1 for STEPS global steps.

Writes [[key, sha1 of the uint8 pixels], ...] in the order the examples came (a global step's
replicas in replica order), so the halves can be compared with one uninterrupted run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys

import tensorflow as tf

TRAIN_SEED = 11
EPOCH = 1  # the step mode resumes in the second epoch, so the epoch numbering is under test too


def examples(images: tf.Tensor, keys: tf.Tensor) -> list[list[str]]:
    return [
        [key.decode(), hashlib.sha1(image.tobytes()).hexdigest()]
        for key, image in zip(keys.numpy(), images.numpy(), strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("save", "restore", "step"))
    parser.add_argument("out")
    parser.add_argument("data_dir")
    parser.add_argument("where")  # the checkpoint folder, or the global batch size
    parser.add_argument("steps", type=int)
    parser.add_argument("--training", action="store_true")
    parser.add_argument("--cache")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--initial_step", type=int, default=0)
    parser.add_argument("--seed", type=int, default=TRAIN_SEED)
    args = parser.parse_args()
    if args.mode == "step":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
    import tfdata_readers as tfr

    training = dict(training=True, seed=args.seed) if args.training else {}
    config = tfr.ReadConfig(dtype="uint8", cache_dir=args.cache, num_epochs=None if args.training else 1)
    seen: list[list[str]] = []
    if args.mode == "step":
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
        dataset = tfr.distribute(
            strategy,
            args.data_dir,
            "train",
            int(args.where),
            config=config,
            with_metadata=True,
            initial_epoch=EPOCH if args.training else 0,
            initial_step=args.initial_step,
            **training,
        )
        for step, (images, _, meta) in enumerate(dataset):
            if step == args.steps:
                break
            for local_images, local_keys in zip(
                strategy.experimental_local_results(images),
                strategy.experimental_local_results(meta["key"]),
                strict=True,
            ):
                seen += examples(local_images, local_keys)
    else:
        dataset = tfr.make_dataset(args.data_dir, "train", 5, config=config, with_metadata=True, **training)
        iterator = iter(dataset)
        checkpoint = tf.train.Checkpoint(iterator=iterator)
        if args.mode == "restore":
            checkpoint.restore(tf.train.latest_checkpoint(args.where)).assert_consumed()
        for step, (images, _, meta) in enumerate(iterator):
            seen += examples(images, meta["key"])
            if step + 1 == args.steps:
                break
        if args.mode == "save":
            checkpoint.save(str(pathlib.Path(args.where) / "reader"))
    pathlib.Path(args.out).write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
