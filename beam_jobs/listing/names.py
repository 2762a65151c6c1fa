"""One policy for the names a dataset is built from: labels, split names, and which entries are hidden.

Folder names (a class-per-folder tree) and the fields of an input list (CSV/JSONL) go through the
same functions, so a label that reads the same is the same class whichever source named it:
``café`` typed on macOS (NFD) and on Linux (NFC), ``cat`` and ``cat `` are one label. What cannot
be a label (a blank name, control characters such as a newline or a tab, which would break every
table and file that prints it) raises ``BadInputError`` with reason ``bad_label``, which becomes a
dead letter naming the file.
"""

from __future__ import annotations

import math
import re
import unicodedata

from beam_jobs.errors import BadInputError, Reason, Stage

__all__ = ["clean_group", "clean_label", "clean_split_name", "is_hidden_name", "is_valid_split_name"]

# A split names shard files: letters, digits, "_" and "-", never "/", "." or spaces.
_SPLIT_NAME = re.compile(r"[^\W][\w-]*")
# Unicode categories that are never part of a printable label: controls (Cc: tab, newline, DEL,
# C1 controls), and the line and paragraph separators (Zl, Zp), which end a line like "\n" does.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Zl", "Zp"})


def is_hidden_name(name: str) -> bool:
    """Whether a file or folder name is hidden, and so never data: ``.DS_Store``, ``.git``,
    ``.ipynb_checkpoints``, ``.Trash-1000``, ``.thumbnails``. The same rule for files and folders,
    at every depth."""
    return name.startswith(".")


def clean_label(raw: str, *, where: str) -> str:
    """The label ``raw`` names: NFC-normalised and stripped of surrounding whitespace.

    ``where`` names the input in the error (a file, or ``list.csv:12``). Raises BadInputError
    (``bad_label``) for a label that is blank once stripped or holds control characters.
    """
    label = unicodedata.normalize("NFC", str(raw)).strip()
    if not label:
        raise BadInputError(Stage.LIST, Reason.BAD_LABEL, f"{where}: the label {raw!r} is blank")
    bad = sorted({c for c in label if unicodedata.category(c) in _FORBIDDEN_CATEGORIES})
    if bad:
        shown = ", ".join(f"U+{ord(c):04X}" for c in bad)
        raise BadInputError(
            Stage.LIST, Reason.BAD_LABEL, f"{where}: the label {label!r} contains control characters ({shown})"
        )
    return label


def is_valid_split_name(name: str) -> bool:
    """Whether ``name`` can name a split, and so the start of its shard files' names."""
    return bool(_SPLIT_NAME.fullmatch(name))


def clean_split_name(raw: str, *, where: str) -> str:
    """The split ``raw`` names, in lower case: ``Validation/`` and ``validation/`` are one split.

    Split names become the start of shard file names, and on a case-insensitive filesystem
    (macOS, Windows, some FUSE mounts of buckets) ``Validation-00000-of-00001.tfrecord`` and
    ``validation-00000-of-00001.tfrecord`` are one file; so splits are compared and written in
    lower case. Raises BadInputError (``bad_label``) for a name that cannot name files.
    """
    split = unicodedata.normalize("NFC", str(raw)).strip().lower()
    if not is_valid_split_name(split):
        raise BadInputError(
            Stage.LIST,
            Reason.BAD_LABEL,
            f"{where}: the split {raw!r} cannot name shard files (letters, digits, '_' and '-' only)",
        )
    return split


def clean_group(raw: object) -> str | None:
    """The user group ``raw`` names (a ``group`` column's value, a --group_pattern capture), or None.

    Groups are only compared for equality, so every spelling of one value must be one group:
    text NFC-normalised and stripped, as labels are (``café`` in NFC and NFD, ``p7`` and `` p7``);
    a JSON number by its value (7, 7.0 and "7" are one patient: a pandas export writes integer ids
    as floats). Blank is no group, and so are the spellings of a missing value that exports write
    (a float NaN or infinity; the text nan, NA, N/A, None, null in any case, as pandas'
    ``astype(str)`` and R's ``write.csv`` write them; <NA> and NaT, pandas' nullable and time
    columns'; #N/A, a spreadsheet's): taken as text, every row without a group would be one large
    group.
    """
    if raw is None or (isinstance(raw, float) and not math.isfinite(raw)):
        return None
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)
    text = unicodedata.normalize("NFC", str(raw)).strip()
    return None if not text or text.lower() in _MISSING_VALUES else text


_MISSING_VALUES = frozenset({"nan", "na", "n/a", "none", "null", "<na>", "nat", "#n/a"})
