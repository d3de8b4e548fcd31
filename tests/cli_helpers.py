"""The command-line tests' shared setup: the CLI run in-process, and moto with the tables the
commands are tried on.

Test modules import the fixtures they use by name (with ``# noqa: F401``): pytest finds
fixtures only in a test module or a conftest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord.cli import main
from dynacoord.testing import DUMMY_CREDENTIALS

#: The variables the CLI reads its global options from: a developer's shell may set them, and a
#: test must see only the options it passes.
CLI_VARIABLES = (
    "DYNACOORD_TABLE",
    "DYNACOORD_NAMESPACE",
    "DYNACOORD_ENDPOINT_URL",
    "DYNACOORD_TABLE_LAYOUT",
)

#: The layout of the table ``shop`` (an application's own key names).
SHOP_LAYOUT = (
    '{"pk": "PK", "sk": "SK", "index": "GSI1", "index_pk": "GSI1PK", "index_sk": "GSI1SK"}'
)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``dynacoord *argv`` in this process: its exit code, stdout and stderr."""
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@contextlib.contextmanager
def _moto_for_the_cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    import boto3
    from moto import mock_aws

    for name in CLI_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with mock_aws():
        yield {
            service: boto3.client(service, **DUMMY_CREDENTIALS)
            for service in ("cloudformation", "dynamodb", "s3")
        }


@pytest.fixture()
def cli_aws(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """moto with none of :data:`CLI_VARIABLES` set: a client of each service the CLI calls
    (``cloudformation``, ``dynamodb``, ``s3``), by service name."""
    with _moto_for_the_cli(monkeypatch) as clients:
        yield clients


@pytest.fixture()
def cli_tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """moto as :func:`cli_aws` has it, with three tables: ``dynacoord`` (the bundled shape),
    ``shop`` (a dynacoord table in :data:`SHOP_LAYOUT`, unusable without ``--table-layout``) and
    ``nosk`` (keyed on ``pk`` only, not a dynacoord table). Yields the DynamoDB client."""
    from dynacoord import TableLayout
    from dynacoord.provision import create_table

    with _moto_for_the_cli(monkeypatch) as clients:
        client = clients["dynamodb"]
        create_table(client, "dynacoord")
        create_table(client, "shop", layout=TableLayout.from_json(SHOP_LAYOUT))
        client.create_table(
            TableName="nosk",
            AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        yield client
