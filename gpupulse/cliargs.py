"""The argument parser every program uses: a bad flag is one short error, with the flag meant if one is
close, a pointer to --help, and the usage of the command that was typed (not of the program).

argparse prints a command's whole usage before each error; with the exporter's 70 flags that is 70
lines before the one that matters. Here the error is:

    gpupulse-exporter: error: unrecognized arguments: --sampling.intervall (did you mean --sampling.interval?)
    See 'gpupulse-exporter --help'.

and an unknown flag after a sub-command (`gpupulse-remediation serve --dryrun`) is that sub-command's
error, where argparse would let the top-level parser report it with the top-level usage.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

USAGE_ERROR = 2  # what argparse exits with, and what our docs promise for a bad argument
_UNRECOGNIZED = "unrecognized arguments: "


class Parser(argparse.ArgumentParser):
    """ArgumentParser with short errors; sub-commands made with add_subparsers are Parsers too."""

    def error(self, message: str) -> NoReturn:
        if message.startswith(_UNRECOGNIZED):
            message += self._did_you_mean(message[len(_UNRECOGNIZED) :].split())
        sys.stderr.write(f"{self.prog}: error: {message}\nSee '{self.prog} --help'.\n")
        sys.exit(USAGE_ERROR)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, extras = super().parse_known_args(args, namespace)
        if extras and self._is_subcommand:
            # a sub-command owns every argument after its name: what it does not know is its error
            self.error(_UNRECOGNIZED + " ".join(extras))
        return ns, extras

    _is_subcommand = False

    def add_subparsers(self, **kwargs: Any) -> Any:
        kwargs.setdefault("parser_class", _SubParser)
        return super().add_subparsers(**kwargs)

    def _did_you_mean(self, given: Sequence[str]) -> str:
        known = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        flags = [w.split("=", 1)[0] for w in given if w.startswith("--")]
        guesses = [(f, difflib.get_close_matches(f, known, n=1, cutoff=0.75)) for f in flags]
        meant = [(f, close[0]) for f, close in guesses if close]
        if len(flags) == 1 and meant:
            return f" (did you mean {meant[0][1]}?)"
        return f" ({'; '.join(f'{f}: did you mean {m}?' for f, m in meant)})" if meant else ""


class _SubParser(Parser):
    _is_subcommand = True
