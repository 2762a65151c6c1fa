"""What the listing does with each kind of entry, written once for class-per-folder trees and input lists.

The policy, per entry met while listing a local tree (object stores have only the first two kinds
and empty folders, which are marker keys "name/" with nothing under them; their hidden names follow
the same rule):

================================  =============================  ==================================
entry                             in a tree                      named by an input-list row
================================  =============================  ==================================
regular file, image name          listed                         listed
regular file, other name          ignored, counted (not_image)   dead letter (bad_manifest_row)
folder                            listed recursively             dead letter (not_a_regular_file)
hidden name (``.git``,            ignored, counted (hidden);     a hidden folder in its path is
``.ipynb_checkpoints``,           a hidden folder is never       used as named; a hidden file
``.Trash-1000``, ``.DS_Store``)   entered                        has no image name
                                                                 (bad_manifest_row)
symlink to a file                 as the file it leads to; out   the same
                                  of the root only with
                                  --allow_outside_root, else a
                                  dead letter (outside_input_root)
symlink to a folder               followed, as a folder; out of  dead letter (not_a_regular_file)
                                  the root only with
                                  --allow_outside_root, else one
                                  dead letter for the folder
                                  (outside_input_root)
symlink to a folder being listed  dead letter (symlink_loop):    dead letter (symlink_loop) for
(a loop), or to itself            never followed, so never a     a link to itself
                                  hang
dangling symlink                  dead letter (dangling_symlink) dead letter (dangling_symlink)
FIFO, socket, device              ignored, counted (special):    dead letter (not_a_regular_file):
                                  reading one can block for      never opened
                                  ever
empty folder                      no class (Keras makes one),    (a folder: see above)
                                  counted (empty_folder)
================================  =============================  ==================================

``decide`` is the policy as a pure function of an entry's facts; ``local_facts`` gathers those
facts from the disk, and ``walk_local`` and ``check_listed_file`` apply it to a tree and to one
input-list row. Local trees are walked here rather than with Beam's ``FileSystems.match``, whose
local listing (like ``os.walk``) neither follows symlinked folders nor tells special files from
regular ones.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import posixpath
import re
import stat
from collections.abc import Iterator

from apache_beam.io.filesystem import FileMetadata

from beam_jobs.errors import Reason, Stage
from beam_jobs.listing.names import is_hidden_name
from beam_jobs.paths import is_http_url
from beam_jobs.records import DeadLetter

__all__ = [
    "IMAGE_EXTENSIONS",
    "Decision",
    "EntryFacts",
    "Ignored",
    "IgnoredEntry",
    "Kind",
    "check_listed_file",
    "decide",
    "ignored_note",
    "is_image_filename",
    "local_facts",
    "walk_local",
]


IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"})


def is_image_filename(path: str) -> bool:
    """True for names with an image extension, in any case ("IMG_1.JPG"); hidden files are never images.

    Only an http(s) URL has a query or fragment that is not part of its name; in a path on disk,
    gs:// or s3:// "?" and "#" are ordinary characters of a name ("dogs?/x.jpg"). Only "/"
    separates names: a backslash is an ordinary character of a name on Linux, macOS and every
    object store ("cats\\dogs.jpg" is one file).
    """
    if is_http_url(path):
        path = re.split(r"[?#]", path, maxsplit=1)[0]
    name = posixpath.basename(path)
    if is_hidden_name(name):
        return False
    _, ext = posixpath.splitext(name)
    return ext.lower() in IMAGE_EXTENSIONS


class Kind:
    """What an entry is, once any symlink is followed."""

    FILE = "file"
    FOLDER = "folder"
    SPECIAL = "special"  # a FIFO, socket, character or block device
    MISSING = "missing"  # a symlink whose target does not exist
    LOOP = "loop"  # a symlink that leads to itself, or to a folder being listed


class Action:
    """What the listing does with an entry."""

    LIST = "list"
    DESCEND = "descend"
    IGNORE = "ignore"
    DEAD = "dead"


class Ignored:
    """Why a tree entry was ignored (the counts in the plan line)."""

    HIDDEN = "hidden"
    SPECIAL = "special"
    NOT_IMAGE = "not_image"
    # A folder with nothing in it: Keras makes a class of an empty class folder, this listing makes
    # none (it lists files), so ids can differ from Keras'; counted so that the plan line says so.
    EMPTY_FOLDER = "empty_folder"


@dataclasses.dataclass(frozen=True)
class IgnoredEntry:
    """A tree entry the listing left out on purpose; only its kind (an ``Ignored``) is kept, to be
    counted. A hidden folder is one entry, however much it holds: it is never entered."""

    kind: str


@dataclasses.dataclass(frozen=True)
class EntryFacts:
    """What the listing knows of one entry: its name, its kind (after symlinks), whether it is a
    symlink, whether it leads out of the input root, and whether its name is an image name."""

    name: str
    kind: str
    via_symlink: bool = False
    outside_root: bool = False
    image_name: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    """``action`` (list, descend, ignore or dead), and the Ignored kind or dead-letter reason."""

    action: str
    why: str = ""


def decide(facts: EntryFacts, *, allow_outside_root: bool, from_list: bool = False) -> Decision:
    """The policy of this module's docstring, for one entry of a tree (or, with ``from_list``, the
    file an input-list row names)."""
    # Hidden names first: editors' lock files (".#notes.jpg") are dangling symlinks, and never data.
    if not from_list and is_hidden_name(facts.name):
        return Decision(Action.IGNORE, Ignored.HIDDEN)
    if facts.kind == Kind.LOOP:
        return Decision(Action.DEAD, Reason.SYMLINK_LOOP)
    if facts.kind == Kind.MISSING:
        return Decision(Action.DEAD, Reason.DANGLING_SYMLINK)
    if facts.kind == Kind.SPECIAL:
        if from_list:
            return Decision(Action.DEAD, Reason.NOT_A_REGULAR_FILE)
        return Decision(Action.IGNORE, Ignored.SPECIAL)
    if facts.kind == Kind.FOLDER:
        if from_list:
            return Decision(Action.DEAD, Reason.NOT_A_REGULAR_FILE)
        if facts.outside_root and not allow_outside_root:
            return Decision(Action.DEAD, Reason.OUTSIDE_INPUT_ROOT)
        return Decision(Action.DESCEND)
    if not facts.image_name and not from_list:
        return Decision(Action.IGNORE, Ignored.NOT_IMAGE)
    # A file: one that leads out of the root is refused later, with the uri it was listed under.
    return Decision(Action.LIST)


def _is_inside(real: str, real_root: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip("/") + "/")


def local_facts(
    path: str, *, real_root: str, open_folders: frozenset = frozenset(), image_name: bool = False
) -> tuple[EntryFacts, os.stat_result | None]:
    """The facts of the local entry ``path``, and its stat (after symlinks; None if there is none).

    ``open_folders`` holds the (st_dev, st_ino) of the folders being listed above it: a symlinked
    folder among them is a loop.
    """
    name = os.path.basename(path.rstrip("/"))
    link = os.lstat(path)
    via_symlink = stat.S_ISLNK(link.st_mode)
    try:
        target = os.stat(path) if via_symlink else link
    except OSError as error:
        kind = Kind.LOOP if error.errno == errno.ELOOP else Kind.MISSING
        return EntryFacts(name, kind, via_symlink=True, image_name=image_name), None
    if stat.S_ISREG(target.st_mode):
        kind = Kind.FILE
    elif stat.S_ISDIR(target.st_mode):
        kind = Kind.LOOP if (target.st_dev, target.st_ino) in open_folders else Kind.FOLDER
    else:
        kind = Kind.SPECIAL
    outside = via_symlink and not _is_inside(os.path.realpath(path), real_root)
    return EntryFacts(name, kind, via_symlink=via_symlink, outside_root=outside, image_name=image_name), target


def _dead_letter(path: str, reason: str, facts: EntryFacts) -> DeadLetter:
    details = {
        Reason.SYMLINK_LOOP: "a symlink that leads back into a folder being listed (or to itself); not followed",
        Reason.DANGLING_SYMLINK: f"a symlink to {_link_target(path)!r}, which does not exist",
        Reason.NOT_A_REGULAR_FILE: f"a {facts.kind}, not a regular file: never opened",
        Reason.OUTSIDE_INPUT_ROOT: (
            f"a symlinked folder that leads out of the input root (to "
            f"{os.path.realpath(path)!r}); pass --allow_outside_root to list it"
        ),
    }
    return DeadLetter(path, Stage.LIST, reason, details[reason])


def _link_target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def classify_local(
    path: str,
    *,
    real_root: str,
    open_folders: frozenset,
    allow_outside_root: bool,
) -> tuple[Decision, FileMetadata | DeadLetter | IgnoredEntry | None, tuple | None]:
    """(decision, what to emit, the folder's (st_dev, st_ino) when it is to be listed) for one entry."""
    try:
        facts, target = local_facts(
            path, real_root=real_root, open_folders=open_folders, image_name=is_image_filename(path)
        )
    except OSError as error:  # gone since its folder was read, or not readable: said, not skipped
        return (
            Decision(Action.DEAD, Reason.READ_ERROR),
            DeadLetter(path, Stage.LIST, Reason.READ_ERROR, f"cannot stat: {error}"),
            None,
        )
    decision = decide(facts, allow_outside_root=allow_outside_root)
    if decision.action == Action.DEAD:
        return decision, _dead_letter(path, decision.why, facts), None
    if decision.action == Action.IGNORE:
        return decision, IgnoredEntry(decision.why), None
    assert target is not None  # An entry with nothing to stat is a dead letter or ignored, above.
    if decision.action == Action.DESCEND:
        return decision, None, (target.st_dev, target.st_ino)
    return decision, FileMetadata(path, target.st_size, target.st_mtime), None


def walk_local(
    folder: str,
    *,
    real_root: str,
    open_folders: frozenset,
    allow_outside_root: bool,
) -> Iterator[FileMetadata | DeadLetter | IgnoredEntry]:
    """Every listed file (FileMetadata), refused entry (DeadLetter) and ignored entry under the
    local ``folder``, depth first in name order, following symlinked folders by the policy;
    ``open_folders`` holds the identities of ``folder`` and those above it."""
    stack = [(folder, open_folders)]
    while stack:
        current, above = stack.pop()
        try:
            names = sorted(os.listdir(current))
        except OSError as error:
            yield DeadLetter(current, Stage.LIST, Reason.READ_ERROR, f"cannot list the folder: {error}")
            continue
        if not names:
            yield IgnoredEntry(Ignored.EMPTY_FOLDER)
        below = []
        for name in names:
            path = os.path.join(current, name)
            decision, emitted, identity = classify_local(
                path, real_root=real_root, open_folders=above, allow_outside_root=allow_outside_root
            )
            if identity is not None:
                below.append((path, above | {identity}))
            elif emitted is not None:  # Always, when there is no folder to descend into.
                yield emitted
        stack.extend(reversed(below))


def check_listed_file(path: str) -> DeadLetter | None:
    """The dead letter for an input-list row naming a local entry that is no regular file (a folder,
    a FIFO, a dangling or looping symlink), or None. Opening a FIFO blocks until a writer comes, so
    this is decided from the entry's stat before anything opens it. A path that does not exist is
    left to the read, whose dead letter says so."""
    try:
        facts, _ = local_facts(path, real_root="/")
    except FileNotFoundError:
        return None
    except OSError as error:
        return DeadLetter(path, Stage.LIST, Reason.READ_ERROR, f"cannot stat: {error}")
    decision = decide(facts, allow_outside_root=True, from_list=True)
    if decision.action != Action.DEAD:
        return None
    return _dead_letter(path, decision.why, facts)


_NOTE_ORDER = (Ignored.HIDDEN, Ignored.SPECIAL, Ignored.NOT_IMAGE, Ignored.EMPTY_FOLDER)
_NOTE_WORDS = {
    Ignored.HIDDEN: "hidden",
    Ignored.SPECIAL: "special",
    Ignored.NOT_IMAGE: "non-image",
    Ignored.EMPTY_FOLDER: "empty folder",
}


def _counted(count: int, kind: str) -> str:
    words = _NOTE_WORDS[kind]
    # Adjectives ("3 hidden") stay as they are; a noun takes its plural ("2 empty folders").
    return f"{count} {words}{'s' if kind == Ignored.EMPTY_FOLDER and count != 1 else ''}"


def ignored_note(counts: dict[str, int]) -> str:
    """The plan line's tail for the entries a tree listing ignored: "; ignored: 3 hidden, 1 special,
    2 non-image, 1 empty folder" (hidden files and folders, FIFOs/sockets/devices, names without an
    image extension, folders with nothing in them), or "" when none was."""
    parts = [_counted(counts[kind], kind) for kind in _NOTE_ORDER if counts.get(kind)]
    return f"; ignored: {', '.join(parts)}" if parts else ""
