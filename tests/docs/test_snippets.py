"""Every code block of the README and the docs site runs, as printed, in a fresh folder.

Each page runs in its own folder that looks like a fresh clone (the repository's files, linked),
with this environment's ``python`` and console scripts first on PATH, so a block that types
``launch/run_local.sh`` or ``images-to-tfrecords`` runs what a reader's would.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tests.docs.snippets import Snippet, doc_pages, snippets

REPO = pathlib.Path(__file__).resolve().parents[2]
PAGES = doc_pages(REPO)
# What a clone has, and a reader's environment does not carry over: the venv, git's data, outputs.
_NOT_LINKED = {".venv", ".git", "sample_data", "site", "build", ".pytest_cache"}
# The blocks that may say "not run", each for a reason a test machine cannot meet.
MAX_NOT_RUN = 12


def _page_id(path: pathlib.Path) -> str:
    return str(path.relative_to(REPO))


def _all_snippets() -> list[Snippet]:
    return [s for page in PAGES for s in snippets(page.read_text(encoding="utf-8"), page=_page_id(page))]


def clone_view(folder: pathlib.Path) -> pathlib.Path:
    """A folder holding the repository's top-level entries as links: a clone without its outputs."""
    folder.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        if entry.name not in _NOT_LINKED and not entry.name.endswith(".egg-info"):
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_code_block_of_the_page_runs(page, tmp_path):
    if not any(s.runs for s in snippets(page.read_text(encoding="utf-8"), page=_page_id(page))):
        return  # A page of prose and formats only: nothing to run (the next tests still read it).
    work = clone_view(tmp_path / "clone")
    bin_dir = os.path.dirname(sys.executable)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "VENV": sys.prefix,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("PYTHONPATH", None)  # The clone's own folder is the only source, as for a reader.
    done = subprocess.run(
        [sys.executable, "-m", "tests.docs.run_page", str(page)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, f"{_page_id(page)}:\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"


def test_blocks_not_run_are_few_and_say_why():
    not_run = [s for s in _all_snippets() if s.not_run is not None]
    assert all(s.not_run.strip() for s in not_run), [s.where for s in not_run if not s.not_run.strip()]
    assert len(not_run) <= MAX_NOT_RUN, "\n".join(f"{s.where}: {s.not_run}" for s in not_run)


def test_code_blocks_say_their_language():
    """A bare fence would be neither run nor highlighted: each block names bash, python or text."""
    bare = [s.where for s in _all_snippets() if not s.language]
    assert not bare, bare


def test_readme_is_short():
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


@pytest.mark.parametrize(
    "phrase",
    [
        "the article",
        "the issue",
        "these machines",
        "this machine",
        "this session",
        "trial",
        "as before",
        "earlier release",
        "no longer",
    ],
)
def test_docs_assume_no_history(phrase):
    """A reader has not followed the project's making: no sentence may lean on it."""
    hits = [
        f"{_page_id(page)}:{number}"
        for page in PAGES
        for number, line in enumerate(page.read_text(encoding="utf-8").lower().splitlines(), start=1)
        if phrase in line
    ]
    assert not hits, hits


def test_snippet_reader_finds_blocks_and_marks():
    text = (
        "a\n<!-- not run: needs a cloud account -->\n```bash\ngcloud x\n```\n\n```python\nprint(1)\n```\n"
        "```text\nout\n```\n  ```bash\n  echo indented\n  ```\n```\nbare\n```\n"
    )
    found = snippets(text, page="p.md")
    assert [(s.language, s.runs, s.line) for s in found] == [
        ("bash", False, 3),
        ("python", True, 7),
        ("text", False, 10),
        ("bash", True, 13),
        ("", False, 16),
    ]
    assert found[0].not_run == "needs a cloud account" and found[3].code == "echo indented\n"


def test_docs_site_builds_strictly(tmp_path):
    """MkDocs with --strict: a broken link or a page missing from the navigation fails."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
