"""One conversion, described once: ``ConversionSpec``, a frozen and validated value.

The command line builds it from argv (command_line/arguments.py), ``beam_jobs.convert`` from its
keywords (api.py), and a pipeline author may build one directly; everything below them takes the
spec and reads typed fields, so no module past the entry points parses a string or reads argv.
Each part validates itself when it is made and names the bad value, so a bad spec cannot exist.

The messages name the command line's flags (``--keep_versions``); ``convert`` shows them in
keyword terms (api.in_keyword_terms), so each message is written once.

Pure: no Beam, no TensorFlow, no I/O.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from beam_jobs.config import ImageConfig, checked_splits, parse_image_size, parse_splits
from beam_jobs.errors import BadInputError, UsageError
from beam_jobs.listing.names import clean_split_name
from beam_jobs.planning.group_rules import (
    DEFAULT_NEAR_COPY_BITS,
    MAX_CHROMA_STEP,
    MAX_NEAR_COPY_BITS,
    MAX_TONE_STEPS,
    PERCEPTUAL_HASH,
    PERCEPTUAL_HASHES,
    SPLIT_GROUPS,
)
from beam_jobs.planning.rules import DEFAULT_SPLIT_RULE, DEFAULT_TARGET_SHARD_MB, RELABEL_CHOICES, SPLIT_RULES
from beam_jobs.typed_fields import check_field_types

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "TREE_LAYOUTS",
    "ConversionSpec",
    "Limits",
    "RunMode",
    "ShardSpec",
    "Source",
    "SplitSpec",
    "absolute_uri",
    "parse_coco_split_files",
    "run_settings",
]

TREE_LAYOUTS = ("auto", "label", "split_label")
DEDUP_MODES = ("path", "content")
CHANGED_SOURCES = ("refuse", "keep")
# The smallest shard target worth having: below it every example would be a shard of its own.
MIN_TARGET_SHARD_MB = 0.01


_Part = TypeVar("_Part", bound="DataclassInstance")


def _one_of(name: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        raise UsageError(f"{name} must be one of {', '.join(map(str, choices))} (got {value!r})")


def finite(name: str, value: float, *, low: float, low_inclusive: bool = False, high: float = math.inf) -> float:
    """``value`` when it is a finite number within the bounds, else a UsageError naming ``name``."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value >= low if low_inclusive else value > low)
        and value <= high
    )
    if not ok:
        bound = f">= {low}" if low_inclusive else f"> {low}"
        upper = "" if math.isinf(high) else f" and <= {high}"
        raise UsageError(f"{name} must be a finite number {bound}{upper} (got {value!r})")
    return value


def absolute_uri(path: str | os.PathLike[str]) -> str:
    """A local path made absolute (against the working directory), a URI unchanged; no "/" at the end."""
    path = os.fspath(path)
    if "://" in path and not path.split("://", 1)[1].strip("/"):
        raise UsageError(f"{path!r} names no bucket: give gs://BUCKET/FOLDER (or s3://...)")
    if "://" not in path:
        path = os.path.abspath(os.path.expanduser(path))
    return path.rstrip("/") or "/"


def _resolved_path(name: str, value: object) -> object:
    """A path field as the spec keeps it: a str or os.PathLike made an absolute local path (against
    the working directory of the moment the spec is made, so a later os.chdir changes nothing) or
    a URI; anything else is returned as it is, for the type check to name."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if isinstance(value, str):
        if not value.strip():
            raise UsageError(f"{name} must be a path, not an empty string")
        return absolute_uri(value)
    return value


def _coco_split(name: object) -> object:
    """A COCO file's split by the one split-name policy (lower case; letters, digits, '_' and '-'),
    as --splits names are: the split becomes the start of shard file names."""
    if not isinstance(name, str):
        return name  # None (the split comes from --splits), or a wrong type for the type check to name
    try:
        return clean_split_name(name, where="--coco_annotations")
    except BadInputError as error:
        raise UsageError(error.detail) from None


def parse_coco_split_files(text: str) -> list[tuple[str | None, str]]:
    """``FILE`` or ``train=FILE,validation=FILE`` as [(split or None, file)]."""
    items = [part.strip() for part in str(text).split(",") if part.strip()]
    if not items:
        raise ValueError("--coco_annotations needs a file (or train=FILE,validation=FILE)")
    pairs: list[tuple[str | None, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if sep and "/" not in name and name.strip():
            pairs.append((name.strip().lower(), path.strip()))
        else:
            pairs.append((None, item))
    if len(pairs) > 1 and any(split is None for split, _ in pairs):
        raise ValueError(f"--coco_annotations: name each file's split (train=FILE,validation=FILE) (got {text!r})")
    return pairs


@dataclass(frozen=True)
class Source:
    """Where the images come from: exactly one of a folder tree (``root``, whose images a COCO file
    may name instead of its folders), an input list (``input_list``, CSV or JSONL), or rows that a
    pipeline hands to ConvertImages (``rows_root``, which their relative uris are relative to).

    Attributes:
      coco_files: (split or None, COCO file) pairs; the images they name lie under ``root``.
      keep_unannotated: a COCO image with no annotation is kept (as an example without boxes).
      coco_masks: COCO segmentations are stored as masks too.
      tree_layout: how a tree's folders name things: "label", "split_label" or "auto".
      allow_outside_root: list entries and symlinks that lead outside the root are accepted.
      dedup: "path" (one path listed twice is one input) or "content" (identical bytes too).
    """

    root: str | None = None
    input_list: str | None = None
    rows_root: str | None = None
    coco_files: tuple[tuple[str | None, str], ...] = ()
    keep_unannotated: bool = True
    coco_masks: bool = False
    tree_layout: str = "auto"
    allow_outside_root: bool = False
    dedup: str = "path"

    def __post_init__(self) -> None:
        for name in ("root", "input_list", "rows_root"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _resolved_path(f"Source.{name}", getattr(self, name)))
        if isinstance(self.coco_files, (tuple, list)):
            object.__setattr__(
                self,
                "coco_files",
                tuple(
                    (_coco_split(pair[0]), _resolved_path("Source.coco_files", pair[1]))
                    if isinstance(pair, (tuple, list)) and len(pair) == 2
                    else pair
                    for pair in self.coco_files
                ),
            )
        check_field_types(self)
        if sum(source is not None for source in (self.root, self.input_list, self.rows_root)) != 1:
            raise UsageError(
                "a source is exactly one of root (a tree), input_list (a CSV/JSONL file) and rows_root "
                f"(rows applied as a PCollection) (got root={self.root!r}, input_list={self.input_list!r}, "
                f"rows_root={self.rows_root!r})"
            )
        if self.coco_files and self.root is None:
            raise UsageError("--coco_annotations names images under --input (the image root): give --input too")
        _one_of("--tree_layout", self.tree_layout, TREE_LAYOUTS)
        _one_of("--dedup", self.dedup, DEDUP_MODES)

    @property
    def kind(self) -> str:
        """ "coco", "tree", "list" or "rows": which listing transform reads this source."""
        if self.coco_files:
            return "coco"
        if self.root is not None:
            return "tree"
        return "list" if self.input_list is not None else "rows"

    @property
    def where(self) -> str:
        """The source as messages name it: the root, the list file, or the rows' root."""
        if self.rows_root is not None:
            return f"the rows under {self.rows_root}"
        return self.root or self.input_list or ""


class Fractions(Mapping[str, float]):
    """The split fractions a SplitSpec holds: read like the dict they were given as (and equal to
    it), but unchangeable and hashable, so that a spec validated once stays valid (no split can
    be renamed or resized after the check) and can key a cache."""

    def __init__(self, fractions: Mapping[str, float]) -> None:
        self._items = tuple((name, float(value)) for name, value in fractions.items())  # 1 and 1.0: one form

    def __getitem__(self, name: str) -> float:
        for key, value in self._items:
            if key == name:
                return value
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._items) == dict(other.items())

    def __hash__(self) -> int:
        return hash(frozenset(self._items))

    def __repr__(self) -> str:
        return repr(dict(self._items))


@dataclass(frozen=True)
class SplitSpec:
    """How inputs without a split of their own get one: ``fractions`` ({"train": 0.9, ...}, summing
    to 1; None: every input is "train" unless it names its split) by ``rule`` ("stratified": per
    class, as close to the fractions as counts allow; "hash": each input by its own hash)."""

    fractions: Mapping[str, float] | None = None
    rule: str = DEFAULT_SPLIT_RULE
    # --split_groups near_copies: inputs whose perceptual hashes are at most ``near_copy_bits``
    # apart share a split; ``group_pattern``: a tree's inputs whose relative paths give the same
    # capture of this regular expression share one too (an input list's group column does so).
    groups: str = "none"
    near_copy_bits: int = DEFAULT_NEAR_COPY_BITS
    group_pattern: str | None = None
    # The signature (group_rules.PERCEPTUAL_HASHES); None: new datasets' PERCEPTUAL_HASH. A run
    # that continues a dataset made with another keeps it (preflight.with_dataset_defaults).
    near_copy_method: str | None = None

    @property
    def signs_tone(self) -> bool:
        """Whether signatures carry the tone bytes (every method but the legacy one)."""
        return (self.near_copy_method or PERCEPTUAL_HASH) == PERCEPTUAL_HASH

    def group_settings(self, *, grey: bool = False) -> dict[str, Any] | None:
        """What the run fingerprint and the manifest record of the groups (None: none asked for).
        ``grey``: the dataset is stored in grey (--channels 1), so near-copies are compared by the
        grey hash alone: a colour photo and its grey copy are one stored image."""
        settings: dict[str, Any] = {}
        if self.groups == "near_copies":
            settings.update(
                method=self.near_copy_method or PERCEPTUAL_HASH,
                near_copy_bits=self.near_copy_bits,
                max_chroma_step=None if grey else MAX_CHROMA_STEP,
            )
            if self.signs_tone:
                settings["max_tone_steps"] = list(MAX_TONE_STEPS)
        if self.group_pattern is not None:
            settings["group_pattern"] = self.group_pattern
        return settings or None

    def __post_init__(self) -> None:
        check_field_types(self)
        _one_of("--split_rule", self.rule, SPLIT_RULES)
        _one_of("--split_groups", self.groups, SPLIT_GROUPS)
        if self.near_copy_method is not None:
            _one_of("the near-copy method", self.near_copy_method, PERCEPTUAL_HASHES)
        if not 0 <= self.near_copy_bits <= MAX_NEAR_COPY_BITS:
            raise UsageError(
                f"--near_copy_bits must be between 0 and {MAX_NEAR_COPY_BITS} of the hash's 64 bits "
                f"(got {self.near_copy_bits}); distinct photos are about 32 bits apart"
            )
        if self.groups != "near_copies" and self.near_copy_bits != DEFAULT_NEAR_COPY_BITS:
            raise UsageError(f"--near_copy_bits {self.near_copy_bits} has no effect without --split_groups near_copies")
        if self.group_pattern is not None:
            try:
                compiled = re.compile(self.group_pattern)
            except re.error as error:
                raise UsageError(
                    f"--group_pattern {self.group_pattern!r} is not a regular expression: {error}"
                ) from None
            if compiled.groups != 1:
                raise UsageError(
                    f"--group_pattern {self.group_pattern!r} must have exactly one capture group, the group's "
                    f"name (it has {compiled.groups}), e.g. '^(patient_[0-9]+)_'"
                )
        if self.fractions is not None:
            try:
                checked = checked_splits(self.fractions.items(), shown=dict(self.fractions))
            except ValueError as error:
                raise UsageError(str(error)) from None
            object.__setattr__(self, "fractions", Fractions(checked))


@dataclass(frozen=True)
class ShardSpec:
    """How many shards each split gets: ``num_shards`` each (None: derived from the size), or
    enough that each holds about ``target_shard_mb`` MiB."""

    num_shards: int | None = None
    target_shard_mb: float = DEFAULT_TARGET_SHARD_MB

    def __post_init__(self) -> None:
        check_field_types(self)
        if isinstance(self.target_shard_mb, float) and self.target_shard_mb.is_integer():
            # One form for one value: 150.0 (a flag's float) is kept as 150 (the default's int),
            # so that equal specs hash to one run fingerprint and --resume keeps their shards.
            object.__setattr__(self, "target_shard_mb", int(self.target_shard_mb))
        if self.num_shards == 0 and not isinstance(self.num_shards, bool):
            object.__setattr__(self, "num_shards", None)  # 0, as on the command line: derived
        if self.num_shards is not None and (isinstance(self.num_shards, bool) or self.num_shards < 1):
            raise UsageError(f"--num_shards must be >= 0 (0: derived from --target_shard_mb) (got {self.num_shards!r})")
        finite("--target_shard_mb", self.target_shard_mb, low=MIN_TARGET_SHARD_MB, low_inclusive=True, high=2**20)

    @property
    def target_bytes(self) -> int:
        """--target_shard_mb in bytes, at least one, the unit the shard planner counts in."""
        return max(1, int(self.target_shard_mb * 2**20))


@dataclass(frozen=True)
class Limits:
    """How much bad input a run bears: above ``max_bad_fraction`` of the inputs as dead letters,
    nothing is committed."""

    max_bad_fraction: float = 0.01

    def __post_init__(self) -> None:
        check_field_types(self)
        finite("--max_bad_fraction", self.max_bad_fraction, low=0.0, low_inclusive=True, high=1.0)


@dataclass(frozen=True)
class RunMode:
    """What the run does to the output folder: create a first version, ``overwrite`` the current
    one, ``append`` to it (``changed_sources``: "refuse" or "keep" the inputs that changed since),
    continue an interrupted run (``resume``), or only write the plan (``plan_only``). ``relabel``
    "keep" carries the lineage's label ids on, "sorted" renumbers them; ``keep_versions`` versions'
    files are kept after a commit."""

    overwrite: bool = False
    append: bool = False
    resume: bool = False
    plan_only: bool = False
    changed_sources: str = "refuse"
    relabel: str = "keep"
    keep_versions: int = 2

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.append and self.overwrite:
            raise UsageError("give at most one of --append (add to the current version) and --overwrite (replace it)")
        if self.plan_only and self.append:
            raise UsageError(
                "--plan_only plans a first version, not what --append would add: run the append itself "
                "(it refuses before converting anything when held inputs changed)"
            )
        _one_of("--relabel", self.relabel, RELABEL_CHOICES)
        _one_of("--changed_sources", self.changed_sources, CHANGED_SOURCES)
        if self.append and self.relabel == "sorted":
            raise UsageError(
                "--relabel sorted renumbers label ids, and --append keeps the current version's shards with their "
                "ids: rebuild with --overwrite --relabel sorted instead"
            )
        if isinstance(self.keep_versions, bool) or self.keep_versions < 1:
            raise UsageError(f"--keep_versions must be >= 1 (the new version's own files) (got {self.keep_versions!r})")


def run_settings(
    *,
    split_fractions: Mapping[str, float] | None,
    split_rule: str,
    num_shards: int | None,
    target_shard_mb: float,
    dedup: str,
    split_groups: Mapping[str, Any] | None = None,
) -> dict:
    """The settings besides ImageConfig that shape the output, as dataset_info.json records them and
    the run fingerprint hashes them: one shape however the spec was made, so that the same
    settings given either way make the same fingerprint (and --resume keeps the shards)."""
    return {
        "splits": None if split_fractions is None else dict(split_fractions),
        "split_rule": split_rule,
        "num_shards": num_shards,
        "target_shard_mb": target_shard_mb,
        "dedup": dedup,
        # Only when some are asked for: the fingerprints of runs made without groups never change.
        **({"split_groups": dict(split_groups)} if split_groups else {}),
    }


@dataclass(frozen=True)
class ConversionSpec:
    """A whole conversion: the source, the image settings, splits, shards, limits, the run mode,
    and where it goes. Local paths (str or os.PathLike) are made absolute when the spec is made.

    ``runner_args`` are Beam's own options (``--runner``, ``--direct_num_workers``, ...), as
    ``--flag=value`` strings for Beam's PipelineOptions. They are left out of equality: they
    choose where the job runs, never what it writes (every runner writes the same bytes).
    """

    source: Source
    output_dir: str
    image: ImageConfig = field(default_factory=ImageConfig)
    splits: SplitSpec = field(default_factory=SplitSpec)
    shards: ShardSpec = field(default_factory=ShardSpec)
    limits: Limits = field(default_factory=Limits)
    mode: RunMode = field(default_factory=RunMode)
    log_level: str = "WARNING"
    runner_args: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not self.output_dir:
            raise UsageError("--output_dir is required")
        object.__setattr__(self, "output_dir", _resolved_path("output_dir", self.output_dir))
        check_field_types(self)
        _one_of("--log_level", self.log_level, ("DEBUG", "INFO", "WARNING", "ERROR"))

    @property
    def settings(self) -> dict:
        """The settings besides ImageConfig that shape the output (part of the run fingerprint)."""
        return run_settings(
            split_fractions=self.splits.fractions,
            split_rule=self.splits.rule,
            num_shards=self.shards.num_shards,
            target_shard_mb=self.shards.target_shard_mb,
            dedup=self.source.dedup,
            split_groups=self.splits.group_settings(grey=self.image.channels == 1),
        )

    def replace(self, **changes: Any) -> ConversionSpec:
        """A copy with some parts changed (dataclasses.replace), validated again."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_flags(cls, values: Mapping[str, Any], runner_args: Sequence[str] = ()) -> ConversionSpec:
        """The spec the job's flags stand for: ``values`` maps each flag's name (``image_size``,
        ``splits``, ...) to its typed value as Beam's parser or convert()'s keywords give it.
        The one place where the flags' few textual forms (``256x192``, ``train=0.9,...``) are read."""
        if bool(values.get("input")) == bool(values.get("manifest")):
            raise UsageError(
                "give exactly one of --input DIR_OR_URI and --manifest FILE"
                + (" (got both)" if values.get("input") else "")
            )
        if not values.get("output_dir"):
            raise UsageError("--output_dir is required")
        finite("--max_file_mb", values["max_file_mb"], low=0.0, high=2**20)
        finite("--decode_timeout_s", values["decode_timeout_s"], low=0.0, high=86400.0)
        try:
            image = _image_config(values)
            fractions = _fractions(values.get("splits"))
            coco_files: tuple[tuple[str | None, str], ...] = ()
            if values.get("coco_annotations"):
                if not values.get("input"):
                    raise ValueError("--coco_annotations names images under --input (the image root): give --input too")
                coco_files = tuple(
                    (split, absolute_uri(path)) for split, path in parse_coco_split_files(values["coco_annotations"])
                )
        except ValueError as error:
            raise UsageError(str(error)) from None
        return cls(
            source=_part_from_flags(
                Source,
                values,
                root=absolute_uri(values["input"]) if values.get("input") else None,
                input_list=absolute_uri(values["manifest"]) if values.get("manifest") else None,
                rows_root=None,
                coco_files=coco_files,
                keep_unannotated=values["unannotated"] == "keep",
            ),
            output_dir=absolute_uri(values["output_dir"]),
            image=image,
            splits=SplitSpec(
                fractions=fractions,
                rule=values["split_rule"],
                groups=values["split_groups"],
                near_copy_bits=values["near_copy_bits"],
                group_pattern=values["group_pattern"] or None,
            ),
            shards=ShardSpec(num_shards=values["num_shards"], target_shard_mb=values["target_shard_mb"]),
            limits=Limits(max_bad_fraction=values["max_bad_fraction"]),
            mode=_part_from_flags(RunMode, values),
            log_level=values["log_level"],
            runner_args=tuple(runner_args),
        )


def _image_config(values: Mapping[str, Any]) -> ImageConfig:
    size = values.get("image_size")
    if size is not None and values["resize_mode"] == "keep":
        raise ValueError(
            "--image_size does not apply with --resize_mode keep: each image keeps its own size "
            "(--max_side caps its longer side)"
        )
    width, height = parse_image_size(size if size is not None else str(ImageConfig().width))
    return _part_from_flags(
        ImageConfig,
        values,
        width=width,
        height=height,
        max_file_bytes=max(1, int(values["max_file_mb"] * 2**20)),
        grey_decode=None,  # no flag: the dataset a run continues decides it (preflight.with_dataset_defaults)
    )


def _part_from_flags(part: type[_Part], values: Mapping[str, Any], **derived: Any) -> _Part:
    """The spec part ``part`` (a dataclass) whose fields are the flags of the same names, except
    the ``derived`` ones, given here. Every other field must have its flag in ``values``: a field
    added to a part without its flag is a KeyError at once, never a default taken silently."""
    named = {field.name: values[field.name] for field in dataclasses.fields(part) if field.name not in derived}
    return part(**named, **derived)


def _fractions(splits: str | Mapping[str, float] | None) -> dict[str, float] | None:
    if not splits:
        return None
    if isinstance(splits, Mapping):
        return checked_splits(splits.items(), shown=dict(splits))
    return parse_splits(splits)
