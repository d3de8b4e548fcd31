"""docs/cli.md against the CLI itself: every command the parser has is documented with every
option it takes, and every command and option the page shows exists; the exit codes the page
states are the ones the module states. (Its table of messages and exit codes is run row by row
in tests/cli/test_messages_and_exit_codes.py.)"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import dynacoord.cli
from dynacoord.cli import _GLOBAL_OPTIONS, build_parser

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
GLOBAL_FLAGS = {flag for flags, _ in _GLOBAL_OPTIONS for flag in flags} | {"-h", "--help"}
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                children = [a for a in sub._actions if isinstance(a, argparse._SubParsersAction)]
                if children:
                    yield from _leaves(sub, (*path, name))
                else:
                    yield " ".join((*path, name)), sub


LEAVES = dict(_leaves(build_parser()))


def _own_options(leaf: argparse.ArgumentParser) -> set[str]:
    return {
        flag
        for flag in leaf._option_string_actions
        if flag.startswith("--") and flag not in GLOBAL_FLAGS
    }


def _documented() -> dict[str, set[str]]:
    """command path -> the options the page shows with it (in a table's command cell, the
    group table's cells, a synopsis, a code line)."""
    text = CLI_DOC.read_text(encoding="utf-8")
    spans: list[str] = []
    for line in text.splitlines():
        row = line.strip().strip("|")
        is_row = line.startswith("|")
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)] if is_row else []
        if len(cells) >= 2 and re.fullmatch(r"`\w[\w-]*` \(.*\)", cells[0]):
            group = cells[0].split("`")[1]  # the "Other commands" table: group, its commands
            commands = cells[1].replace("\\|", "|")
            spans += [f"{group} {s}" for s in re.findall(r"`([^`]+)`", commands)]
            continue
        spans += re.findall(r"`([^`]+)`", line.replace("\\|", "|"))
    # synopses and command lines in code blocks (continuation lines joined)
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
        spans += block.replace("\\\n", " ").replace("\n    ", " ").splitlines()
    found: dict[str, set[str]] = {}
    for span in spans:
        words = span.split()
        if words and words[0] == "dynacoord":
            words = words[1:]
        while words and words[0] in GLOBAL_FLAGS:  # dynacoord --json outbox ... / --table X
            words = words[2:] if words[0] not in ("--json", "-q", "--quiet") else words[1:]
        for size in (2, 1):
            path = " ".join(words[:size])
            if path in LEAVES:
                rest = " ".join(words[size:])
                found.setdefault(path, set()).update(OPTION.findall(rest))
                break
    return found


def test_every_command_is_documented_with_every_option() -> None:
    documented = _documented()
    missing_commands = sorted(set(LEAVES) - set(documented))
    assert not missing_commands, f"commands cli.md does not show: {missing_commands}"
    missing = {
        path: sorted(_own_options(leaf) - documented[path])
        for path, leaf in LEAVES.items()
        if _own_options(leaf) - documented[path]
    }
    assert not missing, f"options cli.md does not show with their command: {missing}"


def test_every_documented_option_exists() -> None:
    unknown = {
        path: sorted(options - set(LEAVES[path]._option_string_actions) - GLOBAL_FLAGS)
        for path, options in _documented().items()
        if options - set(LEAVES[path]._option_string_actions) - GLOBAL_FLAGS
    }
    assert not unknown, f"options cli.md shows that the command does not take: {unknown}"


def test_the_global_options_are_the_documented_ones() -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    table = text.split("| global option | meaning |", 1)[1].split("\n\n", 1)[0]
    rows = set(re.findall(r"^\| `(--[a-z-]+)`", table, flags=re.MULTILINE))
    expected = {flags[-1] for flags, _ in _GLOBAL_OPTIONS} | {"--version"}
    expected = {f for f in expected if f.startswith("--")}
    assert rows | {"--quiet"} >= expected - {"--quiet"} and rows - {"--quiet"} <= expected


def test_the_exit_codes_are_the_modules() -> None:
    text = CLI_DOC.read_text(encoding="utf-8")
    doc = dynacoord.cli.__doc__ or ""
    for code, meaning in (("0", "success"), ("1", "failure"), ("2", "usage error"),
                          ("130", "interrupted")):  # fmt: skip
        assert f"`{code}` {meaning}" in text, code
        assert f"{code} {meaning}" in doc, code
