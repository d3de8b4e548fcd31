"""What a process learns about a table through a client is kept once per (client, table): every
backend and store on them shares it (dynacoord/_table_state.py), and ``forget()`` starts over for
the backends made after it (a backend decides at construction whether its table needs a check)."""

from __future__ import annotations

from typing import Any

from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._table import DynamoTable
from dynacoord.testing import unique_name


def _count_describes(client: Any) -> list[str]:
    described: list[str] = []
    client.meta.events.register(
        "before-call.dynamodb.DescribeTable", lambda **_: described.append("DescribeTable")
    )
    return described


def _backend(client: Any, table: str) -> DynamoDBBackend:
    return DynamoDBBackend(client, table_name=table, namespace=unique_name("st"))


def test_backends_on_one_client_and_table_check_it_once(moto_table: Any) -> None:
    client, table = moto_table
    described = _count_describes(client)
    DynamoTable(client, table).state.forget()  # as a fresh process finds it
    first = _backend(client, table)
    first.counters.increment("k")
    assert described == ["DescribeTable"]
    second = _backend(client, table)  # a backend per request, say
    assert second.table.state is first.table.state
    second.counters.increment("k")
    second.outbox.publish([])
    assert described == ["DescribeTable"]  # what the first learnt, the second did not ask


def test_forget_makes_the_next_backend_ask_again(moto_table: Any) -> None:
    client, table = moto_table
    described = _count_describes(client)
    backend = _backend(client, table)
    backend.counters.increment("k")
    assert described == []  # made by dynacoord.provision: known to be right
    backend.table.state.forget()
    _backend(client, table).counters.increment("k")
    assert described == ["DescribeTable"]


def test_each_table_and_each_client_has_its_own_state(moto_table: Any) -> None:
    import boto3

    client, table = moto_table
    other_client = boto3.client(
        "dynamodb", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )
    state = DynamoTable(client, table).state
    assert DynamoTable(client, table).state is state
    assert DynamoTable(client, "another-table").state is not state
    assert DynamoTable(other_client, table).state is not state
