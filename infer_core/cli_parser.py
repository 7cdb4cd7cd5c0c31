"""argparse's parser, whose "unrecognized arguments" error suggests the closest flag of the command used."""

from __future__ import annotations

import argparse
import difflib


class SuggestingParser(argparse.ArgumentParser):
    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = _command_parser(self, parsed)
            command.error("unrecognized arguments: " + " ".join(_with_suggestion(command, extra) for extra in extras))
        return parsed


def _command_parser(parser: argparse.ArgumentParser, parsed: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's own parser: ``infer bench serve``'s for ``infer bench serve --x``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
            if chosen is not None:
                return _command_parser(chosen, parsed)
    return parser


def _with_suggestion(parser: argparse.ArgumentParser, extra: str) -> str:
    if not extra.startswith("--"):
        return extra
    flags = [flag for action in parser._actions for flag in action.option_strings if flag.startswith("--")]
    close = difflib.get_close_matches(extra.split("=", 1)[0], flags, n=1, cutoff=0.6)
    return f"{extra} (did you mean {close[0]}?)" if close else extra
