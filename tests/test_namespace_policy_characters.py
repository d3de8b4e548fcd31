"""A namespace with an IAM wildcard or policy-variable character (``*``, ``?``, ``$``) is refused
by every backend before anything is written, as ``iam-policy`` and the stack's ``Namespaces``
refuse it: no policy could scope its data."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import DynamoDBBackend, InvalidKeyError
from dynacoord.cli import main


@pytest.mark.parametrize("namespace", ["team-*", "a?b", "${aws:username}", "x$"])
def test_the_backend_refuses_it_at_construction(moto_table: Any, namespace: str) -> None:
    client, table = moto_table
    with pytest.raises(InvalidKeyError) as raised:
        DynamoDBBackend(client, table_name=table, namespace=namespace)
    message = str(raised.value)
    assert repr(namespace) in message and "IAM" in message
    assert client.scan(TableName=table)["Count"] == 0


def test_a_per_call_namespace_is_refused_too(moto_table: Any) -> None:
    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table)
    with pytest.raises(InvalidKeyError):
        backend.cache(namespace="a*")
    assert client.scan(TableName=table)["Count"] == 0


def test_the_redis_and_mongo_backends_refuse_it(redis_client: Any, mongo_database: Any) -> None:
    from dynacoord.backends.mongo import MongoBackend
    from dynacoord.backends.redis import RedisBackend

    with pytest.raises(InvalidKeyError):
        RedisBackend(redis_client, namespace="a*")
    with pytest.raises(InvalidKeyError):
        MongoBackend(mongo_database, namespace="a?")


def test_the_cli_says_so_in_one_line_and_exits_2(
    capsys: pytest.CaptureFixture[str], moto_table: Any
) -> None:
    _, table = moto_table
    code = main(
        ["--region", "us-east-1", "--table", table, "--namespace", "a*", "cache", "get", "k"]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("dynacoord: error: namespace must not contain") and err.count("\n") == 1
