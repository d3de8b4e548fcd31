"""The global options (``--table``, ``--namespace``, ``--endpoint-url``, ``--region``,
``--table-layout``, ``--json``, ``-q``) are accepted before the command and after it, like the
AWS CLI's; given after, they win."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord.cli import build_parser
from tests.cli_helpers import SHOP_LAYOUT, cli_tables, run_cli  # noqa: F401

GLOBALS = ["--table", "--namespace", "--endpoint-url", "--region", "--table-layout", "--json"]


def test_options_after_the_command(capsys: pytest.CaptureFixture[str], cli_tables: Any) -> None:
    code, _, err = run_cli(
        capsys,
        "cache",
        "set",
        "k1",
        "v",
        "--table",
        "shop",
        "--table-layout",
        SHOP_LAYOUT,
        "--namespace",
        "web",
        "--region",
        "us-east-1",
    )
    assert code == 0, err
    # the glob is the glob, --table is the table
    code, out, err = run_cli(
        capsys, "cache", "keys", "--table", "shop", "--table-layout", SHOP_LAYOUT, "--namespace",
        "web", "--region", "us-east-1", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == ["k1"]


def test_table_layout_before_the_command(capsys: pytest.CaptureFixture[str], cli_tables: Any) -> None:
    code, out, err = run_cli(
        capsys, "--table", "shop", "--table-layout", SHOP_LAYOUT, "--region", "us-east-1",
        "--namespace", "web", "--json", "cache", "keys",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out) == []


def test_after_the_command_wins() -> None:
    args = build_parser().parse_args(["--table", "a", "--region", "r1", "lock", "show", "k",
                                      "--table", "b"])  # fmt: skip
    assert (args.table, args.region) == ("b", "r1")


def _leaves(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                has_children = any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                if has_children:
                    yield from _leaves(sub)
                else:
                    yield name, sub


def test_every_command_takes_every_global_option() -> None:
    parser = build_parser()
    assert set(GLOBALS) <= set(parser._option_string_actions)
    for _name, leaf in _leaves(parser):
        missing = [o for o in GLOBALS if o not in leaf._option_string_actions]
        assert not missing, (leaf.prog, missing)
