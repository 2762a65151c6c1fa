"""Typed, validated settings that the job passes down to its pure functions and DoFns."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from beam_jobs.errors import BadInputError, UsageError
from beam_jobs.imaging.annotate import ANNOTATION_FRAMES
from beam_jobs.imaging.example import ENCODINGS, FORMAT_NAMES
from beam_jobs.imaging.geometry import KEEP
from beam_jobs.imaging.isolation import ISOLATION_POLICIES
from beam_jobs.imaging.preprocess import RESIZE_MODES
from beam_jobs.imaging.resample import ARRAY_METHODS, DEFAULT_RESAMPLE, RESAMPLE_METHODS
from beam_jobs.listing.names import clean_split_name
from beam_jobs.typed_fields import check_field_types

__all__ = ["GREY_DECODES", "ImageConfig", "checked_splits", "parse_image_size", "parse_splits"]

# Where a grey image's pixels come from on the array path (ImageConfig.grey_decode).
GREY_DECODES = ("luma", "pillow")


@dataclass(frozen=True)
class ImageConfig:
    """How each image is checked, preprocessed and encoded.

    Attributes:
      width, height: output size in pixels.
      channels: 3 (RGB) or 1 (grayscale).
      resize_mode: "crop" (shorter side, then centre crop), "pad", "stretch", or "keep" (each
        image at its own size: width and height are then not used).
      max_side: with "keep", images whose longer side is larger are shrunk to it (aspect ratio
        kept); None keeps every size.
      resample: how pixels are resampled to the output size: "dct_sinc", "dct_bicubic",
        "dct_linear", "antialias", "area", "bilinear", "bicubic" or "lanczos" (resample.py); None (the default):
        the method of the dataset a run continues (--resume, --append), else DEFAULT_RESAMPLE.
      encoding: "jpeg", "png" or "raw" (uint8 pixels).
      jpeg_quality: 1-100, used when encoding is "jpeg".
      max_pixels: images whose header claims more pixels are refused before decoding.
      max_file_bytes: larger files are refused before they are read.
      isolation: which decodes run in a child process with a timeout: "none", "risky" (all but
        JPEG and PNG, the default) or "all".
      decode_timeout_s: how long an isolated decode may take before its process is killed.
      annotation_frame: the frame boxes and masks are drawn in, for an image that EXIF turns:
        "auto" (a COCO file's width and height tell, an input list's are as stored, and an image
        whose turn keeps its size, so that neither tells, is refused), "stored" or "upright".
      grey_decode: with channels=1 and an array resampling (ARRAY_METHODS), where the grey comes
        from: "luma" (a JPEG's own luma plane, decoded on the array path with the method's DCT
        scale and exact geometry) or "pillow" (Pillow's decode and its "L" conversion, which
        datasets made before "luma" hold: --resume and --append keep it for them, byte for
        byte); None (the default): "pillow" for such a dataset a run continues, else "luma".
    """

    width: int = 224
    height: int = 224
    channels: int = 3
    resize_mode: str = "crop"
    resample: str | None = None
    encoding: str = "jpeg"
    jpeg_quality: int = 95
    max_pixels: int = 100_000_000
    max_file_bytes: int = 64 * 1024 * 1024
    isolation: str = "risky"
    decode_timeout_s: float = 60.0
    max_side: int | None = None
    annotation_frame: str = "auto"
    grey_decode: str | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        # One form for one value (60 and 60.0): equal configs make one run fingerprint.
        object.__setattr__(self, "decode_timeout_s", float(self.decode_timeout_s))
        if not (math.isfinite(self.decode_timeout_s) and 0 < self.decode_timeout_s <= 86400):
            raise UsageError(
                f"decode_timeout_s must be > 0 and at most 86400 seconds (a day) (got {self.decode_timeout_s!r})"
            )
        if not (1 <= self.width <= 65535 and 1 <= self.height <= 65535):
            raise ValueError(f"image size must be 1..65535 pixels a side (got {self.width}x{self.height})")
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3 (got {self.channels!r})")
        if self.resize_mode not in RESIZE_MODES:
            raise ValueError(f"resize_mode must be one of {RESIZE_MODES} (got {self.resize_mode!r})")
        if self.resample is not None and self.resample not in RESAMPLE_METHODS:
            raise ValueError(f"resample must be one of {RESAMPLE_METHODS} (got {self.resample!r})")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS} (got {self.encoding!r})")
        if not 1 <= self.jpeg_quality <= 100:
            raise ValueError(f"jpeg_quality must be 1..100 (got {self.jpeg_quality!r})")
        if self.max_pixels < 1:
            raise ValueError(f"max_pixels must be positive (got {self.max_pixels!r})")
        if self.isolation not in ISOLATION_POLICIES:
            raise ValueError(f"isolation must be one of {ISOLATION_POLICIES} (got {self.isolation!r})")
        if self.decode_timeout_s <= 0:
            raise ValueError(f"decode_timeout_s must be positive (got {self.decode_timeout_s!r})")
        if self.max_side is not None and (isinstance(self.max_side, bool) or not 1 <= self.max_side <= 65535):
            raise ValueError(f"max_side must be 1..65535 pixels (got {self.max_side!r})")
        if self.max_side is not None and self.resize_mode != KEEP:
            raise ValueError(
                f"max_side applies to resize_mode keep only; resize_mode {self.resize_mode!r} makes every "
                f"image {self.width}x{self.height}"
            )
        if self.annotation_frame not in ANNOTATION_FRAMES:
            raise ValueError(f"annotation_frame must be one of {ANNOTATION_FRAMES} (got {self.annotation_frame!r})")
        if self.grey_decode not in (None, *GREY_DECODES):
            raise ValueError(f"grey_decode must be one of {GREY_DECODES} (got {self.grey_decode!r})")
        if self.max_file_bytes < 1:
            raise ValueError(f"max_file_mb must be positive (got {self.max_file_bytes!r} bytes)")

    @property
    def resample_method(self) -> str:
        """The method images are resampled with: the one chosen, else the default of new datasets."""
        return self.resample if self.resample is not None else DEFAULT_RESAMPLE

    @property
    def decodes_luma(self) -> bool:
        """True when grey images come from a JPEG's luma plane on the array path (grey_decode)."""
        return self.channels == 1 and self.resample_method in ARRAY_METHODS and self.grey_decode != "pillow"

    @property
    def keeps_size(self) -> bool:
        """True when each image keeps its own size (resize_mode keep): no one size for the dataset."""
        return self.resize_mode == KEEP

    @property
    def size(self) -> tuple[int, int]:
        """(width, height), the order Pillow uses."""
        return self.width, self.height

    @property
    def format_name(self) -> str:
        """The encoding as each Example's image/format feature and dataset_info.json name it ("JPEG", "PNG", "RAW")."""
        return FORMAT_NAMES[self.encoding]

    def to_json(self) -> dict:
        """The settings as dataset_info.json records them and the run fingerprint hashes them."""
        settings = asdict(self)
        settings["resample"] = self.resample_method  # what the images were made with, never "unset"
        # So that runs made before these settings existed keep their fingerprint:
        if self.max_side is None:
            del settings["max_side"]
        if self.annotation_frame == "auto":
            del settings["annotation_frame"]
        # Recorded only where it decides the pixels, and only as "luma": a dataset made before it
        # existed (Pillow's grey) keeps its fingerprint.
        del settings["grey_decode"]
        if self.decodes_luma:
            settings["grey_decode"] = "luma"
        if self.keeps_size:
            # No one size: --image_size has no effect, so it must not change the fingerprint either.
            for key in ("width", "height"):
                del settings[key]
            return settings
        # As --image_size takes it (WIDTHxHEIGHT); a [height, width] list read the other way round.
        return {**settings, "image_size": f"{self.width}x{self.height}"}


def parse_image_size(text: str) -> tuple[int, int]:
    """Parses "224" or "256x192" (WIDTHxHEIGHT) into (width, height)."""
    parts = str(text).lower().replace(" ", "").split("x")
    try:
        values = [int(part) for part in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 1:
        raise ValueError(f"--image_size must look like 224 or 256x192 (WIDTHxHEIGHT) (got {text!r})")
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])


def parse_splits(text: str) -> dict[str, float]:
    """Parses "train=0.9,validation=0.1" into {"train": 0.9, "validation": 0.1}; they must sum to 1
    (see checked_splits)."""
    pairs: list[tuple[str, object]] = []
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--splits items must look like train=0.9 (got {item!r} in {text!r})")
        pairs.append((name, value.strip()))
    return checked_splits(pairs, shown=text)


def checked_splits(pairs: Iterable[tuple[str, object]], *, shown: object) -> dict[str, float]:
    """The (split name, fraction) pairs as a dict, checked: ``shown`` is how the user gave them (the
    flag's text or convert()'s mapping), for the messages.

    Names follow the one split-name policy (names.clean_split_name: lower case; letters, digits,
    "_" and "-"), the same as split folders and an input list's split column, so ``hold-out`` is
    a split here as it is there. Every fraction must be above 0: a split that is to receive
    nothing is left out, not given 0. The fractions must sum to 1.
    """
    splits: dict[str, float] = {}
    for raw_name, value in pairs:
        try:
            name = clean_split_name(str(raw_name), where=f"--splits {shown!r}")
        except BadInputError as error:
            raise ValueError(error.detail) from None
        try:
            if isinstance(value, bool):
                raise ValueError
            fraction = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(
                f"--splits: the fraction of {name!r} must be a number such as 0.9 (got {value!r} in {shown!r})"
            ) from None
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            leave_out = "; leave a split out rather than give it 0" if fraction == 0 else ""
            raise ValueError(
                f"--splits: the fraction of {name!r} must be > 0 and <= 1 (got {value!r} in {shown!r}){leave_out}"
            )
        if name in splits:
            raise ValueError(f"--splits names {name!r} twice (in {shown!r}; split names are lower case)")
        splits[name] = fraction
    if not splits or abs(sum(splits.values()) - 1.0) > 1e-6:
        raise ValueError(f"--splits fractions must sum to 1 (got {shown!r})")
    return splits
