"""Run in a subprocess: `distribute` under MirroredStrategy (2 and 3 logical CPUs) on a version with unequal shards.

Usage: python versioned_mirrored_check.py OUT.json DATA_DIR OVERWRITE_FLAT_DIR
DATA_DIR's current version lists old shards plus an append's smaller ones. Logical devices must be
configured before TensorFlow initialises, hence a separate process. Writes {check: problem or ""}:
  eval: every example exactly once, every per-replica batch at most the per-replica size;
  train: two epochs, each a whole number of steps with a full batch on every replica, no example
    twice, fewer than one global batch dropped;
  train repeat: num_epochs=None with steps_per_epoch steps per epoch: the same, over 3 epochs;
  commit mid-read: 3 evaluation epochs of a dataset built on the current version, with the next
    version (an overwrite of OVERWRITE_FLAT_DIR's shards) committed during the second (in a copy
    of DATA_DIR): each epoch delivers the built version's examples exactly once with its labels.
"""

from __future__ import annotations

import collections
import json
import pathlib
import shutil
import sys
import tempfile

import tensorflow as tf

REPLICA_COUNTS = (2, 3)
PER_REPLICA_BATCH = 2


def main(out: str, data_dir: str, overwrite_from: str) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * max(REPLICA_COUNTS))
    sys.path[:0] = [str(pathlib.Path(__file__).resolve().parents[2]), str(pathlib.Path(__file__).resolve().parent)]
    from versioned_fixtures import commit_overwrite, examples_of, run_name

    import tfdata_readers as tfr

    expected = collections.Counter(examples_of(data_dir, "train"))
    results: dict[str, str] = {}
    for replicas in REPLICA_COUNTS:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
        global_batch = PER_REPLICA_BATCH * replicas
        name = f"replicas={replicas}"

        def steps_of(dataset, limit: int | None = None, strategy=strategy) -> list[list[list[tuple[str, int]]]]:
            """Each step's per-replica (key, label) lists."""
            steps = []
            for number, (_, labels, meta) in enumerate(dataset):
                if number == limit:
                    break
                steps.append(
                    [
                        [(k.decode(), int(label)) for k, label in zip(keys.numpy(), local_labels.numpy(), strict=True)]
                        for keys, local_labels in zip(
                            strategy.experimental_local_results(meta["key"]),
                            strategy.experimental_local_results(labels),
                            strict=True,
                        )
                    ]
                )
            return steps

        def train_problem(steps: list, epoch: str, global_batch: int = global_batch) -> str:
            if any(len(replica) != PER_REPLICA_BATCH for step in steps for replica in step):
                return f"{epoch}: per-replica batches {[[len(r) for r in s] for s in steps]}"
            pairs = [p for step in steps for replica in step for p in replica]
            if len(pairs) != len(set(pairs)) or not set(pairs) <= set(expected):
                return f"{epoch}: an example twice, or one not in the version"
            if sum(expected.values()) - len(pairs) >= global_batch:
                return f"{epoch}: dropped {sum(expected.values()) - len(pairs)} >= one global batch"
            return ""

        evaluation = steps_of(tfr.distribute(strategy, data_dir, "train", global_batch, with_metadata=True))
        pairs = [p for step in evaluation for replica in step for p in replica]
        results[f"{name} eval"] = (
            ""
            if collections.Counter(pairs) == expected
            and all(len(r) <= PER_REPLICA_BATCH for s in evaluation for r in s)
            else f"eval delivered {len(pairs)} ({len(set(pairs))} distinct) of {sum(expected.values())}"
        )

        steps_per_epoch = tfr.steps_per_epoch(data_dir, "train", global_batch)
        train = tfr.distribute(strategy, data_dir, "train", global_batch, with_metadata=True, training=True, seed=3)
        problems = []
        for epoch in (1, 2):
            steps = steps_of(train)
            if len(steps) != steps_per_epoch:
                problems.append(f"epoch {epoch}: {len(steps)} steps, steps_per_epoch says {steps_per_epoch}")
            problems.append(train_problem(steps, f"epoch {epoch}"))
        results[f"{name} train"] = "; ".join(p for p in problems if p)

        endless = tfr.distribute(
            strategy, data_dir, "train", global_batch, with_metadata=True, training=True, seed=3, num_epochs=None
        )
        steps = steps_of(endless, 3 * steps_per_epoch)
        results[f"{name} train repeat"] = "; ".join(
            p
            for p in (
                train_problem(steps[e * steps_per_epoch : (e + 1) * steps_per_epoch], f"epoch {e + 1}")
                for e in range(3)
            )
            if p
        )

        # A copy per strategy: each commits its own next version.
        copy = pathlib.Path(tempfile.mkdtemp()) / "data"
        shutil.copytree(data_dir, copy)
        dataset = tfr.distribute(strategy, copy, "train", global_batch, with_metadata=True)
        problems = []
        for epoch in range(3):
            epoch_pairs = []
            for number, (_, labels, meta) in enumerate(dataset):
                if epoch == 1 and number == 1:
                    commit_overwrite(copy, overwrite_from, run=run_name(50 + replicas))
                epoch_pairs += [
                    (k.decode(), int(label))
                    for keys, local in zip(
                        strategy.experimental_local_results(meta["key"]),
                        strategy.experimental_local_results(labels),
                        strict=True,
                    )
                    for k, label in zip(keys.numpy(), local.numpy(), strict=True)
                ]
            if collections.Counter(epoch_pairs) != expected:
                problems.append(f"epoch {epoch + 1}: {len(epoch_pairs)} examples, not the built version's")
        if tfr.current_version(copy) != tfr.load_manifest(data_dir).version + 1:
            problems.append("the next version was not committed")
        results[f"{name} commit mid-read"] = "; ".join(problems)
    pathlib.Path(out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:4])
