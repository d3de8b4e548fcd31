"""The DynamoDB backend's first-use table check: no wrongly shaped table receives a write from
any primitive, no idempotent function runs against one, and a right table costs no request
before the first read.

Every wrong shape here takes some of dynacoord's writes without complaint from DynamoDB itself
(a ``pk``-only table takes a PutItem carrying ``sk``; a table without ``gsi1``, or with an index
keyed on other attributes, takes every write), which is why the check runs before the first
write. Run on DynamoDB Local (the truth) and on moto.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._verify import wait_for_ttl_checks
from dynacoord.errors import ConfigurationError
from dynacoord.outbox import Event
from dynacoord.provision import create_table, table_definition
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, unique_name
from tests.dynamodb_calls import operation_names, other_client

_S = "S"


def _index(name: str, hash_key: str, range_key: str) -> dict[str, Any]:
    return {
        "IndexName": name,
        "KeySchema": [
            {"AttributeName": hash_key, "KeyType": "HASH"},
            {"AttributeName": range_key, "KeyType": "RANGE"},
        ],
        "Projection": {"ProjectionType": "ALL"},
    }


#: shape -> (key schema [(name, type, role)], extra attribute types, indexes): each is a table
#: dynacoord's items do not fit, yet DynamoDB itself takes some of its writes
SHAPES: dict[str, tuple[list[tuple[str, str, str]], dict[str, str], list[dict[str, Any]]]] = {
    "pk only": (
        [("pk", _S, "HASH")],
        {"gsi1pk": _S, "gsi1sk": _S},
        [_index("gsi1", "gsi1pk", "gsi1sk")],
    ),
    "no gsi1": ([("pk", _S, "HASH"), ("sk", _S, "RANGE")], {}, []),
    "gsi1 on other keys": (
        [("pk", _S, "HASH"), ("sk", _S, "RANGE")],
        {"gpk": _S, "gsk": _S},
        [_index("gsi1", "gpk", "gsk")],
    ),
    "another index name": (
        [("pk", _S, "HASH"), ("sk", _S, "RANGE")],
        {"gsi1pk": _S, "gsi1sk": _S},
        [_index("byStatus", "gsi1pk", "gsi1sk")],
    ),
    "sk a number": (
        [("pk", _S, "HASH"), ("sk", "N", "RANGE")],
        {"gsi1pk": _S, "gsi1sk": _S},
        [_index("gsi1", "gsi1pk", "gsi1sk")],
    ),
    "gsi1sk a number": (
        [("pk", _S, "HASH"), ("sk", _S, "RANGE")],
        {"gsi1pk": _S, "gsi1sk": "N"},
        [_index("gsi1", "gsi1pk", "gsi1sk")],
    ),
    "keys swapped": (
        [("sk", _S, "HASH"), ("pk", _S, "RANGE")],
        {"gsi1pk": _S, "gsi1sk": _S},
        [_index("gsi1", "gsi1pk", "gsi1sk")],
    ),
}


def _make(client: Any, name: str, shape: str) -> None:
    keys, extra, indexes = SHAPES[shape]
    definitions = {n: t for n, t, _ in keys} | extra
    request: dict[str, Any] = {
        "TableName": name,
        "AttributeDefinitions": [
            {"AttributeName": n, "AttributeType": t} for n, t in definitions.items()
        ],
        "KeySchema": [{"AttributeName": n, "KeyType": k} for n, _, k in keys],
        "BillingMode": "PAY_PER_REQUEST",
    }
    if indexes:
        request["GlobalSecondaryIndexes"] = indexes
    client.create_table(**request)


def _boom() -> None:
    raise RuntimeError("the protected call failed")


def _breaker_failure(backend: DynamoDBBackend) -> None:
    with pytest.raises(RuntimeError):
        backend.breaker("svc", failure_threshold=1).call(_boom)


def _transaction_publish(backend: DynamoDBBackend) -> None:
    with backend.transaction() as tx:
        tx.publish(Event("order.created", {"id": 1}))


#: each primitive's first write (with the reads some of them make before it)
FIRST_WRITES: dict[str, Callable[[DynamoDBBackend], object]] = {
    "cache.set": lambda b: b.cache().set("k", {"v": 1}),
    "cache.add": lambda b: b.cache().add("k", 1),
    "runs.start": lambda b: b.runs.start("run-1", context={"a": 1}),
    "idempotency.try_claim": lambda b: b.idempotency.try_claim("order-1", lease=30),
    "locks.acquire": lambda b: b.locks.acquire("k", ttl=10),
    "outbox.publish": lambda b: b.outbox.publish(Event("order.created", {"id": 1})),
    "counters.increment": lambda b: b.counters.increment("k"),
    "counters.set_if_absent": lambda b: b.counters.set_if_absent("flag", 1),
    "checkpoints.save": lambda b: b.checkpoints.save("task", {"step": 1}),
    "breaker failure": _breaker_failure,
    "transaction publish": _transaction_publish,
}


@pytest.fixture(scope="module", params=["dynamodb-local", "moto"])
def shaped(request: pytest.FixtureRequest) -> Iterator[tuple[Any, dict[str, str]]]:
    """(client, shape -> table name): one table of each wrong shape."""
    if request.param == "moto":
        import boto3
        from moto import mock_aws

        with mock_aws():
            client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
            names = {shape: unique_name("shape") for shape in SHAPES}
            for shape, name in names.items():
                _make(client, name, shape)
            yield client, names
        return
    ddb: DynamoDBLocal = request.getfixturevalue("dynamodb_local")
    client = ddb.client()
    names = {shape: unique_name("shape") for shape in SHAPES}
    for shape, name in names.items():
        _make(client, name, shape)
    yield client, names


def _item_count(client: Any, table: str) -> int:
    return int(client.scan(TableName=table, Select="COUNT")["Count"])


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("write", list(FIRST_WRITES))
def test_no_primitive_writes_to_a_wrongly_shaped_table(
    shaped: tuple[Any, dict[str, str]], shape: str, write: str
) -> None:
    client, names = shaped
    table = names[shape]
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    with pytest.raises(ConfigurationError) as raised:
        FIRST_WRITES[write](backend)
    assert f"{table!r}" in str(raised.value)
    assert _item_count(client, table) == 0


@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_idempotent_function_runs_against_a_wrongly_shaped_table(
    shaped: tuple[Any, dict[str, str]], shape: str
) -> None:
    client, names = shaped
    table = names[shape]
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    ran: list[str] = []

    @backend.idempotent(key=lambda order: order["id"])
    def handle(order: dict[str, Any]) -> dict[str, Any]:
        ran.append(order["id"])
        return {"done": order["id"]}

    with pytest.raises(ConfigurationError):
        handle({"id": "o-1"})
    assert ran == []
    assert _item_count(client, table) == 0


@pytest.mark.parametrize(
    "shape", ["pk only", "sk a number", "keys swapped", "no gsi1", "gsi1 on other keys"]
)
def test_a_read_refused_for_the_tables_keys_names_the_table_and_the_fix(
    dynamodb_local: DynamoDBLocal, shape: str
) -> None:
    # DynamoDB Local only: moto answers a GetItem of the wrong key types instead of refusing it
    client = dynamodb_local.client()
    table = unique_name("shape")
    _make(client, table, shape)
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    with pytest.raises(ConfigurationError) as raised:
        if shape == "keys swapped":
            # a GetItem of both keys fits a table keyed the other way round: a Query does not
            backend.checkpoints.load_latest("task")
        elif "gsi1" in shape:
            backend.cache().keys()  # a Query of gsi1
        else:
            backend.cache().get("k")
    assert f"{table!r}" in str(raised.value)
    assert f"dynacoord --table {table} table verify" in str(raised.value)


# -- what the check costs on a right table ---------------------------------------------------------


@pytest.fixture()
def moto_client() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def test_a_first_read_on_a_right_table_sends_nothing_before_it(moto_client: Any) -> None:
    create_table(other_client(), "right")  # another client: this one has not seen it
    calls = operation_names(moto_client)
    # the check sent with the first write (the default sends it early, on a thread: see
    # tests/test_early_check.py)
    backend = DynamoDBBackend(moto_client, table_name="right", verify="first-write")
    assert backend.cache().get("k") is None
    assert backend.locks.get("k") is None
    assert calls == ["GetItem", "GetItem"]
    # the first write still waits for the check, once
    backend.cache().set("k", 1)
    backend.cache().set("j", 2)
    wait_for_ttl_checks()
    assert [c for c in calls if c.startswith("Describe")] == ["DescribeTable", "DescribeTimeToLive"]
    calls.remove("DescribeTimeToLive")  # on a thread of its own, after the first write
    assert calls == ["GetItem", "GetItem", "DescribeTable", "PutItem", "PutItem"]
    assert backend.table.guards == ()


def test_the_ttl_check_is_not_on_the_first_writes_path(
    moto_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    import threading

    client = other_client()
    client.create_table(**table_definition("nottl"))  # TTL left off
    release = threading.Event()
    ttl_threads: list[str] = []

    order: list[str] = []

    def held(**_: Any) -> None:
        order.append("DescribeTimeToLive sent")
        ttl_threads.append(threading.current_thread().name)
        release.wait(10)

    moto_client.meta.events.register("before-call.dynamodb.DescribeTimeToLive", held)
    moto_client.meta.events.register(
        "after-call.dynamodb.PutItem", lambda **_: order.append("PutItem answered")
    )
    caplog.set_level(logging.WARNING, logger="dynacoord.backends.dynamodb._verify")
    backend = DynamoDBBackend(moto_client, table_name="nottl")
    backend.cache().set("k", 1)  # returns while DescribeTimeToLive is held
    backend.cache().set("j", 2)  # and the next write does not wait for it either
    assert backend.cache().get("k") == 1
    release.set()
    wait_for_ttl_checks()
    assert len(ttl_threads) == 1 and ttl_threads[0] != threading.current_thread().name
    # sent once the first write was answered: it does not compete with it
    assert order.index("PutItem answered") < order.index("DescribeTimeToLive sent")
    [warning] = [r.getMessage() for r in caplog.records if "TTL is DISABLED" in r.getMessage()]
    assert "'nottl'" in warning


def test_a_read_refused_on_a_right_table_raises_its_own_error_and_checks_once(
    moto_client: Any,
) -> None:
    create_table(other_client(), "right2")
    calls = operation_names(moto_client)
    backend = DynamoDBBackend(moto_client, table_name="right2", verify="first-write")
    from dynacoord.errors import DynacoordError

    # a ValidationException of the request itself (a key without its sort key)
    with pytest.raises(DynacoordError) as raised:
        backend.table.call("get_item", Key={"pk": {"S": "x"}})
    assert not isinstance(raised.value, ConfigurationError)
    assert calls[:2] == ["GetItem", "DescribeTable"]
    backend.cache().set("k", 1)
    assert calls.count("DescribeTable") == 1
