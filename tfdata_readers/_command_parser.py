"""The reader commands' argument parser: one-line errors that name a misspelt flag first."""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

__all__ = ["CommandParser"]

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


class CommandParser(argparse.ArgumentParser):
    """Refuses abbreviations (a prefix such as --num would silently mean --num_examples), answers a
    misspelt flag with the one it resembles, as the conversion job does, and names that flag
    before anything else: argparse checks the required arguments first, so a typo in a required
    flag's name was answered with "the following arguments are required", which hides it."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(allow_abbrev=False, **kwargs)  # type: ignore[arg-type]

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: None = None
    ) -> argparse.Namespace:
        """argparse's parse, after refusing the first flag that no argument has."""
        tokens = list(sys.argv[1:] if args is None else args)
        known = {option for action in self._actions for option in action.option_strings}
        for token in tokens:
            if token == "--":
                break
            if token.startswith("-") and token != "-" and not _NEGATIVE_NUMBER.match(token):
                if token.split("=", 1)[0] not in known:
                    self.error(f"unrecognized arguments: {token}")
        return super().parse_args(tokens, namespace)

    def error(self, message: str) -> NoReturn:
        """One line, as every other error of these commands (and of the job): no usage block."""
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            name = message[len(prefix) :].split()[0].split("=", 1)[0]
            known = [option for action in self._actions for option in action.option_strings]
            guess = [option for option in known if name.startswith("--") and option.startswith(name)]
            if len(guess) != 1:  # Compared without the dashes, which every flag shares.
                bare = {option.lstrip("-"): option for option in known}
                close = difflib.get_close_matches(name.lstrip("-").replace("-", "_"), list(bare), n=1, cutoff=0.6)
                guess = [bare[c] for c in close]
            hint = f"did you mean {guess[0]}?" if name.startswith("-") and guess else f"see {self.prog} --help"
            message = f"unrecognized argument {name}; {hint}"
        self.exit(2, f"{self.prog}: error: {message}\n")
