"""Hands the reader's pipeline to tf.data service workers, and checks on the trainer what comes back.

The reader builds its whole pipeline (file pieces, interleave, shuffle, batch, parse, decode,
augment) as usual; `through_service` registers it with the dispatcher, so service workers run
it and the trainer only receives finished batches.

Which sharding, and why:
  - Evaluation: static sharding (`ShardingPolicy.FILE`). Each service worker reads a fixed part of
    this input pipeline's shard pieces (dealt by its index in the dispatcher's worker list), all
    of it, once: every example exactly once per epoch while no worker fails. It needs the
    dispatcher's fixed worker list (`launch/data_service.sh` gives it).
  - Training: dynamic sharding (`distributed_epoch`). The dispatcher hands out shard pieces one at
    a time to whichever worker asks, so a fast worker does more and a lost worker's remaining
    pieces go to the others; a piece is handed out once per pass, so each pass delivers an
    example at most once. The stream never ends (`num_epochs=None`): every worker drops its own
    last partial batch, so a finite pass would end with a batch count the trainer cannot know.
    A global step is whole: under tf.distribute the strategy deals each pipeline's consecutive
    batches to its replicas, and batches from two workers, or from the end of one pass and the
    start of the next, held the same example twice in one step. So the workers group the batches
    of one step before the pass repeats (`group_steps`), and the trainer ungroups them
    (`ungroup_steps`): a step is one worker's consecutive batches of one pass. A Keras epoch of
    `steps_per_epoch` steps is still not a pass: the workers' passes are not aligned to it, and
    each drops its last incomplete step.

Under tf.distribute every input pipeline (one per trainer worker) registers its own pipeline,
with its own share of the records, and reads it as its own job: the shares are exact already,
and a job has one reader. Coordinated reads (one shared job, `consumer_index`/`num_consumers`)
would need an endless dataset, so an evaluation epoch could never end.

At start-up (`check_dispatcher`, `check_workers_see`, each bounded by `data_service_timeout_s`) the
dispatcher must answer as one, and every worker must see every shard path: TensorFlow itself
retries all of these silently and without end. The path check is the service's first job: its
start (TensorFlow registering it, the workers taking it on a heartbeat) may take up to
`START_UP_S` apart from that deadline, for as long as the dispatcher keeps answering. A service
lost later, mid-read, is beyond the reader's reach (its thread is blocked inside TensorFlow):
`dispatcher.DispatcherWatchdog` ends the process with one line instead, as `launch/train_mirrored.py` does.

A lost worker: TensorFlow's client waits for a failed worker to come back at the same address
(`launch/data_service.sh` restarts it, as a cluster's scheduler would). Static sharding then reads
that worker's part again from its start (duplicates); dynamic sharding loses the pieces the dead
worker had in progress. `expect_examples` turns either into an error at the end of an evaluation
epoch instead of a silently wrong metric.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tfdata_readers.service.dispatcher import ACCEPTED_FORMS, ask_dispatcher, parse_host_port

__all__ = [
    "CHECK_END_S",
    "START_UP_S",
    "check_dispatcher",
    "check_workers_see",
    "expect_examples",
    "group_steps",
    "normalize_address",
    "replicas_per_step",
    "through_service",
    "ungroup_steps",
]

SHARDING_MODES = ("auto", "static", "dynamic")

# How long the service may take to start the path check's job, when data_service_timeout_s is
# shorter: on a cold, busy machine a healthy service's first job took longer than the 10 s default.
START_UP_S = 120.0

logger = logging.getLogger(__name__)


def normalize_address(address: str) -> str:
    """ "grpc://host:port" from "grpc://host:port" or "host:port"; a ValueError naming the value otherwise."""
    if not isinstance(address, str):
        raise ValueError(f"data_service must be None or {ACCEPTED_FORMS} (got {address!r})")
    host, port = parse_host_port(address, flag="ReadConfig.data_service")
    return f"grpc://{host}:{port}"


def check_dispatcher(address: str, timeout_s: float) -> list[str]:
    """The dispatcher's registered workers; a ConnectionError naming the address when no tf.data
    dispatcher answers there within `timeout_s` (nothing listening, another program, no answer).

    TensorFlow retries registering a dataset with such an address for a long time without a word,
    so a mistyped address or a port reused by another program would look like a hung trainer.
    """
    return ask_dispatcher(address, timeout_s)


# Once the workers have checked the paths, the reader learns that the check's job has ended from
# its heartbeats with the dispatcher (about a second apart), not from the workers: a check that
# took no time can still take a heartbeat or two to end. With a data_service_timeout_s of 1 s, a
# healthy service was reported hung once in seven tries on a 2-core machine.
CHECK_END_S = 3.0


def check_workers_see(address: str, paths: Sequence[str], timeout_s: float, *, start_up_s: float = START_UP_S) -> None:
    """Fails, naming the address, unless every service worker reports that it can see every path
    in `paths`.

    The workers open the shard paths this process lists; TensorFlow retries a path a worker cannot
    open without a word and without end (a relative path, a local disk the workers do not share).
    So a tiny job is run first, by every worker (`parallel_epochs`), yielding a start mark and then
    the paths it cannot find. It runs in a daemon thread so that a service whose workers never
    answer fails instead of hanging here, after one of two deadlines, because they bound
    different waits:
      - the job's start (up to the first worker's mark): TensorFlow registers the job and the
        workers take it on their next heartbeat, seconds on a cold, busy machine. It may take
        `max(timeout_s, start_up_s)` while the dispatcher answers (asked every few seconds, so a
        service that goes away fails within `timeout_s`); a log record says when it takes longer
        than `timeout_s`.
      - the check itself, from that mark: `timeout_s`, for every worker to look at every path,
        and CHECK_END_S for the service to say that the check has ended.
    """
    marked = tf.data.Dataset.from_tensors(tf.constant("", tf.string)).concatenate(
        tf.data.Dataset.from_tensor_slices(tf.constant(sorted(set(paths)), tf.string)).filter(
            lambda path: tf.equal(tf.size(tf.io.matching_files(path)), 0)
        )
    )
    probe = marked.apply(tf.data.experimental.service.distribute(processing_mode="parallel_epochs", service=address))
    events: queue.Queue[tuple[str, Any]] = queue.Queue()

    def run() -> None:
        try:
            missing = set()
            for path in probe.as_numpy_iterator():
                if not path:  # a worker's start mark (no shard path is empty)
                    events.put(("started", None))
                else:
                    missing.add(path.decode())
            events.put(("missing", sorted(missing)))
        except Exception as e:  # reported below, in the caller's thread
            events.put(("error", e))

    threading.Thread(target=run, name="tf.data service path check", daemon=True).start()
    kind, value = _await_start(events, address, timeout_s, start_up_s)
    deadline = time.monotonic() + timeout_s + CHECK_END_S
    while kind == "started":
        try:
            kind, value = events.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise ConnectionError(
                f"the tf.data service at {address} started the check of the shard paths but its workers did not "
                f"finish it within {timeout_s:g} s (data_service_timeout_s) and {CHECK_END_S:g} s for the "
                f"service to say so: is a worker hung, or a shard path on a file system that does not answer?"
            ) from None
    _report(kind, value, address, paths)


def _await_start(events: queue.Queue, address: str, timeout_s: float, start_up_s: float) -> tuple[str, Any]:
    """The path check's first event, waited for up to the longer of `timeout_s` and `start_up_s`
    while the dispatcher answers (it is asked every few seconds: `check_dispatcher` raises, naming
    it, once it does not)."""
    allowed = max(timeout_s, start_up_s)
    began = time.monotonic()
    logged = False
    while True:
        waited = time.monotonic() - began
        if waited >= allowed:
            raise ConnectionError(
                f"the tf.data service at {address} did not run a check of the shard paths within {allowed:g} s, "
                f"though its dispatcher answered (the longer of data_service_timeout_s and the {start_up_s:g} s "
                f"allowed for a first job to start): are its workers running and registered "
                f"(launch/data_service.sh status)?"
            )
        if waited >= timeout_s and not logged:
            logged = True
            logger.warning(
                "the tf.data service at %s has not started the check of the shard paths after %g s "
                "(data_service_timeout_s); its dispatcher answers, so waiting up to %g s in all for its workers",
                address,
                timeout_s,
                allowed,
            )
        try:
            # Every few seconds (not more often than twice a second, whatever timeout_s).
            return events.get(timeout=min(max(0.5, min(5.0, timeout_s)), allowed - waited))
        except queue.Empty:
            check_dispatcher(address, timeout_s)


def _report(kind: str, value: Any, address: str, paths: Sequence[str]) -> None:
    """Raises what the path check found: its error, or the paths the workers cannot see."""
    if kind == "error":
        first = getattr(value, "message", str(value)).strip().splitlines()[0]
        raise ConnectionError(f"the tf.data service at {address} could not check the shard paths: {first}") from None
    if value:
        raise FileNotFoundError(
            f"tf.data service workers at {address} cannot see {len(value)} of the {len(set(paths))} shard "
            f"file(s), e.g. {value[0]}: the workers open the paths this process reads, so the shards must be "
            f"readable on every worker at the same path (gs://, or a shared file system)"
        )


def through_service(dataset: tf.data.Dataset, address: str, *, dynamic: bool) -> tf.data.Dataset:
    """`dataset`, run by the service's workers: static (FILE) or dynamic (`distributed_epoch`) sharding.

    Each iteration is a new anonymous job with this iterator as its only reader.
    """
    policy = tf.data.experimental.service.ShardingPolicy
    return dataset.apply(
        tf.data.experimental.service.distribute(
            processing_mode=policy.DYNAMIC if dynamic else policy.FILE,
            service=address,
            # TensorFlow's default ("AUTO") compresses every batch with snappy. Decoded pixels barely
            # compress, and benchmarks/data_service.py measured the trainer at 0.47-0.69 CPU s per
            # 1,000 float32 images with it, 0.32-0.45 without (the plain reader, decoding: 0.65-0.72).
            compression=None,
        )
    )


def replicas_per_step(input_context: tf.distribute.InputContext | None) -> int:
    """How many consecutive batches of one input pipeline make one global step (its replicas)."""
    if input_context is None:
        return 1
    return max(1, input_context.num_replicas_in_sync // input_context.num_input_pipelines)


def group_steps(dataset: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """On the workers, before the pass repeats: `replicas` consecutive batches as one element, so
    that the service hands a trainer a whole step or nothing (an incomplete last group is dropped,
    as an incomplete batch is in training)."""
    return dataset if replicas == 1 else dataset.batch(replicas, drop_remainder=True)


def ungroup_steps(dataset: tf.data.Dataset, replicas: int) -> tf.data.Dataset:
    """On the trainer: the batches of each group back in order, for the strategy to deal."""
    return dataset if replicas == 1 else dataset.unbatch()


def _empty_like(spec: tf.TensorSpec) -> tf.Tensor:
    """An empty batch (0 rows) of `spec`'s dtype and known inner dimensions, for an end marker."""
    return tf.zeros([0, *[d if d is not None else 0 for d in spec.shape[1:]]], spec.dtype)


def expect_examples(dataset: tf.data.Dataset, expected: int, message: str) -> tf.data.Dataset:
    """`dataset` ((image, label[, metadata]) batches), failing at its end with `message` unless its
    batches held exactly `expected` examples in all.

    Runs on the trainer, after the service: a sum of batch sizes, nothing copied. It catches a
    lost worker's undelivered examples and a restarted worker's repeated ones (both at once, in
    equal numbers, would cancel out; the exactly-once tests check keys).
    """
    end = tf.data.Dataset.from_tensors((tf.nest.map_structure(_empty_like, dataset.element_spec), tf.constant(True)))
    marked = dataset.map(lambda *element: (element, tf.constant(False))).concatenate(end)

    def count(seen: tf.Tensor, item: tuple[Any, tf.Tensor]) -> tuple[tf.Tensor, Any]:
        element, is_end = item
        seen += tf.shape(element[1], out_type=tf.int64)[0]  # the label batch's size
        ok = tf.logical_or(tf.logical_not(is_end), tf.equal(seen, expected))
        checked = tf.debugging.Assert(ok, [message, seen], summarize=1)
        with tf.control_dependencies([checked]):
            return seen, (tf.nest.map_structure(tf.identity, element), is_end)

    return (
        marked.scan(tf.constant(0, tf.int64), count)
        .filter(lambda element, is_end: tf.logical_not(is_end))
        .map(lambda element, is_end: element)
    )
