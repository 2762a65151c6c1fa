"""CLI: `python -m tfdata_readers.inspect DATA_DIR --out DIR`: contact sheets, class histogram,
report.html and a text summary of a converted dataset, read through this reader.

Exit status: 0 when every shard verified, 1 when the report records problems (it is written all
the same: a missing or corrupt shard is something to show, not a reason to crash), 2 for bad
arguments or no readable dataset_info.json.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from tfdata_readers._command_parser import CommandParser
from tfdata_readers._quiet_start import import_tensorflow_for_command
from tfdata_readers.inspection.class_chart import balance, balance_text, draw_class_counts
from tfdata_readers.inspection.units import format_mib, plural

if TYPE_CHECKING:  # These need TensorFlow: imported once the arguments are parsed (--help stays instant).
    from tfdata_readers.inspection.gather import Inspection

__all__ = ["main", "sample_notes", "text_summary", "write_inspection"]

PROG = "inspect-tfrecords"


def _out_problem(out: str) -> str | None:
    """Why --out cannot be the folder the report goes to (None if it can), checked before reading."""
    if "://" in out:
        return None
    if os.path.exists(out) and not os.path.isdir(out):
        return f"--out {out} is a file, not a folder"
    folder = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"--out {out} lies under {folder}, which is a file"
    return None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer (got {text!r})")
    return value


def _seed(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to 2**63-1 (got {text!r})")
    return value


def sample_notes(report: Inspection, num_examples: int, *, asked: bool) -> list[str]:
    """A note for each split whose sheet shows fewer examples than `num_examples` (`asked`: given
    as --num_examples), saying how many it shows: all the split holds, or, when some of its
    records could not be read (a damaged shard, named under problems), only those that could."""
    notes = []
    for split, sample in report.samples.items():
        held, shown = report.info.splits[split].num_examples, len(sample.examples)
        over = f"--num_examples {num_examples} is more than {split} holds" if asked and held < num_examples else ""
        if shown >= min(held, num_examples):
            if over and held > 0:
                notes.append(f"{over}: its sheet shows all {held}")
            continue
        # Fewer than the sample holds: the reading stopped early, so every record read is shown.
        cause = f"its sheet shows {shown} of its {held} examples: only {shown} could be read (see problems)"
        notes.append(f"{over}, and {cause}" if over else f"{split}: {cause}")
    return notes


def text_summary(report: Inspection, written: list[str], notes: Sequence[str] = ()) -> str:
    """What the report shows, in a few lines for the terminal."""
    info = report.info
    producer = info.raw.get("producer", {})
    total = sum(s.num_examples for s in info.splits.values())
    lines = [
        f"{report.data_dir}: {plural(total, 'example')} in {plural(len(info.splits), 'split')}, "
        f"{plural(info.num_classes, 'class', 'classes')}, "
        f"{info.image.size_text} {info.image.format} "
        f"({producer.get('name', '?')} {producer.get('version', '?')}), dataset version {info.version}"
    ]
    width = max((len(s) for s in report.splits), default=5)
    # Classes the dataset keeps at their ids with no example on purpose (a class removed from the
    # inputs of a later version): said once, not as an empty class of every split.
    retired = [name for name in info.raw.get("retired_labels", []) if name in info.label_names]
    for split in report.splits:
        rows = [r for r in report.shards if r.split == split]
        summary = balance(report.class_counts[split])
        ratio = balance_text(summary)
        empty_now = [name for name in summary.empty if name not in retired]
        empty = f"; EMPTY classes: {', '.join(empty_now)}" if empty_now else ""
        examples, shards = info.splits[split].num_examples, len(rows)
        lines.append(
            f"  {split:<{width}}  {examples:>7} example{'s' if examples != 1 else ' '}  {shards:>4} "
            f"shard{'s' if shards != 1 else ' '}  {format_mib(sum(r.bytes for r in rows)):>8} MiB  "
            f"{sum(r.verified for r in rows)}/{len(rows)} "
            f"verified  {ratio}{empty}"
        )
    if retired:
        lines.append(
            f"  retired classes (their ids kept, no example in this version): "
            f"{', '.join(f'{name} ({info.label_names.index(name)})' for name in retired)}"
        )
    if report.class_counts_source != "dataset_info.json":
        lines.append(f"  class counts {report.class_counts_source}")
    for split in report.splits:
        facts = info.raw["splits"].get(split, {})
        if "object_counts" in facts:
            counts = ", ".join(f"{name} {n}" for name, n in facts["object_counts"].items())
            cut = facts.get("objects_cut_by_crop", 0)
            lines.append(f"  {split}: objects per class: {counts}; boxes the crop cut away: {cut}")
    for group in report.groups:
        lines.append(f"  split group {group.group}: {plural(group.size, 'input')}, in {', '.join(group.splits) or '?'}")
    dead = sum(g.count for g in report.dead_letters)
    reasons = ", ".join(f"{g.reason}: {g.count}" for g in report.dead_letters)
    lines.append(f"dead letters: {dead}" + (f" ({reasons})" if reasons else ""))
    problems = [f"{r.split}/{r.file}: {p}" for r in report.shards for p in r.problems] + list(report.other_problems)
    problems += [f"sample of {s.split}: {s.error}" for s in report.samples.values() if s.error]
    if report.dead_letters_note:
        problems.append(report.dead_letters_note)
    lines.append(f"problems: {len(problems)}" + "".join(f"\n  {p}" for p in problems))
    lines.extend(f"note: {note}" for note in notes)
    lines.append("wrote " + ", ".join(written))
    return "\n".join(lines)


def write_inspection(report: Inspection, out_dir: str, *, augmented: bool = False, tile: int = 160) -> list[str]:
    """Draws and writes the pictures and the page; returns the paths written."""
    from tfdata_readers.inspection.html_report import render_report  # pylint: disable=import-outside-toplevel
    from tfdata_readers.inspection.sheet import draw_contact_sheet, sheet_jpeg, sheet_png  # pylint: disable=import-outside-toplevel

    os.makedirs(out_dir, exist_ok=True)
    info = report.info
    from tfdata_readers.inspection.gather import SHEET_SIZE  # pylint: disable=import-outside-toplevel

    image_size = cast("tuple[int, int]", SHEET_SIZE if info.image.keeps_size else (info.image.height, info.image.width))
    sheets, written = {}, []  # sheets: split -> JPEG for the page; the PNG files keep every pixel
    group_sheets: dict[str, bytes] = {}  # the largest split groups' sheets, by group id
    for split, sample in report.samples.items():
        if not sample.examples:
            title = f"{split}: {info.splits[split].num_examples} examples"  # Nothing to explain the layout of.
        else:
            title = (
                f"{split}: {len(sample.examples)} of {info.splits[split].num_examples} examples, seed "
                f"{report.seed}, {info.image.size_text} {info.image.format}"
                + (" (left: stored, right: training view)" if augmented else "")
            )
        sheet, tiles = draw_contact_sheet(
            sample.examples, title=title, image_size=image_size, tile=tile, augmented=augmented, note=sample.error
        )
        sheets[split] = sheet_jpeg(sheet)
        path = os.path.join(out_dir, f"contact_sheet-{split}.png")
        with open(path, "wb") as handle:
            handle.write(sheet_png(sheet, tiles))
        written.append(path)
    for index, group in enumerate(report.groups, start=1):
        title = (
            f"group {group.group}: {plural(group.size, 'input')}, {len(group.examples)} shown, "
            f"in {', '.join(group.splits) or 'no split read'}"
        )
        sheet, tiles = draw_contact_sheet(group.examples, title=title, image_size=image_size, tile=tile)
        group_sheets[group.group] = sheet_jpeg(sheet)
        path = os.path.join(out_dir, f"group_sheet-{index}.png")
        with open(path, "wb") as handle:
            handle.write(sheet_png(sheet, tiles))
        written.append(path)
    chart = draw_class_counts(
        {s: report.class_counts[s] for s in report.splits},
        title=f"examples per class ({os.path.basename(report.data_dir.rstrip('/'))})",
    )
    path = os.path.join(out_dir, "class_counts.png")
    with open(path, "wb") as handle:
        handle.write(chart)
    written.append(path)
    path = os.path.join(out_dir, "report.html")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(render_report(report, sheets=sheets, chart=chart, group_sheets=group_sheets))
    written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """The inspect command: checks the arguments before TensorFlow is imported, then gathers and writes the report."""
    parser = CommandParser(
        prog=PROG,
        description="Draw contact sheets and a class histogram of a converted dataset, read through "
        "tfdata_readers (what training sees), and write them with a self-contained report.html.",
    )
    parser.add_argument("data_dir", help="directory (or gs:// URI) holding dataset_info.json")
    parser.add_argument(
        "--out", required=True, help="folder for contact_sheet-<split>.png, class_counts.png, report.html"
    )
    parser.add_argument(
        "--num_examples", type=_positive, default=None, help="examples per contact sheet, at most the split's size [64]"
    )
    parser.add_argument(
        "--seed", type=_seed, default=0, help="which examples are drawn, and the training view's crops [0]"
    )
    parser.add_argument(
        "--augmented", action="store_true", help="show each example's training view (crop, flip) beside it"
    )
    parser.add_argument("--split", action="append", help="split to sample (repeatable); default: all")
    parser.add_argument(
        "--scan",
        type=_positive,
        default=None,
        help="records read per split to draw the sample from; shards are hash-mixed, so the first are "
        "as good as any [4096, or --num_examples if larger]",
    )
    parser.add_argument(
        "--tile", type=int, default=160, help="largest side of one picture on the sheet, in pixels [160]"
    )
    parser.add_argument(
        "--version",
        type=_positive,
        default=None,
        help="dataset version to inspect; default: the current one (the root dataset_info.json)",
    )
    args = parser.parse_args(argv)
    # Each default gives way to the other flag when only that one is given: the message below
    # then only ever names flags the user wrote.
    if args.num_examples is not None and args.scan is not None and args.num_examples > args.scan:
        parser.error(f"--num_examples {args.num_examples} is more than --scan {args.scan}")
    num_examples = args.num_examples or min(64, args.scan or 64)
    scan = args.scan or max(4096, num_examples)
    if args.tile < 32:
        parser.error(f"--tile must be at least 32 (got {args.tile})")
    if problem := _out_problem(args.out):
        print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    import_tensorflow_for_command(PROG)
    from tfdata_readers.inspection.gather import gather  # pylint: disable=import-outside-toplevel

    try:
        report = gather(
            args.data_dir,
            num_examples=num_examples,
            seed=args.seed,
            augmented=args.augmented,
            scan=scan,
            splits=args.split,
            version=args.version,
        )
    except (OSError, ValueError) as error:  # no manifest, bad JSON, newer schema, unknown split
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    from tfdata_readers.inspection.group_sheets import with_largest_groups  # pylint: disable=import-outside-toplevel

    report = with_largest_groups(report)
    notes = sample_notes(report, num_examples, asked=args.num_examples is not None)
    written = write_inspection(report, args.out, augmented=args.augmented, tile=args.tile)
    print(text_summary(report, written, notes))
    problems = (
        any(not r.verified for r in report.shards)
        or report.other_problems
        or any(s.error for s in report.samples.values())
        or report.dead_letters_note
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
