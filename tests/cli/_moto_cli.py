"""The ``dynacoord`` CLI against moto's table, in a fresh namespace a Python backend shares
(the admission and leadership views: tests/cli/test_semaphore.py, test_ratelimit.py,
test_leader.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dynacoord import Clock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.cli import main
from dynacoord.testing import DUMMY_CREDENTIALS, unique_name

Run = Callable[..., tuple[int, str, str]]


def moto_cli(
    moto_table: tuple[Any, str], capsys: pytest.CaptureFixture[str]
) -> tuple[Callable[..., DynamoDBBackend], Run]:
    """(backend(clock=None), run(*argv, json_output=True) -> (exit code, stdout, stderr))."""
    client, table = moto_table
    namespace = unique_name("cli")

    def backend(clock: Clock | None = None) -> DynamoDBBackend:
        return DynamoDBBackend(client, table_name=table, namespace=namespace, clock=clock)

    def run(*argv: str, json_output: bool = True) -> tuple[int, str, str]:
        capsys.readouterr()
        options = ["--table", table, "--namespace", namespace, "--quiet"]
        options += ["--region", DUMMY_CREDENTIALS["region_name"]]
        if json_output:
            options.append("--json")
        code = main([*options, *argv])
        out, err = capsys.readouterr()
        return code, out, err

    return backend, run
