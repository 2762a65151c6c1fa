"""The job's console: the plan line, progress from the staging folder, the final table, no chatter."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_jobs.command_line.progress import Progress, StagingWatcher, progress_file_name, tally, write_progress_plan
from beam_jobs.command_line.progress_display import LineProgress, progress_line
from beam_jobs.command_line.run_summary import format_mib, split_table
from beam_jobs.command_line.runner_ui import watch_hint
from tests.conftest import IN_PROCESS, REPO, WORKER_PROCESSES
from tests.conftest import run_cli as _run_cli

PLAN = {
    "line": "Found 30 images belonging to 2 classes",
    "splits": {"train": {"num_examples": 20, "num_shards": 2}, "validation": {"num_examples": 10, "num_shards": 1}},
}

# What Beam's SDK workers and runner print at start-up and shutdown, and the apitools notice: none of
# it may reach the default console. Written out here rather than imported from console.py, so that a
# phrase dropped from the job's filter makes this test fail.
CHATTER = re.compile(
    r"semi_persistent|Pipeline_options|sdk harness|SDKHarness|insecure|control channel|control plane"
    r"|state cache|data channel|Closing all cached|Done consuming|unparseable args|apitools|Logging handler"
    r"|worker_handlers|starting control server|local_job_service|typehints|^INFO:|^WARNING:root",
    re.IGNORECASE,
)


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_cli(*args: object, processes: bool = True, **kwargs: object):
    """The job with Beam's worker processes, the default, whose records the console relays
    (``processes=False``: the local runner in the job's own process)."""
    return _run_cli(*args, processes=processes, **kwargs)


def test_tally_counts_only_the_sidecars_of_this_plan():
    staged = {
        ".train-00000-of-00002.tfrecord.json": 11,
        ".validation-00000-of-00001.tfrecord.json": 10,
        ".train-00000-of-00003.tfrecord.json": 7,  # an earlier run's shard count
        ".test-00000-of-00001.tfrecord.json": 5,
    }  # a split this plan lacks
    assert tally(PLAN, staged) == Progress(shards_done=2, shards_total=3, images_done=21, images_total=30)


def test_tally_leaves_kept_shards_out_of_the_rate():
    staged = {".train-00000-of-00002.tfrecord.json": 11, ".train-00001-of-00002.tfrecord.json": 9}
    progress = tally(PLAN, staged, kept={".train-00000-of-00002.tfrecord.json"})
    assert (progress.images_done, progress.images_kept) == (20, 11)
    out, clock = io.StringIO(), FakeClock()
    display = LineProgress(out, threading.Lock(), clock=clock)
    display.plan(PLAN["line"], Progress(0, 3, 0, 30))
    clock.now = 1.0
    display.update(Progress(1, 3, 11, 30, images_kept=11))  # kept at once: no work of this run
    clock.now = 2.0
    display.update(Progress(1, 3, 14, 30, images_kept=11))  # the first converted images
    clock.now = 5.0
    display.update(progress)
    assert out.getvalue().splitlines()[-1].split(", ")[2] == "2 images/s"  # 9 - 3 converted in 3 s, none kept


def test_tally_adds_the_images_of_shards_still_converting():
    staged = {".train-00000-of-00002.tfrecord.json": 10}
    converting = {
        ".train-00000-of-00002.tfrecord.json": 7,  # its note, read before its sidecar: counted once
        ".train-00001-of-00002.tfrecord.json": 4,
        ".validation-00000-of-00001.tfrecord.json": 3,
        ".train-00001-of-00003.tfrecord.json": 5,  # another plan's
    }
    assert tally(PLAN, staged, converting=converting) == Progress(1, 3, 17, 30)


def test_line_progress_reports_shards_staged_before_the_plan_was_seen():
    # A slow listing can see the plan file only after shards are staged: they are this run's work.
    out = io.StringIO()
    clock = FakeClock()
    display = LineProgress(out, threading.Lock(), clock=clock)
    display.plan(PLAN["line"], Progress(1, 3, 10, 30))
    clock.now = 5.0
    display.update(Progress(2, 3, 20, 30))
    lines = out.getvalue().splitlines()
    assert lines[0] == PLAN["line"]
    assert [re.search(r"\((\d+)%\)", line).group(1) for line in lines[1:]] == ["33", "67"]
    # Counted in the rate, not as if kept: 10 more in the 5 s since the first were seen.
    assert lines[2] == "progress: 2/3 shards, 20/30 images (67%), 2 images/s, ETA 0:05, 0:05 elapsed", lines


def test_line_progress_prints_once_per_tenth():
    out = io.StringIO()
    display = LineProgress(out, threading.Lock())
    display.plan(PLAN["line"], Progress(0, 3, 0, 30))
    for done in (1, 2, 3, 4, 12, 13, 30):
        display.update(Progress(done // 10, 3, done, 30))
    lines = out.getvalue().splitlines()
    assert lines[0] == PLAN["line"]
    percents = [int(re.search(r"\((\d+)%\)", line).group(1)) for line in lines[1:]]
    assert percents == [10, 40, 100]  # 1/30 and 2/30 are under a tenth; 4/30 is in the same tenth as 3/30


def test_progress_line_gives_rate_and_eta():
    line = progress_line(Progress(1, 4, 50, 200), elapsed_s=10.0, rate=5.0)
    assert line == "progress: 1/4 shards, 50/200 images (25%), 5 images/s, ETA 0:30, 0:10 elapsed"
    # Before a rate can be measured, neither a rate nor an ETA is guessed.
    assert progress_line(Progress(0, 4, 3, 200), elapsed_s=4.0, rate=None) == (
        "progress: 0/4 shards, 3/200 images (2%), 0:04 elapsed"
    )


def test_the_rate_counts_from_the_first_converted_images_not_from_the_launch():
    # A cluster spends a minute starting workers before the first image: a rate over the whole
    # elapsed time would say 1 image/s and an ETA far too late.
    out = io.StringIO()
    clock = FakeClock()
    display = LineProgress(out, threading.Lock(), clock=clock)
    display.plan(PLAN["line"], Progress(0, 3, 0, 30))
    clock.now = 60.0
    display.update(Progress(0, 3, 2, 30))  # first seen
    clock.now = 64.0
    display.update(Progress(1, 3, 14, 30))
    assert out.getvalue().splitlines()[-1] == (
        "progress: 1/3 shards, 14/30 images (47%), 3 images/s, ETA 0:05, 1:04 elapsed"
    )


def test_a_line_is_written_at_least_every_30_seconds_while_nothing_moves():
    out = io.StringIO()
    clock = FakeClock()
    display = LineProgress(out, threading.Lock(), clock=clock)
    display.plan(PLAN["line"], Progress(0, 3, 0, 30))
    for second in range(1, 75):  # the watcher's polls: nothing converted yet (workers starting)
        clock.now = float(second)
        display.update(Progress(0, 3, 0, 30))
    assert out.getvalue().splitlines()[1:] == [
        "progress: 0/3 shards, 0/30 images (0%), 0:30 elapsed",
        "progress: 0/3 shards, 0/30 images (0%), 1:00 elapsed",
    ]
    clock.now = 80.0
    display.update(Progress(0, 3, 3, 30))  # a tenth: at once
    assert out.getvalue().splitlines()[-1] == "progress: 0/3 shards, 3/30 images (10%), 1:20 elapsed"


def test_the_watcher_reads_the_plan_and_each_staged_shard(tmp_path):
    seen: list = []
    watcher = StagingWatcher(
        str(tmp_path), "run1", on_plan=lambda line, p: seen.append((line, p)), on_progress=seen.append
    )
    watcher.poll()
    assert seen == []  # No plan yet: nothing to say.
    (tmp_path / ".train-00000-of-00002.tfrecord.json").write_text(
        json.dumps({"num_examples": 9, "dead_letters": [["u", "s", "truncated", "d"]], "run_id": "run1"})
    )
    summary = {"splits": {name: dict(s) for name, s in PLAN["splits"].items()}}
    write_progress_plan(str(tmp_path), "run1", line="Found it", summary=summary)
    watcher.poll()
    assert seen == [("Found it", Progress(1, 3, 10, 30))]
    (tmp_path / ".validation-00000-of-00001.tfrecord.json").write_text(
        json.dumps({"num_examples": 10, "run_id": "run1"})
    )
    watcher.poll()
    watcher.poll()  # Unchanged: reported again, so that the display's clock runs on.
    assert seen[1:] == [Progress(2, 3, 20, 30)] * 2
    watcher.stop(succeeded=True)  # Finalize may already have removed the last sidecars.
    assert seen[-1] == Progress(3, 3, 30, 30)
    watcher.remove_progress_file()
    assert not (tmp_path / progress_file_name("run1")).exists()


def test_a_resumed_run_shows_its_own_plan_not_the_killed_attempts(tmp_path):
    """--resume continues the killed attempt's run folder, whose progress file names its plan:
    the watcher, started before the pipeline runs, removes it and waits for this attempt's."""
    write_progress_plan(str(tmp_path), "run1", line="Found 2112 images (the killed attempt)", summary=PLAN)
    seen: list = []
    watcher = StagingWatcher(str(tmp_path), "run1", on_plan=lambda line, p: seen.append(line), on_progress=seen.append)
    watcher.start()
    watcher.stop()
    assert seen == [] and not (tmp_path / progress_file_name("run1")).exists()
    write_progress_plan(str(tmp_path), "run1", line="Found 2152 images", summary=PLAN)
    watcher.poll()
    assert seen == ["Found 2152 images"]


def test_the_watcher_counts_the_notes_of_converting_shards_until_their_sidecars_are_staged(tmp_path):
    from beam_jobs.writing.shard_progress import progress_note_name

    write_progress_plan(str(tmp_path), "run1", line="plan", summary=PLAN)
    seen: list = []
    watcher = StagingWatcher(str(tmp_path), "run1", on_plan=lambda line, p: seen.append(p), on_progress=seen.append)
    watcher.poll()
    note = tmp_path / progress_note_name("run1", "train-00000-of-00002.tfrecord")
    note.write_text(json.dumps({"images": 4}))
    (tmp_path / progress_note_name("other", "train-00001-of-00002.tfrecord")).write_text(json.dumps({"images": 9}))
    watcher.poll()
    note.write_text(json.dumps({"images": 8}))
    watcher.poll()
    (tmp_path / ".train-00000-of-00002.tfrecord.json").write_text(json.dumps({"num_examples": 10, "run_id": "run1"}))
    watcher.poll()  # the sidecar is there, the note not yet removed: counted once
    note.unlink()
    watcher.poll()
    assert [p.images_done for p in seen] == [0, 4, 8, 10, 10]
    assert [p.shards_done for p in seen] == [0, 0, 0, 1, 1]


def test_a_converting_shard_leaves_a_note_of_its_images_and_removes_it_with_its_sidecar(tmp_path, monkeypatch):
    from beam_jobs.config import ImageConfig
    from beam_jobs.planning.rules import plan_dataset
    from beam_jobs.records import InputFile
    from beam_jobs.writing import shard_progress
    from beam_jobs.writing.convert_shards import ConvertShardFn
    from tests.photos import real_photo

    photos = tmp_path / "photos"
    photos.mkdir()
    for i in range(6):
        real_photo(size=(40 + i, 30)).save(photos / f"{i}.jpg")
    (photos / "5.jpg").write_bytes(b"not an image")  # a dead letter counts as done too
    out = tmp_path / "out"
    out.mkdir()
    notes: list = []
    write = shard_progress.write_atomically
    monkeypatch.setattr(shard_progress, "LOCAL_INTERVAL_S", 0.0)  # a note before every image
    monkeypatch.setattr(
        shard_progress, "write_atomically", lambda path, data: (notes.append(json.loads(data)), write(path, data))
    )
    inputs = [
        InputFile(f"cat/{p.name}", str(p), label="cat", size=p.stat().st_size, mtime=p.stat().st_mtime)
        for p in sorted(photos.iterdir())
    ]
    [shard] = plan_dataset(inputs, num_shards=1, example_bytes=1).shards
    fn = ConvertShardFn(ImageConfig(width=16, height=16), str(out), run_id="run1")
    fn.setup()
    try:
        list(fn.process(shard))
    finally:
        fn.teardown()
    assert notes == [{"images": n} for n in range(6)]
    left = sorted(p.name for p in out.iterdir())
    assert left == [".train-00000-of-00001.tfrecord.json", "train-00000-of-00001.tfrecord"]


def test_the_watcher_counts_only_the_sidecars_this_run_wrote_or_kept(tmp_path):
    # --resume after an earlier run staged two shards: one is kept (convert rewrites its sidecar
    # with this run's id), the other's sources changed and it is converted again.
    kept = tmp_path / ".train-00000-of-00002.tfrecord.json"
    redone = tmp_path / ".train-00001-of-00002.tfrecord.json"
    for sidecar in (kept, redone):
        sidecar.write_text(json.dumps({"num_examples": 10, "run_id": "earlier"}))
    write_progress_plan(str(tmp_path), "now", line="plan", summary=PLAN)
    seen: list = []
    watcher = StagingWatcher(str(tmp_path), "now", on_plan=lambda line, p: seen.append(p), on_progress=seen.append)
    watcher.poll()
    assert seen == [Progress(0, 3, 0, 30)]  # Neither is done yet: either may still be redone.
    kept.write_text(json.dumps({"num_examples": 10, "run_id": "now", "kept": True}))
    watcher.poll()
    assert seen[1:] == [Progress(1, 3, 10, 30, images_kept=10)]
    redone.write_text(json.dumps({"num_examples": 9, "dead_letters": [["u", "s", "r", "d"]], "run_id": "now"}))
    os.utime(redone, (time.time() + 5, time.time() + 5))  # A listing's time may not change within a second.
    watcher.poll()
    assert seen[2:] == [Progress(2, 3, 20, 30, images_kept=10)]


def test_convert_marks_the_shards_it_keeps_and_writes_the_others_again(tmp_path):
    from beam_jobs.config import ImageConfig
    from beam_jobs.planning.rules import plan_dataset
    from beam_jobs.records import InputFile
    from beam_jobs.writing.convert_shards import ConvertShardFn
    from tests.photos import real_photo

    photos = tmp_path / "photos"
    (photos / "cat").mkdir(parents=True)
    for i in range(4):
        real_photo(size=(40, 30)).save(photos / "cat" / f"{i}.jpg")
    out = tmp_path / "out"
    out.mkdir()

    def convert(run_id: str) -> dict:
        inputs = [
            InputFile(f"cat/{p.name}", str(p), label="cat", size=p.stat().st_size, mtime=p.stat().st_mtime)
            for p in sorted((photos / "cat").iterdir())
        ]
        [shard] = plan_dataset(inputs, num_shards=1, example_bytes=1).shards
        fn = ConvertShardFn(ImageConfig(width=16, height=16), str(out), resume=True, run_id=run_id)
        fn.setup()
        try:
            list(fn.process(shard))
        finally:
            fn.teardown()
        return json.loads((out / ".train-00000-of-00001.tfrecord.json").read_text())

    first = convert("first")
    assert first["run_id"] == "first" and "kept" not in first
    again = convert("second")
    assert (again["run_id"], again["kept"]) == ("second", True)
    os.utime(photos / "cat" / "0.jpg", (time.time() + 10, time.time() + 10))  # A changed source.
    redone = convert("third")
    assert redone["run_id"] == "third" and "kept" not in redone


def test_the_committing_run_removes_the_progress_files_of_killed_runs(tmp_path):
    from beam_jobs.writing.finalize import remove_root_leftovers

    folder = tmp_path / "out [1]*ü"  # Names a glob would read as a pattern.
    folder.mkdir()
    for name in (".progress-2901c11ee9ff447d.json", ".progress-[x]*.json", ".progress-own.json", "progress-mine.json"):
        (folder / name).write_text("{}")
    removed = remove_root_leftovers(str(folder), run_id="own")
    assert removed == [".progress-2901c11ee9ff447d.json", ".progress-[x]*.json"]
    # Its own goes once the launching process has had its last look (StagingWatcher.remove_progress_file).
    assert sorted(p.name for p in folder.iterdir()) == [".progress-own.json", "progress-mine.json"]


def test_console_lines_say_1_shard_1_input_1_class():
    from beam_jobs.command_line.job_main import _summary
    from beam_jobs.writing.finalize import plan_line

    plan = {"label_names": ["china"], "splits": {"train": {"num_examples": 1, "num_shards": 1}}}
    assert plan_line(plan, {"empty_file": 1}) == (
        "Found 1 image belonging to 1 class: train 1 (1 shard); 1 listed file not used (empty_file: 1)"
    )
    # Every listed file used: nothing to say about unused ones.
    assert plan_line(plan, {}) == "Found 1 image belonging to 1 class: train 1 (1 shard)"
    appended = {**plan, "append": {"held": 3}}
    assert plan_line(appended, {}) == (
        "Found 1 new image (3 already in the current version) belonging to 1 class: train 1 (1 shard)"
    )
    # The classes the found images belong to: not a retired label, nor the version's other classes.
    grown = {
        "label_names": ["a", "b", "c"],
        "splits": {"train": {"num_examples": 7, "num_shards": 1, "class_counts": {"a": 0, "b": 0, "c": 7}}},
    }
    assert plan_line(grown, {}) == "Found 7 images belonging to 1 class: train 7 (1 shard)"
    # --changed_sources keep: the changed sources kept are said, also when nothing is new.
    kept = {"held": 5, "changed": 1, "removed": 0, "changed_examples": ["b/2.jpg"]}
    nothing_new = {"label_names": ["a"], "splits": {}, "append": kept}
    assert plan_line(nothing_new, {}) == (
        "Found no new images: the 6 listed are in the current version; 1 changed and 0 no longer listed "
        "source(s) keep the examples the version made (--changed_sources keep, e.g. b/2.jpg)"
    )
    info = {
        "splits": {"train": {"num_examples": 1, "num_shards": 1}},
        "num_dead_letters": 1,
        "dead_letters_by_reason": {"empty_file": 1},
        "dead_letters_file": "shards/r/dead_letters.jsonl",
        "version": 1,
        "change": {"kind": "create"},
    }
    assert _summary(info, "/d") == (
        "committed version 1 (create): wrote train: 1 example in 1 shard to /d; 1 input "
        "could not be used (see /d/shards/r/dead_letters.jsonl)"
    )


def test_a_run_without_dead_letters_does_not_point_to_an_empty_file():
    from beam_jobs.command_line.job_main import _summary

    info = {
        "splits": {"train": {"num_examples": 2, "num_shards": 1}},
        "num_dead_letters": 0,
        "dead_letters_by_reason": {},
        "dead_letters_file": "shards/r/dead_letters.jsonl",
        "version": 1,
        "change": {"kind": "create"},
    }
    assert _summary(info, "/d") == (
        "committed version 1 (create): wrote train: 2 examples in 1 shard to /d; every input became an example"
    )


@pytest.mark.parametrize("size, shown", [(0, "0.00"), (4_600, "0.0044"), (675_553, "0.64"), (15 * 2**20, "15.0")])
def test_the_table_gives_sizes_in_mib_small_ones_too(size, shown):
    assert format_mib(size) == shown


@pytest.mark.parametrize(
    "flags, level",
    [
        (["-v"], "INFO"),
        (["-vv"], "DEBUG"),
        (["-v", "-v"], "DEBUG"),
        ([], "WARNING"),
        (["--log_level", "error"], "ERROR"),
    ],
)
def test_v_is_short_for_log_level(flags, level, tmp_path):
    from beam_jobs.command_line.arguments import parse_job_arguments
    from beam_jobs.command_line.job_logging import peek_log_level

    argv = ["--input", str(tmp_path), "--output_dir", str(tmp_path / "out"), *flags]
    assert parse_job_arguments(argv)[0].log_level == level == peek_log_level(argv)


def test_v_and_log_level_together_are_refused_and_v_is_in_the_help(tmp_path, capsys):
    from beam_jobs.command_line.arguments import UsageError, help_parser, parse_job_arguments

    with pytest.raises(UsageError, match="give -v or --log_level, not both"):
        parse_job_arguments(["--input", str(tmp_path), "--output_dir", str(tmp_path), "-v", "--log_level=DEBUG"])
    help_parser().print_help()
    assert "-v " in capsys.readouterr().out


def test_split_table_adds_up_and_gives_listing_dead_letters_a_row():
    info = {
        "num_dead_letters": 4,
        "dead_letters_by_reason": {"truncated": 2, "bad_manifest_row": 2},
        "splits": {
            "train": {
                "num_examples": 9,
                "num_shards": 2,
                "dead_letters_by_reason": {"truncated": 2},
                "shards": [{"bytes": 2**20}, {"bytes": 2**20}],
            },
            "validation": {
                "num_examples": 3,
                "num_shards": 1,
                "dead_letters_by_reason": {},
                "shards": [{"bytes": 2**19}],
            },
        },
    }
    rows = [line.split(None, 4) for line in split_table(info).splitlines()]
    assert rows == [
        ["split", "examples", "shards", "MiB", "dead letters"],
        ["train", "9", "2", "2.00", "2 (truncated: 2)"],
        ["validation", "3", "1", "0.50", "0"],
        ["(listing)", "2", "(bad_manifest_row:", "2)"],
        ["total", "12", "3", "2.50", "4"],
    ]


@pytest.mark.parametrize(
    "argv, expected",
    [
        ([], None),
        (["--runner=FlinkRunner", "--flink_master=10.0.0.5:8081"], "http://10.0.0.5:8081/#/job/running"),
        (["--runner=FlinkRunner"], "embedded Flink"),
        (["--runner=SparkRunner", "--spark_master_url=spark://10.0.0.6:7077"], "Spark Master on 10.0.0.6"),
        (["--runner=SparkRunner"], "running on Spark (local[4])"),
        (
            ["--runner=DataflowRunner", "--project=p1", "--region=europe-west4"],
            "https://console.cloud.google.com/dataflow/jobs/europe-west4/JOB?project=p1",
        ),
    ],
)
def test_cluster_runners_say_where_to_watch(argv, expected):
    hint = watch_hint(PipelineOptions(argv), "JOB")
    assert hint == expected if expected is None else expected in hint


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "worker-processes"])
def default_run(request, photo_tree, tmp_path_factory):
    root, good, broken = photo_tree
    out = tmp_path_factory.mktemp("console")
    result = run_cli(
        "--input",
        root,
        "--output_dir",
        out,
        "--image_size",
        "48",
        "--num_shards",
        "4",
        "--splits",
        "train=0.75,validation=0.25",
        "--max_bad_fraction",
        "0.5",
        processes=request.param,
    )
    return result, json.loads((out / "dataset_info.json").read_text()), out, good, broken


@pytest.mark.slow
def test_default_console_is_the_plan_progress_and_a_table(default_run):
    result, info, out, good, broken = default_run
    lines = _console_lines(result.stderr)
    # stderr holds the plan, then progress lines, and nothing else: no chatter, no INFO lines.
    assert re.fullmatch(
        rf"Found {len(good) + len(broken)} images belonging to 9 classes: train \d+ \(4 shards\), "
        r"validation \d+ \(4 shards\); ignored: 1 hidden, 1 non-image",
        lines[0],
    ), result.stderr
    progress = lines[1:]
    assert progress and all(line.startswith("progress: ") for line in progress), result.stderr
    assert progress[-1].startswith(
        f"progress: 8/8 shards, {len(good) + len(broken)}/{len(good) + len(broken)} images (100%)"
    ), progress
    assert not [line for line in result.stderr.splitlines() if CHATTER.search(line)]
    table = result.stdout.splitlines()
    assert table[0].split() == ["split", "examples", "shards", "MiB", "dead", "letters"]
    rows = {line.split()[0]: line.split(None, 4) for line in table[1:4]}
    for name, split in info["splits"].items():
        reasons = split["dead_letters_by_reason"]
        assert rows[name][1:3] == [str(split["num_examples"]), "4"]
        assert rows[name][4] == (
            f"{sum(reasons.values())} (" + ", ".join(f"{r}: {n}" for r, n in sorted(reasons.items())) + ")"
            if reasons
            else "0"
        )
    assert rows["total"][1:3] == [str(len(good)), "8"] and rows["total"][4] == str(len(broken))
    run = out / "shards" / info["change"]["run"]
    for line in (
        f"{out / 'dataset_info.json'} (version 1)",
        run / "dead_letters.jsonl",
        run / "train-*-of-00004.tfrecord",
    ):
        assert f"  {line}" in table
    assert not list(out.glob("**/.progress-*"))  # The watcher's file goes with the run.


@pytest.mark.slow
def test_one_shard_of_many_images_shows_its_images_as_they_are_converted(tmp_path):
    # One shard takes seconds (about 5 s on an idle 2-core machine; 1,000 images could finish
    # within a second of the first note, written after 1 s, too soon for a rate): its worker's
    # note moves the progress before the shard is done, so a log shows the tenths on the way (not
    # one line at the end) and the rate comes from images.
    from beam_jobs.sample_data import make_photo_tree

    photos = make_photo_tree(tmp_path / "photos", num_images=2000, size=(800, 600), classes=["chelsea", "coffee"])
    out = tmp_path / "out"
    result = run_cli("--input", tmp_path / "photos", "--output_dir", out, "--num_shards", "1", "--image_size", "224")
    lines = [line for line in result.stderr.splitlines() if line.startswith("progress: ")]
    counts = [int(re.search(r"(\d+)/2000 images", line).group(1)) for line in lines]
    during = [n for line, n in zip(lines, counts, strict=True) if line.startswith("progress: 0/1 ") and 0 < n < 2000]
    assert during, result.stderr  # images counted while the only shard was still converting
    assert counts == sorted(counts) and lines[-1].startswith("progress: 1/1 shards, 2000/2000 images (100%)")
    assert re.search(r" [\d.]+ images?/s, ", lines[-1]), lines  # measured from the first images seen
    assert len(photos) == 2000 and not list(out.glob("**/.progress-*"))


@pytest.mark.slow
def test_log_level_info_brings_the_details_back(photo_tree, tmp_path):
    root = photo_tree[0]
    result = run_cli(
        "--input",
        root,
        "--output_dir",
        tmp_path,
        "--image_size",
        "32",
        "--num_shards",
        "2",
        "--max_bad_fraction",
        "0.5",
        "--log_level",
        "INFO",
    )
    assert "wrote train-00000-of-00002.tfrecord:" in result.stderr
    assert "counters: " in result.stderr
    assert "starting control server" in result.stderr  # Beam's own INFO lines


@pytest.mark.slow
def test_on_a_terminal_progress_is_a_bar(photo_tree, tmp_path):
    root = photo_tree[0]
    main_fd, worker_fd = pty.openpty()
    fcntl.ioctl(worker_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    args = [
        "--input",
        str(root),
        "--output_dir",
        str(tmp_path),
        "--image_size",
        "32",
        "--num_shards",
        "3",
        "--max_bad_fraction",
        "0.5",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_jobs", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=worker_fd,
    )
    os.close(worker_fd)
    screen = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # EIO: every writer of the terminal has exited.
            break
        if not chunk:
            break
        screen += chunk
    stdout, _ = proc.communicate(timeout=300)
    os.close(main_fd)
    assert proc.returncode == 0, screen.decode(errors="replace")
    text = screen.decode("utf-8", errors="replace")
    assert "Found " in text and "\rconverting: 100%|" in text and "shards 3/3" in text, text
    assert "progress: " not in text  # Plain lines are for consoles that are not terminals.
    assert not [line for line in text.replace("\r", "\n").splitlines() if CHATTER.search(line)]
    assert "split" in stdout.decode()


@pytest.mark.slow
def test_a_resumed_run_keeps_its_console_quiet_and_ends_at_every_shard(photo_tree, tmp_path):
    root = photo_tree[0]
    args = ["--input", root, "--output_dir", tmp_path, "--image_size", "32", "--num_shards", "4"]
    refused = run_cli(*args, "--max_bad_fraction", "0", check=False)  # The broken files: staged, not committed.
    assert refused.returncode == 1 and list(tmp_path.glob("shards/*/.train-*.tfrecord.json"))
    first = sorted(p for p in root.rglob("*.jpg"))[0]
    os.utime(first, (time.time() + 10, time.time() + 10))  # Its shard is converted again.
    (tmp_path / ".progress-0123456789abcdef.json").write_text("{}")  # A killed run's (of an older release).
    result = run_cli(*args, "--max_bad_fraction", "0.5", "--resume")
    assert "kept " not in result.stderr and "INFO" not in result.stderr, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("progress: ")]
    assert progress and progress[-1].startswith("progress: 4/4 shards"), result.stderr
    assert not list(tmp_path.glob("**/.progress-*"))


@pytest.mark.slow
def test_v_shows_one_plain_line_per_shard_the_plan_once_and_the_size_as_given(photo_tree, tmp_path):
    root = photo_tree[0]
    result = run_cli(
        "--input",
        root,
        "--output_dir",
        tmp_path,
        "--image_size",
        "64x32",
        "--num_shards",
        "2",
        "--max_bad_fraction",
        "0.5",
        "-v",
    )
    lines = result.stderr.splitlines()
    assert "severity:" not in result.stderr and "timestamp {" not in result.stderr, result.stderr[-3000:]
    assert len([line for line in lines if line.startswith("Found ")]) == 1, result.stderr[-3000:]
    wrote = sorted(line.split(":")[0] for line in lines if line.startswith("wrote train-"))
    assert wrote == ["wrote train-00000-of-00002.tfrecord", "wrote train-00001-of-00002.tfrecord"], result.stderr[
        -3000:
    ]
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["preprocessing"]["image_size"] == "64x32"
    assert (info["image"]["width"], info["image"]["height"]) == (64, 32)
    assert "[32, 64]" not in (tmp_path / "dataset_info.json").read_text()


def test_a_relayed_worker_record_becomes_its_own_message():
    import logging

    from apache_beam.portability.api import beam_fn_api_pb2

    from beam_jobs.command_line.console import RelayedWorkerRecords

    def relayed(message: str, location: str, step: str, level=logging.INFO) -> logging.LogRecord:
        entry = beam_fn_api_pb2.LogEntry(
            severity=beam_fn_api_pb2.LogEntry.Severity.INFO, message=message, log_location=location, transform_id=step
        )
        # As Beam's local job service relays a worker's record.
        return logging.LogRecord(
            "apache_beam.runners.portability.local_job_service",
            level,
            __file__,
            1,
            "Worker: %s",
            (str(entry).replace("\n", " "),),
            None,
        )

    relay = RelayedWorkerRecords(drop_steps=("LogPlan",))
    record = relayed('wrote a "b"\nc: 1', "/x/beam_jobs/writing/convert_shards.py:315", "ConvertImages/ConvertShards")
    assert relay.filter(record) and record.getMessage() == 'wrote a "b"\nc: 1'
    assert record.name == "beam_jobs.details"
    other = relayed("a warning", "/x/apache_beam/io/x.py:3", "S", level=logging.WARNING)
    assert relay.filter(other) and other.getMessage() == "a warning" and other.name == "worker /x/apache_beam/io/x.py:3"
    assert not relay.filter(relayed("Found 3 images", "/x/beam_jobs/pipeline.py:91", "ConvertImages/LogPlan"))


@pytest.fixture(scope="module")
def coco_tree(tmp_path_factory):
    """Pasted photos with a COCO file whose objects carry polygon masks: --coco_masks decodes each
    through pycocotools, which warns under NumPy 2 at every decode."""
    from tests.pasted_photos import make_pasted_images, polygon_of, write_coco  # pylint: disable=import-outside-toplevel

    root = tmp_path_factory.mktemp("coco")
    coco_path = write_coco(root, make_pasted_images(root))
    coco = json.loads(coco_path.read_text())
    for annotation in coco["annotations"]:
        x, y, w, h = annotation["bbox"]
        annotation["segmentation"] = polygon_of((x, y, x + w, y + h))
    coco_path.write_text(json.dumps(coco))
    return root, coco_path


@pytest.mark.slow
@pytest.mark.parametrize("mode", [IN_PROCESS, WORKER_PROCESSES], ids=["in-process", "worker-processes"])
def test_library_warnings_stay_off_the_console_and_reach_the_debug_log(coco_tree, tmp_path, mode):
    root, coco_path = coco_tree
    argv = ["--input", root, "--coco_annotations", coco_path, "--coco_masks", "--annotation_frame", "stored"]
    argv += ["--image_size", "48", *mode]
    # PYTHONWARNINGS=default shows each warning once per place, in the job and in its workers,
    # whatever the decode step does to the filters meanwhile: without it pycocotools' warning
    # shows in some runs only (see third_party_warnings.py), and the test could pass by chance.
    env = {**os.environ, "PYTHONWARNINGS": "default"}

    def job(out: str, *extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "beam_jobs", *map(str, argv), "--output_dir", str(tmp_path / out), *extra]
        return subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=600, check=False)

    result = job("out")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Warning" not in result.stderr + result.stdout, result.stderr[-3000:]
    debug = job("debug", "--log_level", "DEBUG")
    assert debug.returncode == 0, debug.stderr[-3000:]
    assert "DeprecationWarning: __array__ implementation" in debug.stderr, debug.stderr[-3000:]


@pytest.mark.parametrize(
    ("splits", "reads"),
    [
        ({"train": 1, "validation": 1}, '"train"'),
        ({"validation": 1, "test": 1}, '"validation"'),
    ],
)
def test_the_summary_ends_with_the_next_commands(splits, reads):
    from beam_jobs.command_line.run_summary import next_steps_lines

    info = {"splits": {name: {"num_examples": n, "num_shards": 1} for name, n in splits.items()}}
    lines = next_steps_lines(info, "/data/out")
    assert lines[0] == "next: verify-tfrecords /data/out", lines
    assert f'tfdata_readers.make_dataset("/data/out", {reads}, batch_size=32' in lines[1], lines


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        (0.0, "0 images/s"),
        (0.36, "0.4 images/s"),
        (1.0, "1 image/s"),
        (2.5, "2.5 images/s"),
        (9.96, "10 images/s"),
        (356.9, "357 images/s"),
    ],
)
def test_a_slow_rate_is_shown_with_a_decimal_and_one_image_in_the_singular(rate, shown):
    from beam_jobs.command_line.progress_display import format_rate

    assert format_rate(rate) == shown
