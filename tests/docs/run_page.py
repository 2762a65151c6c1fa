"""Runs one page's code blocks in order, as a reader would type them, in the current folder.

    python -m tests.docs.run_page PAGE.md

Bash blocks run with ``bash -e -o pipefail``; Python blocks run in one interpreter, each in the
namespace the blocks before it left, as in a notebook. The first failing block ends the run
with exit 1 and names its line. Processes a block left running are ended at the end.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import traceback

import psutil

from tests.docs.snippets import snippets


def _end_children() -> None:
    children = psutil.Process().children(recursive=True)
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=10)
    for child in alive:
        child.kill()


def main(page: str) -> int:
    path = pathlib.Path(page)
    namespace: dict = {"__name__": "__main__"}
    try:
        for snippet in snippets(path.read_text(encoding="utf-8"), page=path.name):
            if not snippet.runs:
                continue
            print(f"--- {snippet.where} ({snippet.language})", flush=True)
            if snippet.language == "bash":
                done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", snippet.code], check=False)
                if done.returncode != 0:
                    print(f"FAILED: the block at {snippet.where} exited {done.returncode}:\n{snippet.code}", flush=True)
                    return 1
                continue
            try:
                exec(compile(snippet.code, snippet.where, "exec"), namespace)  # noqa: S102 - running the docs is the point
            except BaseException:  # SystemExit too: a snippet must not end the reader's interpreter
                traceback.print_exc()
                print(f"FAILED: the block at {snippet.where} raised:\n{snippet.code}", flush=True)
                return 1
            sys.stdout.flush()
        return 0
    finally:
        _end_children()
        os.sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
