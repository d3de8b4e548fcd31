"""The DynamoDB session's one request path (issue 51): ``DynamoTable.call`` runs its stages in
the order docs/architecture.md states (guards, translation, the request, errors, metrics), and
no stage is installed by putting a ``call`` on the instance, where a reader of ``DynamoTable``
could not see it.

moto stands in for DynamoDB; a global table's DescribeTable answer gets AWS's replication fields
from an ``after-call`` hook (as in tests/test_global_tables.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import dynacoord
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._table import Send
from dynacoord.backends.dynamodb._verify import FirstUseCheck
from dynacoord.errors import GlobalTableError
from dynacoord.provision import create_table
from dynacoord.testing import DUMMY_CREDENTIALS
from tests.backends_fixtures import LAYOUT
from tests.dynamodb_calls import operation_names, other_client

#: an eventually consistent global table (MREC), seen from us-east-1
MREC = {
    "Replicas": [
        {"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"},
        {"RegionName": "eu-west-1", "ReplicaStatus": "ACTIVE"},
    ]
}


@pytest.fixture()
def client() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def _replicated(client: Any) -> None:
    def add(parsed: dict[str, Any], **_: Any) -> None:
        if "Table" in parsed:
            parsed["Table"].update(MREC)

    client.meta.events.register("after-call.dynamodb.DescribeTable", add)


def test_no_module_puts_a_method_on_an_instance() -> None:
    """``obj.__dict__[...] = ...`` hides a stage from whoever reads the class."""
    root = Path(dynacoord.__file__).parent
    found = [
        f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
        for path in sorted(root.rglob("*.py"))
        for text in [path.read_text(encoding="utf-8")]
        for match in re.finditer(r"__dict__\[[^\]]*\]\s*=[^=]", text)
    ]
    assert found == []


def test_the_first_use_check_gives_its_place_to_a_global_tables_gate(client: Any) -> None:
    create_table(other_client(), "gated")
    _replicated(client)
    sent = operation_names(client)
    backend = DynamoDBBackend(client, table_name="gated", verify="first-write")
    table = backend.table
    [check] = table.guards
    assert isinstance(check, FirstUseCheck)
    with pytest.raises(GlobalTableError):
        backend.locks.acquire("job", ttl=10)
    # the check passed and removed itself; the gate it found took its place
    [gate] = table.guards
    assert type(gate).__name__ == "Gate"
    assert sent == ["DescribeTable"]  # the lock's write was refused before it was sent
    with pytest.raises(GlobalTableError):
        backend.counters.increment("hits")
    backend.cache().set("plain", 1)  # last-writer-wins by nature: the gate lets it through
    assert sent.count("DescribeTable") == 1 and sent[-1] == "PutItem"
    assert "call" not in vars(table)


def test_a_checked_table_in_one_region_has_no_guard(client: Any) -> None:
    create_table(other_client(), "plain")
    backend = DynamoDBBackend(client, table_name="plain", verify="first-write")
    assert len(backend.table.guards) == 1
    backend.counters.increment("hits")
    assert backend.table.guards == ()
    # a second backend on the same client finds the table checked: no guard from the start
    assert DynamoDBBackend(client, table_name="plain").table.guards == ()


def test_guards_see_dynacoords_names_before_the_layouts_translation(client: Any) -> None:
    """Stage 1 comes before stage 2: a guard reads the request as the stores wrote it."""
    create_table(other_client(), "laid", layout=LAYOUT)
    backend = DynamoDBBackend(client, table_name="laid", layout=LAYOUT, verify=False)
    seen: list[set[str]] = []

    def guard(operation: str, kwargs: dict[str, Any], send: Send) -> dict[str, Any]:
        seen.append(set(kwargs["Key"]))
        return send(operation, kwargs)

    backend.table.guards = (guard,)
    sent = operation_names(client)
    client.meta.events.register(
        "before-parameter-build.dynamodb.UpdateItem",
        lambda params, **_: seen.append(set(params["Key"])),
    )
    backend.counters.increment("hits")
    assert sent == ["UpdateItem"]
    assert seen == [{"pk", "sk"}, {"PK", "SK"}]  # the guard's, then the request's
