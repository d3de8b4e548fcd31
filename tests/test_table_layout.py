"""TableLayout: dynacoord in an application's own single table (PK/SK/GSI1, a key prefix).

The whole contract suite runs on a layout too (tests/contract/conftest.py); this file holds what
is particular to layouts: validation, the translation itself, the default layout costing
nothing, transactions mixing the application's items with dynacoord's, the table checks and
provisioning, the IAM policy and the stream relay's images.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord import ConfigurationError, Event, TableLayout
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._layout import Translator
from dynacoord.backends.dynamodb._verify import TableConfigurationError
from dynacoord.backends.dynamodb.transaction import Transaction
from dynacoord.errors import DuplicateEventError, TransactionCancelledError
from dynacoord.provision import create_table, ensure_table, iam_policy, verify_table
from dynacoord.testing import DUMMY_CREDENTIALS
from tests.backends_fixtures import (  # noqa: F401  (a fixture, registered by import)
    LAYOUT,
    dynamodb_layout_table,
)

APP = "app-table"


@pytest.fixture()
def moto_client() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


@pytest.fixture()
def app_table(moto_client: Any) -> Any:
    """A PK/SK/GSI1 table (made as an application would make it, not by dynacoord)."""
    moto_client.create_table(
        TableName=APP,
        AttributeDefinitions=[
            {"AttributeName": n, "AttributeType": "S"} for n in ("PK", "SK", "GSI1PK", "GSI1SK")
        ],
        KeySchema=[
            {"AttributeName": "PK", "KeyType": "HASH"},
            {"AttributeName": "SK", "KeyType": "RANGE"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "GSI1",
                "KeySchema": [
                    {"AttributeName": "GSI1PK", "KeyType": "HASH"},
                    {"AttributeName": "GSI1SK", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "ALL"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return moto_client


# -- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"pk": ""}, "TableLayout.pk"),
        ({"sk": 3}, "TableLayout.sk"),
        ({"index_pk": "x" * 256}, "TableLayout.index_pk"),
        ({"pk": "PK", "sk": "PK"}, "TableLayout.sk='PK' is also TableLayout.pk"),
        ({"pk": "sk"}, "TableLayout.pk='sk' is the default name of another attribute"),
        ({"ttl": "status"}, "TableLayout.ttl='status' is an attribute dynacoord"),
        ({"index_sk": "w:x"}, "TableLayout.index_sk"),
        ({"index_sk": 'a"b'}, "TableLayout.index_sk"),
        ({"expires_at": "a\nb"}, "TableLayout.expires_at"),
        ({"index": "G"}, "TableLayout.index must be a DynamoDB index name"),
        ({"index": "GSI 1"}, "TableLayout.index"),
        ({"prefix": "DC*"}, "TableLayout.prefix 'DC*' holds '*'"),
        ({"prefix": "x" * 65}, "TableLayout.prefix must be a str of at most 64"),
        ({"prefix": "a\tb"}, "TableLayout.prefix"),
    ],
)
def test_a_bad_layout_is_refused_naming_the_field(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named.replace("*", r"\*")) as info:
        TableLayout(**fields)
    assert isinstance(info.value, ValueError)


def test_layout_json_round_trips_and_names_unknown_fields() -> None:
    assert TableLayout.from_json(LAYOUT.to_json()) == LAYOUT
    assert TableLayout.from_json("") is TableLayout.from_json("{}")
    assert TableLayout.from_json("{}").is_default and TableLayout().to_json() == "{}"
    assert json.loads(LAYOUT.to_json())["prefix"] == "DC#"
    with pytest.raises(
        ConfigurationError, match=r"unknown table layout field\(s\) \['partition'\]"
    ):
        TableLayout.from_json('{"partition": "PK"}')
    with pytest.raises(ConfigurationError, match="not JSON"):
        TableLayout.from_json("{pk: PK}")
    with pytest.raises(ConfigurationError, match="must be a string"):
        TableLayout.from_json('{"pk": 1}')
    with pytest.raises(ConfigurationError, match="TableLayout.pk"):
        TableLayout.from_json('{"pk": ""}')


def test_a_backend_refuses_what_is_not_a_layout(moto_client: Any) -> None:
    with pytest.raises(ConfigurationError, match="layout must be a dynacoord.TableLayout"):
        DynamoDBBackend(moto_client, layout={"pk": "PK"})  # type: ignore[arg-type]


# -- the default layout costs nothing --------------------------------------------------------------


def _requests(client: Any) -> list[tuple[str, Any]]:
    sent: list[tuple[str, Any]] = []

    def record(params: Any, model: Any, **_: Any) -> None:
        if model.name != "DescribeTable":
            sent.append((model.name, json.dumps(params, sort_keys=True, default=str)))

    client.meta.events.register("provide-client-params.dynamodb.*", record, unique_id="layout")
    return sent


def _workload(backend: DynamoDBBackend) -> None:
    from dynacoord import ManualClock

    assert isinstance(backend.clock, ManualClock)
    lease = backend.locks.acquire("job", ttl=10, owner="me")
    lease.release()
    cache = backend.cache()
    cache.set("k", 1, ttl=60)
    cache.get("k")
    cache.get_many(["k", "j"])
    list(cache.keys())
    backend.counters.increment("n")
    backend.checkpoints.save("task", {"at": 1})
    backend.checkpoints.load_latest("task")
    with backend.transaction() as tx:
        tx.put(backend.table_name, {"pk": "APP#1", "sk": "A", "v": 1})
        tx.publish(Event("t", {"a": 1}, id="e1", occurred_at=backend.clock.time()))
    backend.outbox.get("e1")  # (a worker starts at a random shard: its requests vary by run)
    backend.runs.start("r1")
    backend.runs.complete("r1", {"ok": True})
    list(backend.runs.stalled(0))


def test_the_default_layout_sends_the_requests_of_no_layout(moto_client: Any) -> None:
    """Byte for byte: the same requests (names, values, expressions) with layout=None and
    layout=TableLayout(), through the client itself (no wrapper, no translation)."""
    from dynacoord import ManualClock

    create_table(moto_client, "dynacoord")
    seen = []
    for layout in (None, TableLayout()):
        sent = _requests(moto_client)
        # the same clock readings, namespace and tokens in both runs
        backend = DynamoDBBackend(
            moto_client,
            namespace=f"ns{len(seen)}",
            clock=ManualClock(),
            layout=layout,
        )
        assert backend.table.client is moto_client and backend.table.translator is None
        assert type(backend.transaction()) is Transaction
        _workload(backend)
        moto_client.meta.events.unregister("provide-client-params.dynamodb.*", unique_id="layout")
        seen.append([(op, params.replace(f"ns{len(seen)}", "NS")) for op, params in sent])
    # request tokens are random: compare the requests without them
    shapes = [sorted(json.dumps([op, _without_tokens(p)]) for op, p in run) for run in seen]
    assert shapes[0] == shapes[1]
    assert len(shapes[0]) > 15


def _without_tokens(params: str) -> Any:
    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: (
                    "<token>" if k in ("req", ":req", ":token", ":rqt", ":lt", "#rqw") else strip(v)
                )
                for k, v in value.items()
            }
        if isinstance(value, list):
            return [strip(v) for v in value]
        if isinstance(value, str) and len(value) in (16, 32) and value.isalnum():
            return "<id>"
        return value

    return strip(json.loads(params))


# -- the translation ------------------------------------------------------------------------------


def test_requests_are_renamed_whole_words_and_partition_keys_prefixed() -> None:
    t = Translator(LAYOUT, APP)
    out = t.request(
        {
            "Key": {"pk": {"S": "LOCK#ns#a"}, "sk": {"S": "LOCK"}},
            "UpdateExpression": "SET gsi1pk = :gpk, gsi1sk = :gsk, #ttl = :ttl, pks = :pk "
            "REMOVE ctx.pk, expires_at_ms",
            "ConditionExpression": "attribute_not_exists(pk) OR expires_at_ms <= :now",
            "ExpressionAttributeNames": {"#ttl": "ttl"},
            "ExpressionAttributeValues": {
                ":gpk": {"S": "RUN#ns#running"},
                ":gsk": {"S": "0001#r"},
                ":ttl": {"N": "1"},
                ":pk": {"S": "not a key"},
                ":now": {"N": "5"},
            },
        }
    )
    assert out["Key"] == {"PK": {"S": "DC#LOCK#ns#a"}, "SK": {"S": "LOCK"}}
    assert out["UpdateExpression"] == (
        "SET #Lgpk = :gpk, #Lgsk = :gsk, #ttl = :ttl, pks = :pk REMOVE ctx.pk, expires_at_ms"
    )
    assert out["ConditionExpression"] == "attribute_not_exists(#Lpk) OR expires_at_ms <= :now"
    # ttl and expires_at_ms keep their names in this layout: left as the caller wrote them
    assert out["ExpressionAttributeNames"] == {
        "#ttl": "ttl",
        "#Lgpk": "GSI1PK",
        "#Lgsk": "GSI1SK",
        "#Lpk": "PK",
    }
    values = out["ExpressionAttributeValues"]
    assert values[":gpk"] == {"S": "DC#RUN#ns#running"}
    assert values[":pk"] == {"S": "not a key"} and values[":gsk"] == {"S": "0001#r"}


def test_key_conditions_index_names_and_caller_placeholders_are_translated() -> None:
    layout = TableLayout(pk="PK", sk="SK", index="GSI1", ttl="expiresAt", prefix="p:")
    t = Translator(layout, APP)
    out = t.request(
        {
            "IndexName": "gsi1",
            "KeyConditionExpression": ":p = #g AND begins_with(gsi1sk, :s)",
            "ExpressionAttributeNames": {"#g": "gsi1pk", "#t": "ttl"},
            "ExpressionAttributeValues": {":p": {"S": "CACHE#ns#0"}, ":s": {"S": "a"}},
            "ProjectionExpression": "gsi1sk, #t",
            "ExclusiveStartKey": {"pk": {"S": "CACHE#ns#a"}, "gsi1pk": {"S": "CACHE#ns#0"}},
        }
    )
    assert out["IndexName"] == "GSI1"
    assert out["ExpressionAttributeNames"] == {"#g": "gsi1pk", "#t": "expiresAt"}
    assert out["ExpressionAttributeValues"][":p"] == {"S": "p:CACHE#ns#0"}
    assert out["ExclusiveStartKey"] == {
        "PK": {"S": "p:CACHE#ns#a"},
        "gsi1pk": {"S": "p:CACHE#ns#0"},
    }


def test_answers_are_translated_back() -> None:
    t = Translator(LAYOUT, APP)
    theirs = {"PK": {"S": "DC#OUTBOX#ns#e"}, "SK": {"S": "EVENT"}, "GSI1PK": {"S": "DC#X"}}
    ours = {"pk": {"S": "OUTBOX#ns#e"}, "sk": {"S": "EVENT"}, "gsi1pk": {"S": "X"}}
    answer = t.answer(
        {
            "Item": dict(theirs),
            "Items": [dict(theirs)],
            "Attributes": dict(theirs),
            "LastEvaluatedKey": dict(theirs),
            "CancellationReasons": [{"Code": "None"}, {"Code": "X", "Item": dict(theirs)}],
            "Responses": {APP: [dict(theirs)], "other": [dict(theirs)]},
            "UnprocessedKeys": {APP: {"Keys": [dict(theirs)], "ConsistentRead": True}},
            "UnprocessedItems": {APP: [{"PutRequest": {"Item": dict(theirs)}}]},
        }
    )
    assert answer["Item"] == answer["Attributes"] == answer["LastEvaluatedKey"] == ours
    assert answer["Items"] == [ours] and answer["CancellationReasons"][1]["Item"] == ours
    assert answer["Responses"] == {APP: [ours], "other": [theirs]}
    assert answer["UnprocessedKeys"][APP] == {"Keys": [ours], "ConsistentRead": True}
    assert answer["UnprocessedItems"][APP] == [{"PutRequest": {"Item": ours}}]


def test_batch_and_transaction_requests_translate_only_the_layout_table() -> None:
    t = Translator(LAYOUT, APP)
    key = {"pk": {"S": "A"}, "sk": {"S": "B"}}
    batch = t.batch_write({APP: [{"DeleteRequest": {"Key": key}}], "other": [{"X": 1}]})
    assert batch == {
        APP: [{"DeleteRequest": {"Key": {"PK": {"S": "DC#A"}, "SK": {"S": "B"}}}}],
        "other": [{"X": 1}],
    }
    got = t.batch_get({APP: {"Keys": [key], "ProjectionExpression": "pk, v"}})
    assert got[APP]["ProjectionExpression"] == "#Lpk, v"
    assert got[APP]["Keys"] == [{"PK": {"S": "DC#A"}, "SK": {"S": "B"}}]
    assert t.transact_item({"Put": {"TableName": "other", "Item": key}}) == {
        "Put": {"TableName": "other", "Item": key}
    }


# -- transactions: the application's items as written, dynacoord's translated ----------------------


def test_an_application_item_and_an_outbox_event_commit_together(app_table: Any) -> None:
    backend = DynamoDBBackend(app_table, table_name=APP, layout=LAYOUT)
    order = {"PK": "ORDER#1", "SK": "ORDER", "GSI1PK": "CUSTOMER#7", "GSI1SK": "ORDER#1", "n": 2}
    with backend.transaction() as tx:
        tx.put(APP, order, condition="attribute_not_exists(PK)")
        ids = tx.publish(Event("order.created", {"order": "1"}))
    got: list[Event] = []
    assert backend.outbox.worker(got.append, heartbeat=False).run_once() == 1
    assert [e.id for e in got] == ids and got[0].payload == {"order": "1"}
    item = app_table.get_item(TableName=APP, Key={"PK": {"S": "ORDER#1"}, "SK": {"S": "ORDER"}})
    assert item["Item"] == {
        "PK": {"S": "ORDER#1"},
        "SK": {"S": "ORDER"},
        "GSI1PK": {"S": "CUSTOMER#7"},
        "GSI1SK": {"S": "ORDER#1"},
        "n": {"N": "2"},
    }
    event_key = {"PK": {"S": f"DC#OUTBOX#default#{ids[0]}"}, "SK": {"S": "EVENT"}}
    assert "Item" in app_table.get_item(TableName=APP, Key=event_key)


def test_a_refused_transaction_names_the_application_item_and_the_duplicate_event(
    app_table: Any,
) -> None:
    backend = DynamoDBBackend(app_table, table_name=APP, layout=LAYOUT)
    app_table.put_item(TableName=APP, Item={"PK": {"S": "ORDER#1"}, "SK": {"S": "ORDER"}})
    with pytest.raises(TransactionCancelledError) as info, backend.transaction() as tx:
        tx.put(APP, {"PK": "ORDER#1", "SK": "ORDER"}, condition="attribute_not_exists(PK)")
        tx.publish(Event("t", {}, id="e1"))
    assert info.value.reasons[0]["Code"] == "ConditionalCheckFailed"
    assert info.value.reasons[1]["Code"] == "None"
    backend.outbox.publish(Event("t", {}, id="e2"))
    with pytest.raises(DuplicateEventError) as dup, backend.transaction() as tx:
        tx.put(APP, {"PK": "ORDER#2", "SK": "ORDER"})
        tx.publish(Event("t", {}, id="e2"))
    assert dup.value.event_ids == ["e2"]
    assert dup.value.reasons[1]["Item"]["pk"] == "OUTBOX#default#e2"  # dynacoord's names
    # the same item twice is found before anything is sent, in the layout's key names too
    with pytest.raises(Exception, match="appears twice"), backend.transaction() as tx:
        tx.put(APP, {"PK": "ORDER#3", "SK": "ORDER"})
        tx.update(APP, {"PK": "ORDER#3", "SK": "ORDER"}, "SET n = :n", values={":n": 1})


def test_transactions_on_dynamodb_local_keep_the_application_items(
    dynamodb_layout_table: tuple[Any, str],
) -> None:
    client, table = dynamodb_layout_table
    backend = DynamoDBBackend(client, table_name=table, namespace="tx-local", layout=LAYOUT)
    with backend.transaction() as tx:
        tx.put(table, {"PK": "USER#9", "SK": "PROFILE", "name": "Grace"})
        tx.update(
            table,
            {"PK": "USER#9", "SK": "COUNT"},
            "SET n = if_not_exists(n, :z) + :one",
            values={":z": 0, ":one": 1},
        )
        [event_id] = tx.publish(Event("user.created", {"user": "9"}))
    got: list[str] = []
    assert backend.outbox.worker(lambda e: got.append(e.id), heartbeat=False).run_once() == 1
    assert got == [event_id]
    profile = client.get_item(TableName=table, Key={"PK": {"S": "USER#9"}, "SK": {"S": "PROFILE"}})
    assert profile["Item"] == {
        "PK": {"S": "USER#9"},
        "SK": {"S": "PROFILE"},
        "name": {"S": "Grace"},
    }


# -- the table: checks, provisioning, IAM ----------------------------------------------------------


def test_the_first_use_check_names_the_layout(app_table: Any) -> None:
    create_table(app_table, "dynacoord")
    wrong = DynamoDBBackend(app_table, table_name="dynacoord", layout=LAYOUT)
    with pytest.raises(TableConfigurationError) as info:
        wrong.counters.increment("n")
    message = str(info.value)
    assert "expected PK (HASH) + SK (RANGE)" in message and "'GSI1' is missing" in message
    assert "--table-layout" in message
    # an application's table without a layout: dynacoord's names are expected
    with pytest.raises(TableConfigurationError, match=r"expected pk \(HASH\) \+ sk \(RANGE\)"):
        DynamoDBBackend(app_table, table_name=APP).counters.increment("n")
    assert DynamoDBBackend(app_table, table_name=APP, layout=LAYOUT).counters.increment("n") == 1


def test_create_ensure_and_verify_a_table_with_a_layout(moto_client: Any) -> None:
    layout = TableLayout(
        pk="PK", sk="SK", index="GSI1", index_pk="GSI1PK", index_sk="GSI1SK", ttl="expiresAt"
    )
    create_table(moto_client, "made", layout=layout)
    described = moto_client.describe_table(TableName="made")["Table"]
    assert [k["AttributeName"] for k in described["KeySchema"]] == ["PK", "SK"]
    assert described["GlobalSecondaryIndexes"][0]["IndexName"] == "GSI1"
    ttl = moto_client.describe_time_to_live(TableName="made")["TimeToLiveDescription"]
    assert ttl["AttributeName"] == "expiresAt"
    assert verify_table(moto_client, "made", layout=layout) == []
    assert ensure_table(moto_client, "made", layout=layout) is False
    problems = verify_table(moto_client, "made")
    assert any("expected pk (HASH) + sk (RANGE)" in p for p in problems)
    assert any("'gsi1' is missing" in p for p in problems)
    with pytest.raises(ConfigurationError, match="check the table name and the table layout"):
        ensure_table(moto_client, "made", layout=LAYOUT.__class__(pk="P2", sk="S2"))
    backend = DynamoDBBackend(moto_client, table_name="made", layout=layout)
    backend.cache().set("k", "v", ttl=60)
    item = moto_client.scan(TableName="made")["Items"][0]
    assert {"PK", "SK", "GSI1PK", "GSI1SK", "expiresAt", "expires_at_ms"} <= set(item)


def test_iam_policy_scopes_the_prefixed_keys_and_the_layout_index() -> None:
    policy = iam_policy(
        "arn:aws:dynamodb:eu-west-1:123456789012:table/app", ["orders"], layout=LAYOUT
    )
    items, index, _ = policy["Statement"]
    keys = items["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
    assert "DC#LOCK#orders#*" in keys and all(k.startswith("DC#") for k in keys)
    assert index["Resource"].endswith("/index/GSI1")
    assert index["Condition"]["ForAllValues:StringLike"]["dynamodb:LeadingKeys"] == [
        "DC#CACHE#orders#*",
        "DC#OUTBOX#orders#*",
        "DC#RUN#orders#*",
    ]


# -- the stream relay and the environment ---------------------------------------------------------


def test_stream_images_in_the_layout_names_reach_the_relay(app_table: Any) -> None:
    backend = DynamoDBBackend(app_table, table_name=APP, layout=LAYOUT)
    [event_id] = backend.outbox.publish(Event("t", {"a": 1}))
    key = {"PK": {"S": f"DC#OUTBOX#default#{event_id}"}, "SK": {"S": "EVENT"}}
    image = app_table.get_item(TableName=APP, Key=key)["Item"]
    store = backend.outbox._store
    record = store.stream_record(image, 0)
    assert record is not None and record.event.id == event_id
    # the same image without the prefix (an application's item that looks like an event)
    foreign = {**image, "PK": {"S": f"OUTBOX#default#{event_id}"}}
    assert store.stream_record(foreign, 0) is None
    got: list[str] = []
    relay = backend.outbox.stream_handler(lambda e: got.append(e.id), heartbeat=False)
    records = [
        {
            "eventSource": "aws:dynamodb",
            "eventName": "INSERT",
            "dynamodb": {"NewImage": image, "SequenceNumber": "1"},
        },
        {
            "eventSource": "aws:dynamodb",
            "eventName": "INSERT",
            "dynamodb": {"NewImage": foreign, "SequenceNumber": "2"},
        },
    ]
    assert relay({"Records": records}) == {"batchItemFailures": []}
    assert got == [event_id]


def test_from_env_reads_the_layout(app_table: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DYNACOORD_TABLE", APP)
    monkeypatch.setenv("DYNACOORD_TABLE_LAYOUT", LAYOUT.to_json())
    backend = DynamoDBBackend.from_env(client=app_table)
    assert backend.layout == LAYOUT and backend.table.translator is not None
    assert "layout=TableLayout(pk='PK'" in repr(backend)
    monkeypatch.setenv("DYNACOORD_TABLE_LAYOUT", '{"pk": "sk"}')
    with pytest.raises(ConfigurationError, match="DYNACOORD_TABLE_LAYOUT: TableLayout.pk"):
        DynamoDBBackend.from_env(client=app_table)
    monkeypatch.setenv("DYNACOORD_TABLE_LAYOUT", "")
    assert DynamoDBBackend.from_env(client=app_table).table.translator is None
