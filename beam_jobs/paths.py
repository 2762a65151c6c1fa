"""Path policy: which uris a job may open, and how uris are shown without their secrets."""

from __future__ import annotations

import functools
import os
import posixpath
import re

from beam_jobs.errors import BadInputError, Reason, Stage

__all__ = ["is_http_url", "redact", "resolve_inside_root"]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# An http(s) URL's query string or fragment (signed-URL signatures, tokens). Only http(s) has
# them: in a gs://, s3:// or local path "?" and "#" are ordinary characters of an object's name.
_URL_SECRETS = re.compile(r"\b((?i:https?)://)(?:[^/\s@'\"]*@)?([^\s?#'\"]*)[?#][^\s'\"]*")
# The user:password@ part of any URL.
_URL_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@'\"]*@")


def is_http_url(path: str) -> bool:
    """True for an http:// or https:// URL, the only kind whose "?" starts a query."""
    return path[:8].lower().startswith(("http://", "https://"))


def redact(text: str) -> str:
    """Removes query strings and fragments from every http(s) URL in ``text``, and user:password@
    from every URL.

    Dead letters and logs are shared widely; a signed URL's signature must never reach them.
    Other paths are left alone: a '?' or '#' can be part of a file or object name.
    """
    text = _URL_SECRETS.sub(lambda m: f"{m.group(1)}{m.group(2)}?<redacted>", text)
    return _URL_USERINFO.sub(r"\1<redacted>@", text)


@functools.lru_cache(maxsize=64)
def _real_path(root: str) -> str:
    # The root is the same for every input of a job; resolving it once saves a stat per component.
    return os.path.realpath(root)


def _outside(uri: str, root: str, why: str) -> BadInputError:
    return BadInputError(
        Stage.LIST,
        Reason.OUTSIDE_INPUT_ROOT,
        f"{redact(uri)!r} is outside the input root {redact(root)!r} ({why}); "
        "pass --allow_outside_root to accept such inputs",
    )


def resolve_inside_root(uri: str, root: str, *, allow_outside: bool = False) -> tuple[str, str]:
    """Resolves a manifest entry against ``root`` (a folder, local or remote).

    Returns (full uri, path relative to root). Entries that would leave the root (``..``,
    absolute paths elsewhere, another scheme or bucket, ``file://``, a local symlink pointing
    out) raise BadInputError before anything is opened, unless ``allow_outside``. A dangling local
    symlink is returned as it is, for the caller's listing policy to name. NUL bytes are always
    refused.
    """
    if "\x00" in uri:
        raise BadInputError(Stage.LIST, Reason.OUTSIDE_INPUT_ROOT, f"{uri!r} contains a NUL byte")
    root = root.rstrip("/") + "/" if root else ""
    scheme = _SCHEME.match(uri)
    root_scheme = _SCHEME.match(root)
    if scheme:
        full = uri
        if root_scheme is None or scheme.group(1).lower() != root_scheme.group(1).lower():
            if not allow_outside:
                raise _outside(uri, root, f"a {scheme.group(1)}:// uri")
            return full, full
        # Normalise without touching the scheme's double slash.
        prefix, rest = full[: scheme.end()], full[scheme.end() :]
        full = prefix + posixpath.normpath(rest)
    elif uri.startswith("/"):
        full = posixpath.normpath(uri)
    else:
        if root_scheme:
            prefix, rest = root[: root_scheme.end()], root[root_scheme.end() :]
            full = prefix + posixpath.normpath(rest + uri)
        else:
            full = posixpath.normpath(posixpath.join(root or ".", uri))
    if not root or not full.startswith(root):
        if not allow_outside:
            raise _outside(uri, root, "it resolves to " + repr(redact(full)))
        return full, full
    relative = full[len(root) :]
    if root_scheme is None and not allow_outside:
        if os.path.islink(full) and not os.path.exists(full):
            # A dangling link leads nowhere, so nothing outside can be read through it, and
            # "outside the root" would send the user to a flag that cannot help: the listing's
            # policy dead-letters it as dangling_symlink (listing_policy.check_listed_file).
            return full, relative
        real_root = _real_path(root)
        real = os.path.realpath(full)
        if not (real == real_root or real.startswith(real_root.rstrip("/") + "/")):
            raise _outside(uri, root, "a symlink that leads out of it")
    return full, relative
