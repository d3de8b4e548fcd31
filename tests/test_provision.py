"""dynacoord.provision: verify_table, ensure_table, delete_table and iam_policy."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord import keys
from dynacoord.errors import BackendError, InvalidKeyError, TableNotReadyError
from dynacoord.provision import (
    create_table,
    delete_table,
    ensure_table,
    iam_policy,
    table_definition,
    verify_table,
)
from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, unique_name

ARN = "arn:aws:dynamodb:eu-west-1:123456789012:table/dynacoord"


# --- verify_table on moto: a good table and wrong ones -----------------------------------------


@pytest.fixture()
def moto_ddb() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def test_verify_accepts_a_table_made_by_create_table(moto_table: tuple[Any, str]) -> None:
    client, name = moto_table
    assert verify_table(client, name) == []


def test_verify_reports_a_missing_table(moto_ddb: Any) -> None:
    assert verify_table(moto_ddb, "nope-table") == ["table 'nope-table' does not exist"]


def test_verify_reports_a_wrong_key_schema_and_missing_index(moto_ddb: Any) -> None:
    moto_ddb.create_table(
        TableName="wrong",
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "N"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    problems = verify_table(moto_ddb, "wrong")
    assert any(
        "table key schema is id (HASH)" in p and "pk (HASH) + sk (RANGE)" in p for p in problems
    )
    assert "global secondary index 'gsi1' is missing" in problems
    assert any(p.startswith("TTL is DISABLED") for p in problems)
    assert len(problems) == 3, problems


def test_verify_reports_wrong_types_projection_and_ttl_attribute(moto_ddb: Any) -> None:
    request = table_definition("odd")
    request["AttributeDefinitions"] = [
        {"AttributeName": "pk", "AttributeType": "S"},
        {"AttributeName": "sk", "AttributeType": "N"},
        {"AttributeName": "gsi1pk", "AttributeType": "S"},
        {"AttributeName": "gsi1sk", "AttributeType": "S"},
    ]
    request["GlobalSecondaryIndexes"][0]["Projection"] = {"ProjectionType": "KEYS_ONLY"}
    moto_ddb.create_table(**request)
    moto_ddb.update_time_to_live(
        TableName="odd", TimeToLiveSpecification={"Enabled": True, "AttributeName": "expires"}
    )
    problems = verify_table(moto_ddb, "odd")
    assert problems[:2] == [
        "table key attribute 'sk' has type N, expected S",
        "index gsi1 projection is KEYS_ONLY, expected ALL",
    ]
    assert problems[2].startswith("TTL is enabled on attribute 'expires', expected 'ttl'")
    assert "TableLayout(ttl='expires')" in problems[2]


def test_verify_reports_an_index_with_other_keys(moto_ddb: Any) -> None:
    request = table_definition("swapped")
    request["GlobalSecondaryIndexes"][0]["KeySchema"] = [
        {"AttributeName": "gsi1sk", "KeyType": "HASH"},
        {"AttributeName": "gsi1pk", "KeyType": "RANGE"},
    ]
    moto_ddb.create_table(**request)
    ensure_table(moto_ddb, "swapped")  # TTL on: only the index is wrong
    assert verify_table(moto_ddb, "swapped") == [
        "index gsi1 key schema is gsi1sk (HASH) + gsi1pk (RANGE), "
        "expected gsi1pk (HASH) + gsi1sk (RANGE)"
    ]


def test_verify_reports_a_table_that_is_not_active() -> None:
    """A stubbed answer: neither moto nor DynamoDB Local leaves a table CREATING long enough."""
    import boto3
    from botocore.stub import Stubber

    client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
    definition = table_definition("busy")
    table = {
        "TableName": "busy",
        "TableStatus": "CREATING",
        "KeySchema": definition["KeySchema"],
        "AttributeDefinitions": definition["AttributeDefinitions"],
        "GlobalSecondaryIndexes": [
            {**definition["GlobalSecondaryIndexes"][0], "IndexStatus": "CREATING"}
        ],
    }
    with Stubber(client) as stub:
        stub.add_response("describe_table", {"Table": table})
        stub.add_response(
            "describe_time_to_live",
            {"TimeToLiveDescription": {"TimeToLiveStatus": "ENABLING", "AttributeName": "ttl"}},
        )
        assert verify_table(client, "busy") == [
            "table status is CREATING, expected ACTIVE",
            "index gsi1 status is CREATING, expected ACTIVE",
        ]


# --- DynamoDB Local ---------------------------------------------------------------------------


def test_ensure_table_is_idempotent_on_dynamodb_local(dynamodb_local_client: Any) -> None:
    name = unique_name("ens")
    lines: list[str] = []
    try:
        assert ensure_table(dynamodb_local_client, name, progress=lines.append) is True
        assert f"creating table {name} ..." in lines
        assert verify_table(dynamodb_local_client, name) == []
        lines.clear()
        assert ensure_table(dynamodb_local_client, name, progress=lines.append) is False
        assert lines == []  # nothing to create, nothing to wait for, TTL already on
        assert verify_table(dynamodb_local_client, name) == []
        assert name in dynamodb_local_client.list_tables()["TableNames"]
    finally:
        delete_table(dynamodb_local_client, name)


def test_ensure_table_turns_ttl_on_for_an_existing_table(dynamodb_local_client: Any) -> None:
    name = unique_name("ttl")
    dynamodb_local_client.create_table(**table_definition(name))
    try:
        problems = verify_table(dynamodb_local_client, name)
        assert any("TTL" in p for p in problems), problems
        assert ensure_table(dynamodb_local_client, name) is False
        assert verify_table(dynamodb_local_client, name) == []
    finally:
        delete_table(dynamodb_local_client, name)


def test_create_table_refuses_an_existing_table(ddb_table: tuple[Any, str]) -> None:
    client, name = ddb_table
    with pytest.raises(BackendError, match="cannot create table"):
        create_table(client, name)
    assert verify_table(client, name) == []


def test_delete_table_on_dynamodb_local(dynamodb_local_client: Any) -> None:
    name = unique_name("del")
    create_table(dynamodb_local_client, name)
    lines: list[str] = []
    assert delete_table(dynamodb_local_client, name, progress=lines.append) is True
    assert lines[0] == f"deleting table {name} ..."
    assert verify_table(dynamodb_local_client, name) == [f"table {name!r} does not exist"]
    assert delete_table(dynamodb_local_client, name) is False


def test_delete_table_refuses_a_protected_table(moto_ddb: Any) -> None:
    create_table(moto_ddb, "protected", deletion_protection=True)
    with pytest.raises(BackendError, match="deletion protection is enabled"):
        delete_table(moto_ddb, "protected")
    assert verify_table(moto_ddb, "protected") == []


# --- iam_policy -------------------------------------------------------------------------------


def _statement(policy: dict[str, Any], sid: str) -> dict[str, Any]:
    (found,) = [s for s in policy["Statement"] if s["Sid"] == sid]
    return found


def test_iam_policy_without_namespaces() -> None:
    policy = iam_policy(ARN)
    assert json.loads(json.dumps(policy)) == policy
    assert policy["Version"] == "2012-10-17"
    items = _statement(policy, "DynacoordItems")
    assert items["Resource"] == ARN
    assert "Condition" not in items
    assert {"dynamodb:PutItem", "dynamodb:ConditionCheckItem", "dynamodb:Query"} <= set(
        items["Action"]
    )
    assert _statement(policy, "DynacoordIndexQuery")["Resource"] == f"{ARN}/index/gsi1"
    assert _statement(policy, "DynacoordDescribe")["Action"] == [
        "dynamodb:DescribeTable",
        "dynamodb:DescribeTimeToLive",
    ]
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert "dynamodb:Scan" not in actions
    assert "dynamodb:TransactWriteItems" not in actions  # no such IAM action


def test_iam_policy_restricts_leading_keys_to_the_namespaces() -> None:
    policy = iam_policy(ARN, ["orders", "billing", "orders"])
    text = json.dumps(policy)
    assert json.loads(text) == policy
    items = _statement(policy, "DynacoordItems")
    patterns = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert "LOCK#orders#*" in patterns and "CACHE#billing#*" in patterns
    assert len(patterns) == 2 * len(keys.Kind)  # every kind, each namespace once
    # Every key the schema builds for these namespaces matches, other namespaces never do.
    for ns in ("orders", "billing"):
        built = [
            keys.lock_key(ns, "k"),
            keys.breaker_key(ns, "k"),
            keys.cache_key(ns, "k", shards=4),
            keys.checkpoint_key(ns, "t", 3),
            keys.idempotency_key(ns, "k"),
            keys.outbox_key(ns, "e", status="PENDING", due_ms=5, shards=4),
            keys.counter_key(ns, "k"),
            keys.run_key(ns, "r", status="running", updated_ms=5),
        ]
        for item in built:
            assert any(fnmatch.fnmatchcase(item.pk, p) for p in patterns), item.pk
    for other in (keys.lock_key("ordersx", "k"), keys.cache_key("other", "orders#x")):
        assert not any(fnmatch.fnmatchcase(other.pk, p) for p in patterns), other.pk

    index = _statement(policy, "DynacoordIndexQuery")
    index_patterns = index["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    for gsi1pk in (
        keys.cache_index_pk("orders", 3),
        keys.outbox_index_pk("billing", "PENDING", 1),
        keys.run_index_pk("orders", "running"),
    ):
        assert any(fnmatch.fnmatchcase(gsi1pk, p) for p in index_patterns), gsi1pk
    assert not any(fnmatch.fnmatchcase("LOCK#orders#x", p) for p in index_patterns)
    assert "Condition" not in _statement(policy, "DynacoordDescribe")


def test_iam_policy_without_the_index() -> None:
    policy = iam_policy(ARN, ["orders"], include_index=False)
    assert [s["Sid"] for s in policy["Statement"]] == ["DynacoordItems", "DynacoordDescribe"]


@pytest.mark.parametrize(
    ("arn", "namespaces", "error", "match"),
    [
        ("dynacoord", None, ValueError, "table_arn"),
        ("arn:aws:s3:::bucket", None, ValueError, "table_arn"),
        (ARN, "orders", TypeError, "list of namespaces"),
        (ARN, [], ValueError, "must not be empty"),
        (ARN, ["a#b"], InvalidKeyError, "must not contain '#'"),
        (ARN, ["a*"], ValueError, "wildcard"),
        (ARN, [""], InvalidKeyError, "must not be empty"),
    ],
)
def test_iam_policy_bad_input(
    arn: str, namespaces: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        iam_policy(arn, namespaces)


def test_ensure_table_adds_a_missing_index_to_an_existing_table(
    own_dynamodb_local: DynamoDBLocal,
) -> None:
    dynamodb_local_client = own_dynamodb_local.client()
    name = unique_name("gsi")
    request = table_definition(name)
    del request["GlobalSecondaryIndexes"]
    request["AttributeDefinitions"] = request["AttributeDefinitions"][:2]
    dynamodb_local_client.create_table(**request)
    dynamodb_local_client.put_item(TableName=name, Item={"pk": {"S": "kept"}, "sk": {"S": "x"}})
    try:
        assert any("gsi1" in p for p in verify_table(dynamodb_local_client, name))
        lines: list[str] = []
        assert ensure_table(dynamodb_local_client, name, progress=lines.append) is False
        assert f"adding index gsi1 to {name} ..." in lines
        assert verify_table(dynamodb_local_client, name) == []
        item = dynamodb_local_client.get_item(
            TableName=name, Key={"pk": {"S": "kept"}, "sk": {"S": "x"}}
        )
        assert "Item" in item  # existing data untouched
    finally:
        delete_table(dynamodb_local_client, name)


def test_ensure_table_refuses_to_move_ttl_from_another_attribute(moto_ddb: Any) -> None:
    moto_ddb.create_table(**table_definition("otherttl"))
    moto_ddb.update_time_to_live(
        TableName="otherttl", TimeToLiveSpecification={"Enabled": True, "AttributeName": "exp"}
    )
    with pytest.raises(TableNotReadyError, match="TTL is enabled on attribute 'exp'"):
        ensure_table(moto_ddb, "otherttl")
    ttl = moto_ddb.describe_time_to_live(TableName="otherttl")["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "exp"


def test_ensure_table_refuses_a_table_with_another_key_schema_and_changes_nothing(
    moto_ddb: Any,
) -> None:
    from dynacoord import ConfigurationError

    moto_ddb.create_table(
        TableName="someone-elses",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with pytest.raises(ConfigurationError, match="someone-elses.*not a dynacoord table"):
        ensure_table(moto_ddb, "someone-elses")
    table = moto_ddb.describe_table(TableName="someone-elses")["Table"]
    assert not table.get("GlobalSecondaryIndexes")  # no gsi1 added
    ttl = moto_ddb.describe_time_to_live(TableName="someone-elses")["TimeToLiveDescription"]
    assert ttl["TimeToLiveStatus"] == "DISABLED"  # TTL left alone
