"""What a backend checks before it writes: the constructor refuses what is not its client, and
the table is checked once, on first use, before anything is written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._verify import wait_for_ttl_checks
from dynacoord.errors import ConfigurationError
from dynacoord.provision import create_table
from dynacoord.testing import DUMMY_CREDENTIALS
from tests.dynamodb_calls import operation_names, other_client


@pytest.fixture()
def moto_ddb() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def _scan_count(client: Any, table: str) -> int:
    return int(client.scan(TableName=table)["Count"])


def _table(client: Any, name: str, keys: list[tuple[str, str, str]], gsi: bool = False) -> None:
    extra: dict[str, Any] = {}
    definitions = {n: t for n, t, _ in keys}
    if gsi:
        definitions.update(gsi1pk="S", gsi1sk="S")
        extra["GlobalSecondaryIndexes"] = [
            {
                "IndexName": "gsi1",
                "KeySchema": [
                    {"AttributeName": "gsi1pk", "KeyType": "HASH"},
                    {"AttributeName": "gsi1sk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ]
    client.create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": n, "AttributeType": t} for n, t in definitions.items()
        ],
        KeySchema=[{"AttributeName": n, "KeyType": k} for n, _, k in keys],
        BillingMode="PAY_PER_REQUEST",
        **extra,
    )


# --- the table is checked on first use -----------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([("pk", "S", "HASH")], "table key schema is pk (HASH), expected pk (HASH) + sk (RANGE)"),
        ([("id", "S", "HASH")], "table key schema is id (HASH)"),
        (
            [("pk", "S", "HASH"), ("sk", "N", "RANGE")],
            "table key attribute 'sk' has type N, expected S",
        ),
    ],
)
def test_a_table_with_another_key_schema_is_refused_before_anything_is_written(
    moto_ddb: Any, keys: list[tuple[str, str, str]], expected: str
) -> None:
    _table(moto_ddb, "nosk", keys, gsi=True)
    backend = DynamoDBBackend(moto_ddb, table_name="nosk")
    for write in (
        lambda: backend.cache().set("k", 1),
        lambda: backend.locks.acquire("k", ttl=10),
        lambda: backend.counters.increment("k"),
    ):
        with pytest.raises(ConfigurationError) as raised:
            write()
        message = str(raised.value)
        assert "'nosk'" in message
        assert expected in message
        assert "dynacoord --table nosk table verify" in message
        assert raised.value.table_name == "nosk"  # type: ignore[attr-defined]
    assert _scan_count(moto_ddb, "nosk") == 0


def test_a_missing_index_names_the_command_that_adds_it(moto_ddb: Any) -> None:
    _table(moto_ddb, "nogsi", [("pk", "S", "HASH"), ("sk", "S", "RANGE")])
    backend = DynamoDBBackend(moto_ddb, table_name="nogsi")
    with pytest.raises(ConfigurationError, match="'gsi1' is missing") as raised:
        backend.locks.acquire("k", ttl=10)
    assert "dynacoord --table nogsi table create" in str(raised.value)
    assert _scan_count(moto_ddb, "nogsi") == 0


def test_a_missing_table_is_a_configuration_error_naming_table_create(moto_ddb: Any) -> None:
    backend = DynamoDBBackend(moto_ddb, table_name="absent")
    with pytest.raises(ConfigurationError) as raised:
        backend.cache().get("k")
    message = str(raised.value)
    assert "'absent' does not exist" in message
    assert "region us-east-1" in message
    assert "dynacoord --table absent table create" in message


def test_the_check_is_one_describe_table_per_client_and_table_at_first_use(
    moto_ddb: Any,
) -> None:
    calls = operation_names(moto_ddb)
    backend = DynamoDBBackend(moto_ddb, table_name="later", verify="first-write")
    assert calls == []  # nothing at construction: the table may be created after
    create_table(other_client(), "later")  # by another client: this one has not seen it
    backend.cache().set("a", 1)
    backend.cache().set("b", 2)
    DynamoDBBackend(moto_ddb, table_name="later", namespace="other").cache().set("c", 3)
    # DescribeTimeToLive: a table whose TTL would never sweep dynacoord's items is logged once,
    # from a thread of its own (the first write does not wait for it)
    wait_for_ttl_checks()
    assert calls.count("DescribeTimeToLive") == 1
    calls.remove("DescribeTimeToLive")
    assert calls == ["DescribeTable", "PutItem", "PutItem", "PutItem"]
    # after the check, requests go straight to DynamoTable.call: no per-request cost
    assert backend.table.guards == ()


def test_a_table_created_or_verified_by_provision_with_that_client_is_not_described_again(
    moto_ddb: Any,
) -> None:
    from dynacoord.provision import verify_table

    create_table(moto_ddb, "made-here")
    create_table(other_client(), "made-there")
    verify_table(moto_ddb, "made-there")
    calls = operation_names(moto_ddb)
    DynamoDBBackend(moto_ddb, table_name="made-here").cache().set("a", 1)
    DynamoDBBackend(moto_ddb, table_name="made-there").cache().set("a", 1)
    assert calls == ["PutItem", "PutItem"]


def test_verify_false_skips_the_check(moto_ddb: Any) -> None:
    calls = operation_names(moto_ddb)
    create_table(moto_ddb, "noverify")
    calls.clear()
    DynamoDBBackend(moto_ddb, table_name="noverify", verify=False).cache().set("a", 1)
    assert calls == ["PutItem"]


def test_a_table_that_passed_is_used_as_before(moto_ddb: Any) -> None:
    create_table(moto_ddb, "good-table")
    backend = DynamoDBBackend(moto_ddb, table_name="good-table")
    backend.cache().set("k", {"a": 1})
    assert backend.cache().get("k") == {"a": 1}


# --- the constructor refuses what is not its client ----------------------------------------------


def test_the_dynamodb_backend_refuses_a_resource_a_str_and_an_s3_client(moto_ddb: Any) -> None:
    import boto3

    resource = boto3.resource("dynamodb", **DUMMY_CREDENTIALS)
    with pytest.raises(ConfigurationError, match=r"DynamoDB resource.*resource\.meta\.client"):
        DynamoDBBackend(resource, table_name="t-1")
    with pytest.raises(ConfigurationError, match=r"boto3\.client\('dynamodb'\); got a str"):
        DynamoDBBackend("dynamodb", table_name="t-1")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="got a boto3 's3' client"):
        DynamoDBBackend(boto3.client("s3", **DUMMY_CREDENTIALS), table_name="t-1")
    # the resource's own client is accepted
    DynamoDBBackend(resource.meta.client, table_name="t-1", verify=False)


def test_the_redis_backend_refuses_what_is_not_a_redis_client(redis_client: Any) -> None:
    import redis.asyncio

    from dynacoord.backends.redis import RedisBackend

    with pytest.raises(ConfigurationError, match=r"redis\.Redis"):
        RedisBackend("redis://localhost:6379")
    with pytest.raises(ConfigurationError, match="asyncio"):
        RedisBackend(redis.asyncio.Redis())
    with pytest.raises(ConfigurationError, match=r"redis\.Redis"):
        RedisBackend(object())
    assert RedisBackend(redis_client).locks.get("first-day") is None  # a real client passes


def test_the_mongo_backend_refuses_a_client_a_collection_and_a_str() -> None:
    import mongomock
    import pymongo

    from dynacoord.backends.mongo import MongoBackend

    client = pymongo.MongoClient("mongodb://127.0.0.1:1", connect=False)
    with pytest.raises(ConfigurationError, match=r"MongoClient.*client\['app'\]"):
        MongoBackend(client)
    with pytest.raises(ConfigurationError, match="Collection"):
        MongoBackend(client["app"]["things"])
    with pytest.raises(ConfigurationError, match="database"):
        MongoBackend("mongodb://localhost")
    with pytest.raises(ConfigurationError, match="MongoClient"):
        MongoBackend(mongomock.MongoClient())
    MongoBackend(client["app"], auto_indexes=False)  # a database passes
    MongoBackend(mongomock.MongoClient()["app"])
