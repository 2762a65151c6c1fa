"""The job's own command-line flags and its --help, with no Beam or TensorFlow import.

Declared here once: ConversionOptions (options.py) hands them to Beam's parser, and the command
line (cli.py) builds --help from them, so that --help and a misspelt flag answer at once instead
of after Beam's second of imports.
"""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable

from beam_jobs import __version__
from beam_jobs.command_line.program import PROG
from beam_jobs.config import ImageConfig
from beam_jobs.imaging.resample import RESAMPLE_METHODS
from beam_jobs.planning.group_rules import DEFAULT_NEAR_COPY_BITS, SPLIT_GROUPS
from beam_jobs.planning.rules import DEFAULT_SPLIT_RULE, DEFAULT_TARGET_SHARD_MB, RELABEL_CHOICES, SPLIT_RULES

__all__ = ["LOG_LEVELS", "PROG", "add_job_flags", "help_parser", "unknown_flag_message"]

_DEFAULTS = ImageConfig()
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")

_EXAMPLES = f"""examples:
  {PROG} --input ~/photos --output_dir ~/tfrecords --image_size 224
  {PROG} --input ~/photos --output_dir ~/tfrecords --splits train=0.9,validation=0.1 --plan_only
  {PROG} --manifest gs://bucket/images.csv --output_dir gs://bucket/tfrecords \\
      --runner DataflowRunner --project P --region R --temp_location gs://bucket/tmp --setup_file ./setup.py

Every other Beam pipeline option passes through (--direct_num_workers, --project, --flink_master,
...; see Beam's PipelineOptions reference), and with --runner FlinkRunner or SparkRunner the
options their job servers describe (--max_bundle_size, --checkpointing_interval, --storage_level,
...; docs/clusters.md). With no --runner the job runs on all local cores. An argument the job
does not know is an error."""


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """Adds the job's flags to ``parser``, in groups that follow the conversion."""
    _add_input_flags(parser)
    _add_output_flags(parser)
    _add_annotation_flags(parser)
    _add_image_flags(parser)
    _add_split_flags(parser)
    _add_robustness_flags(parser)
    _add_run_flags(parser)


def _add_input_flags(parser: argparse.ArgumentParser) -> None:
    """The "inputs" group of flags."""
    group = parser.add_argument_group("inputs", "what to convert")
    group.add_argument(
        "--input",
        metavar="DIR",
        help="root of a class-per-folder tree: ROOT/<label>/<image> or "
        "ROOT/<split>/<label>/<image>; a local path or any Beam filesystem URI (gs://...)",
    )
    group.add_argument(
        "--manifest",
        metavar="FILE",
        help="a CSV (header: uri,label[,split]) or JSONL list of the input "
        "images; relative uris are relative to the list's folder",
    )
    group.add_argument(
        "--tree_layout",
        default="auto",
        choices=("auto", "label", "split_label"),
        help="how --input's folders name things: label = ROOT/<label>/<image>; "
        "split_label = ROOT/<split>/<label>/<image>; auto = split_label when every image is "
        "three levels deep under top folders named like splits (train, validation, val, "
        "test, ...), else label (default: %(default)s)",
    )
    group.add_argument(
        "--allow_outside_root",
        action="store_true",
        default=False,
        help="accept manifest entries and symlinks that lead outside the input root "
        "(absolute paths elsewhere, other buckets, ..)",
    )
    group.add_argument(
        "--dedup",
        default="path",
        choices=("path", "content"),
        help="path: the same path listed twice is one input; content: also files with "
        "identical bytes (the first name is kept; copies with conflicting labels are all "
        "dead letters). With path, identical-content copies are kept and reported in "
        "dataset_info.json (default: %(default)s)",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    """The "output" group of flags."""
    group = parser.add_argument_group("output", "where the dataset goes, and its shards")
    group.add_argument("--output_dir", metavar="DIR", help="where shards, dataset_info.json and dead_letters.jsonl go")
    group.add_argument(
        "--num_shards",
        type=int,
        default=0,
        help="shards per split; 0 derives it from --target_shard_mb (default: %(default)s)",
    )
    group.add_argument(
        "--target_shard_mb",
        type=float,
        default=DEFAULT_TARGET_SHARD_MB,
        help="approximate shard size when --num_shards is 0; there are always enough "
        "shards to keep many workers busy (default: %(default)s)",
    )


def _add_annotation_flags(parser: argparse.ArgumentParser) -> None:
    """The "annotations" group of flags."""
    group = parser.add_argument_group("annotations", "boxes and several labels per image (docs/annotations.md)")
    group.add_argument(
        "--coco_annotations",
        default=None,
        help="a COCO annotation file (or train=FILE,validation=FILE), naming images under --input: "
        "each example holds its boxes and classes",
    )
    group.add_argument(
        "--unannotated",
        default="keep",
        choices=("keep", "drop"),
        help="what to do with a COCO file's images that have no annotation (default: %(default)s)",
    )
    group.add_argument(
        "--coco_masks",
        action="store_true",
        help="also store each COCO object's mask (its polygons or RLE) as image/object/mask, a PNG per object",
    )
    group.add_argument(
        "--annotation_frame",
        default="auto",
        choices=("auto", "stored", "upright"),
        help="the frame boxes and masks are drawn in, for images that EXIF turns: auto (a COCO "
        "file's width and height tell; an input list's are as stored; an image whose turn keeps "
        "its size is refused, since neither tells), stored (the file's pixels as stored) or "
        "upright (the image as shown) (default: %(default)s)",
    )


def _add_image_flags(parser: argparse.ArgumentParser) -> None:
    """The "image" group of flags."""
    group = parser.add_argument_group("image", "what each example holds")
    group.add_argument(
        "--image_size",
        default=None,
        help=f"output size: 224 or WIDTHxHEIGHT such as 256x192 (default: {_DEFAULTS.width}; not with "
        "--resize_mode keep)",
    )
    group.add_argument(
        "--resize_mode",
        default=_DEFAULTS.resize_mode,
        choices=("crop", "pad", "stretch", "keep"),
        help="crop: shorter side then centre crop; pad: fit then letterbox; "
        "stretch: ignore the aspect ratio; keep: each image at its own size (a JPEG that needs no "
        "rotation or colour conversion is stored byte for byte), for detection and segmentation "
        "models that resize on the fly (default: %(default)s)",
    )
    group.add_argument(
        "--max_side",
        type=int,
        default=None,
        help="with --resize_mode keep: shrink images whose longer side is larger to this many "
        "pixels, keeping the aspect ratio (default: keep every size)",
    )
    group.add_argument(
        "--resample",
        default=None,
        choices=RESAMPLE_METHODS,
        help="how pixels are resampled to --image_size: dct_sinc (a JPEG decoded at its smallest DCT "
        "scale above the output, then a windowed-sinc prefilter and OpenCV's bicubic sampling), "
        "dct_bicubic (the same reduction, then Pillow's bicubic), dct_linear (the same reduction, "
        "then an antialiasing prefilter and OpenCV's bit-exact bilinear: faster, softer), Pillow's "
        "bicubic, bilinear or lanczos, or antialias and area, which let fine periodic detail through "
        "as moire between a 1x and a 2x shrink; their speed and quality: docs/converting.md "
        "(default: dct_sinc for a new dataset; --resume and --append keep the dataset's own)",
    )
    group.add_argument(
        "--channels",
        type=int,
        default=_DEFAULTS.channels,
        choices=(1, 3),
        help="3 for RGB, 1 for grayscale (default: %(default)s)",
    )
    group.add_argument(
        "--encoding",
        default=_DEFAULTS.encoding,
        choices=("jpeg", "png", "raw"),
        help="how image/encoded is stored (default: %(default)s)",
    )
    group.add_argument("--jpeg_quality", type=int, default=_DEFAULTS.jpeg_quality, help="1-100 (default: %(default)s)")


def _add_split_flags(parser: argparse.ArgumentParser) -> None:
    """The "splits" group of flags."""
    group = parser.add_argument_group("splits", "which split each input goes to")
    group.add_argument(
        "--splits",
        default=None,
        help="split fractions for inputs without one, e.g. "
        "train=0.9,validation=0.1 (default: everything in train); split folders of the tree "
        "and the input list's split column win",
    )
    group.add_argument(
        "--split_rule",
        default=DEFAULT_SPLIT_RULE,
        choices=SPLIT_RULES,
        help="stratified: exactly the fractions, overall and per class (largest remainder "
        "over each class's inputs in hash order), every class with at least as many inputs "
        "as splits in every split; hash: each input by its own stable hash of the relative "
        "path, only near the fractions, but adding inputs never moves another "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--split_groups",
        default="none",
        choices=SPLIT_GROUPS,
        help="near_copies: inputs whose perceptual signatures (a 64-bit DCT hash of the upright "
        "image in grey, and its colours, computed before planning) are within --near_copy_bits, "
        "and byte-identical inputs, form one group, and a group never spans two splits, so that "
        "no validation image is a re-encoded, resized or slightly cropped copy of a training one "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--near_copy_bits",
        type=int,
        default=DEFAULT_NEAR_COPY_BITS,
        help="the largest Hamming distance between the grey hashes of near-copies, of 64 bits "
        "(default: %(default)s; docs/leakage.md measures recall and false groups per value)",
    )
    group.add_argument(
        "--group_pattern",
        default=None,
        help="a regular expression with one capture group: a tree's inputs whose relative paths "
        "give the same capture share a split (e.g. '(patient_[0-9]+)_' or '^[^/]+/(video[0-9]+)_'); "
        "an input list's group column does the same",
    )


def _add_robustness_flags(parser: argparse.ArgumentParser) -> None:
    """The "robustness" group of flags."""
    group = parser.add_argument_group("robustness", "what counts as a bad input, and how much of it a run accepts")
    group.add_argument(
        "--max_pixels",
        type=int,
        default=_DEFAULTS.max_pixels,
        help="refuse images whose header claims more pixels (default: %(default)s)",
    )
    group.add_argument(
        "--max_file_mb",
        type=float,
        default=_DEFAULTS.max_file_bytes / 2**20,
        help="refuse larger files without reading them (default: %(default)s)",
    )
    group.add_argument(
        "--isolation",
        default=_DEFAULTS.isolation,
        choices=("none", "risky", "all"),
        help="which decodes run in a child process with a timeout, so a hanging or "
        "crashing decoder costs one dead letter, not a worker: risky = all but JPEG and "
        "PNG (default: %(default)s)",
    )
    group.add_argument(
        "--decode_timeout_s",
        type=float,
        default=_DEFAULTS.decode_timeout_s,
        help="time limit of one isolated decode (default: %(default)s)",
    )
    group.add_argument(
        "--max_bad_fraction",
        type=float,
        default=0.01,
        help="fail the job when more inputs than this are dead letters (default: %(default)s)",
    )


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The "runs" group of flags."""
    group = parser.add_argument_group("runs", "versions, resuming, appending, and what the console shows")
    group.add_argument(
        "--plan_only",
        action="store_true",
        default=False,
        help="list and plan, read no image, and write plan.json (per split: examples and "
        "shards; per class counts; the listing's dead letters) into --output_dir: check a long "
        "job's class balance and shard count in seconds before paying for it",
    )
    group.add_argument(
        "--overwrite",
        action="store_true",
        default=False,
        help="commit a new version of the dataset in --output_dir holding only this run's "
        "examples, once this run succeeds (the version it replaces stays readable for the "
        "retention window, see --keep_versions); with --resume, continue an interrupted "
        "--overwrite run",
    )
    group.add_argument(
        "--append",
        action="store_true",
        default=False,
        help="commit a new version that adds to the current one the inputs it does not hold "
        "yet (same flags as the run that made it); its shards stay untouched and label ids "
        "never change",
    )
    group.add_argument(
        "--changed_sources",
        default="refuse",
        choices=("refuse", "keep"),
        help="--append, when inputs of the current version changed or disappeared since they "
        "were converted: refuse = convert nothing and list them; keep = keep their examples as "
        "they are, with a warning in dataset_info.json (default: %(default)s)",
    )
    group.add_argument(
        "--relabel",
        default="keep",
        choices=RELABEL_CHOICES,
        help="label ids of a new version of a dataset: keep = each label keeps the id the "
        "current version gives it, new labels take the next ids, a removed label's id is never "
        "reused (the first version's ids are the sorted names); sorted = number the labels by "
        "their sorted names, as a first version does, and print each id that changes (not with "
        "--append) (default: %(default)s)",
    )
    group.add_argument(
        "--keep_versions",
        type=int,
        default=2,
        help="after a commit, keep the files of this many versions (the new one and those "
        "before it) and remove older versions' files; a trainer still reading the previous "
        "version goes on reading it whole (default: %(default)s)",
    )
    group.add_argument(
        "--resume",
        action="store_true",
        default=False,
        help="continue an interrupted run with the same flags: shards already complete "
        "and verified (size and sha256) are kept, the rest are redone",
    )
    group.add_argument(
        "--log_level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        help="how much of Beam's and the workers' own logging to show; DEBUG also shows "
        "the full trace of a failure (default: %(default)s: the job's progress and "
        "summary, and every warning and error)",
    )


def help_parser() -> argparse.ArgumentParser:
    """The parser behind --help: the job's own flags, -v and the runner (Beam has hundreds more)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage="%(prog)s (--input DIR | --manifest FILE) --output_dir DIR [flags] [Beam pipeline options]",
        description="Convert a folder tree or a CSV/JSONL list of images into deterministic, sharded\n"
        "TFRecords of tf.train.Example, with dataset_info.json and dead_letters.jsonl.",
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_job_flags(parser)
    group = parser.add_argument_group("runner")
    group.add_argument(
        "-v",
        action="count",
        dest="verbosity",
        help="-v is --log_level INFO (per-shard lines, counters, Beam's own INFO lines); -vv is --log_level DEBUG",
    )
    group.add_argument(
        "--runner",
        help="Beam's runner: DataflowRunner, FlinkRunner, PortableRunner, ... "
        "(default: the local FnApiRunner on every core)",
    )
    group.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def unknown_flag_message(token: str, known: Iterable[str]) -> str:
    """What the job says about an argument no parser knows, with the nearest known flag."""
    if not token.startswith("-"):
        return f"unexpected argument {token!r}: every job argument is a --flag (e.g. --input {token})"
    name = token.split("=", 1)[0]
    known = sorted(known)
    guesses = difflib.get_close_matches(name.replace("-", "_").replace("__", "--", 1), known, n=1, cutoff=0.6)
    guesses = guesses or difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean {guesses[0]}?" if guesses else f"; see {PROG} --help"
    return f"unrecognized argument {name}{hint}"
