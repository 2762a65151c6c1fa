"""The code blocks of the README and the guides, as the snippet tests run them.

A fenced block whose language is ``bash``, ``sh`` or ``python`` is code, and runs; any other
language (``text``, ``console``, ``json``) is shown output or a format, and does not. A block
that cannot run on a test machine (one that installs into the environment under test, or needs
a cloud account) is preceded by ``<!-- not run: why -->``, which MkDocs does not render, and the
tests list every such block with its reason.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import textwrap

RUN_LANGUAGES = {"bash": "bash", "sh": "bash", "python": "python"}
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\n`]*)$")
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<why>.*?)\s*-->")


@dataclasses.dataclass(frozen=True)
class Snippet:
    page: str
    line: int  # 1-based line of the opening fence
    language: str  # "bash" or "python", or the block's own language when it is not code
    code: str
    not_run: str | None  # the reason given, when the block is marked not to run

    @property
    def runs(self) -> bool:
        return self.language in ("bash", "python") and self.not_run is None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def snippets(text: str, *, page: str) -> list[Snippet]:
    """Every fenced block of a Markdown page, in order (a pure function of its text)."""
    lines = text.splitlines()
    found: list[Snippet] = []
    number = 0
    while number < len(lines):
        opening = _FENCE.match(lines[number])
        if not opening:
            number += 1
            continue
        # A bare fence has the language "": neither run nor highlighted (a test refuses it).
        info = opening["info"].strip().split()[0].strip("{}.").lower() if opening["info"].strip() else ""
        end = _closing(lines, number, opening["fence"])
        body = textwrap.dedent("\n".join(lines[number + 1 : end]))
        before = "\n".join(lines[max(0, number - 2) : number])
        marked = _NOT_RUN.search(before)
        found.append(
            Snippet(
                page=page,
                line=number + 1,
                language=RUN_LANGUAGES.get(info, info),
                code=body + "\n",
                not_run=marked["why"] if marked else None,
            )
        )
        number = end + 1
    return found


def _closing(lines: list[str], start: int, fence: str) -> int:
    for number in range(start + 1, len(lines)):
        stripped = lines[number].strip()
        if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
            return number
    raise ValueError(f"line {start + 1}: a code fence that is never closed")


def doc_pages(repo: pathlib.Path) -> list[pathlib.Path]:
    """The README and every page of the docs site."""
    return [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
