"""``make bench`` section 10 (cost per operation, ceilings of one key): the unit-counting rules on
small known requests, and the section's two tables on tiny sizes.

Units are counted by AWS's rules (bench/_units.py), not read from DynamoDB Local, whose
``ConsumedCapacity`` counts a transaction as one item; these tests hold the rules to the
numbers AWS's pricing pages give for the same requests."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from bench import SECTIONS, TINY
from bench import costs as costs_section
from bench._harness import BenchEnv, RequestCounter
from bench._units import (
    IndexSpec,
    UnitMeter,
    Usage,
    index_writes,
    item_size,
    partiql_target,
    query_units,
    read_units,
    write_units,
)
from bench.report import SECTION_TITLES, render
from dynacoord.testing import DynamoDBLocal, unique_name

pytestmark = pytest.mark.integration

GSI = IndexSpec("gsi1", ("gsi1pk", "gsi1sk"))


def _item(pk: str, size: int, **extra: str) -> dict[str, Any]:
    """An item of exactly ``size`` bytes (pk, sk and a padding string)."""
    item: dict[str, Any] = {"pk": {"S": pk}, "sk": {"S": "X"}}
    item.update({k: {"S": v} for k, v in extra.items()})
    pad = size - item_size(item) - len("pad")
    assert pad >= 0
    item["pad"] = {"S": "p" * pad}
    assert item_size(item) == size
    return item


# -- the rules ---------------------------------------------------------------------------------------


def test_item_size_follows_aws_rules() -> None:
    assert item_size({"pk": {"S": "abc"}}) == 5
    assert item_size({"n": {"N": "12345"}}) == 1 + 4  # 5 digits: 3 bytes + 1
    assert item_size({"b": {"BOOL": True}, "z": {"NULL": True}}) == 4
    assert item_size({"m": {"M": {"a": {"S": "xy"}}}}) == 1 + 3 + 1 + 2
    assert item_size({"l": {"L": [{"S": "x"}, {"S": "y"}]}}) == 1 + 3 + 2 * (1 + 1)
    assert item_size(None) == 0


def test_write_and_read_units() -> None:
    assert write_units(0, 1536) == 2  # a put of a 1.5 KB item
    assert write_units(1536, 100) == 2  # by the larger of before and after
    assert write_units(0, 1024) == 1
    assert write_units(0, 300, transaction=True) * 2 == 4  # a transaction of two 300 B items
    assert write_units(0, 0) == 1  # a delete of nothing still costs the minimum
    assert read_units(4096, consistent=True) == 1.0
    assert read_units(4097, consistent=True) == 2.0
    assert read_units(100, consistent=False) == 0.5
    assert query_units([3000, 3000], consistent=False) == 1.0  # 6,000 B: 2 x 4 KB, halved
    assert query_units([], consistent=True) == 1.0


def test_index_writes_follow_the_key_and_the_projection() -> None:
    base = _item("a", 300)
    listed = {**base, "gsi1pk": {"S": "Q#1"}, "gsi1sk": {"S": "1"}}
    moved = {**listed, "gsi1pk": {"S": "Q#2"}}
    changed = {**listed, "v": {"S": "new"}}
    assert index_writes(None, base, GSI) == []  # never in the index
    assert index_writes(None, listed, GSI) == [("gsi1:Q#1", 1)]  # enters it
    assert index_writes(listed, base, GSI) == [("gsi1:Q#1", 1)]  # leaves it
    assert index_writes(listed, changed, GSI) == [("gsi1:Q#1", 1)]  # updated in place
    # the index key changed: a delete from the old partition and a put into the new one
    assert index_writes(listed, moved, GSI) == [("gsi1:Q#1", 1), ("gsi1:Q#2", 1)]
    assert index_writes(listed, listed, GSI) == []  # a refused write changes nothing
    big = {**listed, "pad": {"S": "p" * 1500}}
    assert index_writes(None, big, GSI) == [("gsi1:Q#1", 2)]


def test_index_writes_follow_a_narrower_projection() -> None:
    keys_only = IndexSpec("gsi1", ("gsi1pk", "gsi1sk"), "KEYS_ONLY", ("pk", "sk"))
    include = IndexSpec("gsi1", ("gsi1pk", "gsi1sk"), "INCLUDE", ("pk", "sk"), ("status",))
    listed = {
        **_item("a", 3000),  # a 3 KB item whose keys are a few bytes
        "gsi1pk": {"S": "Q#1"},
        "gsi1sk": {"S": "1"},
        "status": {"S": "pending"},
    }
    changed = {**listed, "pad": {"S": "other"}}  # an attribute outside both projections
    lease = {**listed, "status": {"S": "in_flight"}}
    moved = {**listed, "gsi1sk": {"S": "2"}}
    # entering and leaving cost the entry's size (the keys: 1 WCU), not the item's (3 WCU)
    assert index_writes(None, listed, GSI) == [("gsi1:Q#1", 3)]
    assert index_writes(None, listed, keys_only) == [("gsi1:Q#1", 1)]
    assert index_writes(listed, _item("a", 3000), keys_only) == [("gsi1:Q#1", 1)]
    # an update outside the projection writes no index; ALL writes the whole item again
    assert index_writes(listed, changed, GSI) == [("gsi1:Q#1", 3)]
    assert index_writes(listed, changed, keys_only) == []
    assert index_writes(listed, changed, include) == []
    # an update of a projected attribute rewrites the entry; of the index key, moves it
    assert index_writes(listed, lease, keys_only) == []
    assert index_writes(listed, lease, include) == [("gsi1:Q#1", 1)]
    assert index_writes(listed, moved, keys_only) == [("gsi1:Q#1", 1), ("gsi1:Q#1", 1)]
    assert keys_only.entry(listed) == {k: listed[k] for k in ("pk", "sk", "gsi1pk", "gsi1sk")}


def test_an_events_whole_life_adds_its_publish_and_its_delivery() -> None:
    publish = {"table_wcu": 1.0, "index_wcu": 1.0, "rcu": 0.0, "requests": 1.0, "refusals": 0.0}
    delivery = {"table_wcu": 2.01, "index_wcu": 3.0, "rcu": 0.13, "requests": 0.33}
    life = costs_section.whole_life(publish, delivery)
    assert (life["table_wcu"], life["index_wcu"], life["rcu"]) == (3.01, 4.0, 0.13)
    assert life["wcu"] == 7.01 and life["requests"] == 1.33
    # index writes are write request units like the table's: 7.01 x $0.625 + 0.13 x $0.125
    assert life["usd_per_million"] == pytest.approx(7.01 * 0.625 + 0.13 * 0.125, abs=0.001)
    assert life["publish"]["index_wcu"] == 1.0 and life["delivery"]["refusals"] == 0.0


def test_partiql_statements_name_their_item() -> None:
    key = ({"S": "P"}, {"S": "S"})
    update = 'UPDATE "t" SET "a" = ? SET "n" = "n" + ? WHERE "pk" = ? AND "sk" = ? AND ("x" = ?)'
    assert partiql_target(update, [1, 2, *key, 5], ("pk", "sk")) == (
        "UPDATE",
        "t",
        {"pk": key[0], "sk": key[1]},
    )
    insert = "INSERT INTO t VALUE {'a': 'x?', 'pk': ?, 'sk': 'E''1'}"
    assert partiql_target(insert, [key[0]], ("pk", "sk")) == (
        "INSERT",
        "t",
        {"pk": key[0], "sk": {"S": "E'1"}},
    )
    assert partiql_target('SELECT * FROM "t" WHERE "pk" = ?', [key[0]], ("pk", "sk")) is None


def test_the_ceiling_takes_the_busiest_partition() -> None:
    usage = Usage(
        partition_wcu=Counter({"table:K": 20, "gsi1:Q#0": 10, "gsi1:Q#1": 30}),
        partition_rcu=Counter({"table:K": 10.0}),
        touches=Counter({"table:K": 10}),
    )
    # 10 ops: the key takes 2 WCU per op (1000/2 = 500/s); the index shards 2 WCU per op
    # together, 1 each when evenly spread (1000/s): the key limits
    got = costs_section.ceiling(usage, 10)
    assert got == {"per_s": 500, "partition": "table:K", "load": "2 WCU/op"}
    assert costs_section.usd_per_million(2, 1, 1) == pytest.approx(3 * 0.625 + 0.125)


# -- the meter on DynamoDB Local ---------------------------------------------------------------------


@pytest.fixture
def metered(dynamodb_local: DynamoDBLocal) -> Any:
    from dynacoord.provision import create_table

    client = dynamodb_local.client()
    table = unique_name("units")
    create_table(client, table)
    meter = UnitMeter(client, dynamodb_local.client())
    yield client, table, meter
    meter.close()


def test_the_meter_prices_requests_by_aws_rules(metered: Any) -> None:
    client, table, meter = metered
    client.put_item(TableName=table, Item=_item("big", 1536))
    assert (meter.wcu, meter.index_wcu) == (2, 0)
    start = meter.usage()
    client.transact_write_items(
        TransactItems=[{"Put": {"TableName": table, "Item": _item(k, 300)}} for k in ("t1", "t2")]
    )
    spent = meter.usage() - start
    assert (spent.wcu, spent.index_wcu, spent.total_requests) == (4, 0, 1)
    listed = _item("idx", 300, gsi1pk="Q#1", gsi1sk="1")
    start = meter.usage()
    client.put_item(TableName=table, Item=listed)
    client.update_item(
        TableName=table,
        Key={"pk": listed["pk"], "sk": listed["sk"]},
        UpdateExpression="SET gsi1pk = :q",
        ExpressionAttributeValues={":q": {"S": "Q#2"}},
    )
    spent = meter.usage() - start
    assert (spent.wcu, spent.index_wcu) == (2, 1 + 2)  # entered the index, then moved in it
    assert spent.partition_wcu["gsi1:Q#1"] == 2 and spent.partition_wcu["gsi1:Q#2"] == 1
    start = meter.usage()
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        client.put_item(
            TableName=table, Item=listed, ConditionExpression="attribute_not_exists(pk)"
        )
    client.get_item(TableName=table, Key={"pk": {"S": "big"}, "sk": {"S": "X"}})
    spent = meter.usage() - start
    # the refused write costs its item's size and writes no index; the read is eventual
    assert (spent.wcu, spent.index_wcu, spent.rcu) == (1, 0, 0.5)
    assert spent.refusals == Counter({"ConditionalCheckFailedException": 1})
    assert spent.requests == Counter({"PutItem": 1, "GetItem": 1})


def test_the_meter_prices_batch_statements_as_plain_writes(metered: Any) -> None:
    client, table, meter = metered
    for k in ("s1", "s2"):
        client.put_item(TableName=table, Item=_item(k, 300))
    start = meter.usage()
    response = client.batch_execute_statement(
        Statements=[
            {
                "Statement": f'UPDATE "{table}" SET "v" = ? WHERE "pk" = ? AND "sk" = ?',
                "Parameters": [{"S": "1"}, {"S": "s1"}, {"S": "X"}],
            },
            {
                "Statement": (
                    f'UPDATE "{table}" SET "v" = ? WHERE "pk" = ? AND "sk" = ? AND "v" = ?'
                ),
                "Parameters": [{"S": "1"}, {"S": "s2"}, {"S": "X"}, {"S": "nope"}],
            },
        ]
    )
    assert response["Responses"][1]["Error"]["Code"] == "ConditionalCheckFailed"
    spent = meter.usage() - start
    assert (spent.wcu, spent.index_wcu) == (2, 0)  # each statement a plain write, refused or not
    assert spent.refused_items == 1
    assert spent.refusals == Counter({"ConditionalCheckFailed (batch statement)": 1})


# -- the section -------------------------------------------------------------------------------------


def test_the_cost_section_is_part_of_make_bench() -> None:
    assert "costs" in SECTIONS and "costs" in SECTION_TITLES


def test_the_cost_section_makes_both_tables(dynamodb_local: DynamoDBLocal) -> None:
    from dynacoord.provision import create_table

    counter = RequestCounter()
    client = counter.attach(dynamodb_local.client())
    table = unique_name("costs")
    create_table(client, table)
    env = BenchEnv(scale=TINY, ddb=dynamodb_local, client=client, table=table, counter=counter)
    section = costs_section.measure(env, reps=2, events=6)
    # peers are bench extras (pip install -e '.[bench]'): absent, their rows are left out
    assert [e for e in section["errors"] if "No module named" not in e] == []
    rows = {(r["primitive"], r["operation"]): r for r in section["rows"]}
    # a plain write and a read, each on one key
    assert rows["counters", "increment (one key)"]["table_wcu"] == 1
    assert rows["counters", "increment (one key)"]["ceiling"]["per_s"] == 1000
    assert rows["cache", "get (one key, again and again)"]["rcu"] == 0.5
    assert rows["cache", "get (one key, again and again)"]["ceiling"]["per_s"] == 6000
    delivery = [r for r in section["rows"] if r["operation"].startswith("delivery per event")]
    assert {r["operation"] for r in delivery} >= {
        "delivery per event: default worker",
        "delivery per event: default worker, 4 threads",
        "delivery per event: stream relay (stream_handler)",
    }
    for r in delivery:
        assert r["table_wcu"] > 0 and r["requests"] > 0, r
    peers = {r["peer"] for r in section["peers"]}
    assert {
        "plain ADD (raw boto3 UpdateItem)",
        "polling publisher (raw boto3)",
        costs_section.NAIVE_PEER,
        "DynamoDB Streams + Lambda, no write-back",
    } <= peers
    # an event's whole life, per delivery design: its publish and its delivery added up, index
    # writes included
    lives = {life["design"]: life for life in section["whole_life"]}
    assert set(lives) == {design for design, *_ in costs_section.LIFE_DESIGNS}
    for life in lives.values():
        publish, delivery = (rows["outbox", part] for part in life["parts"])
        for field in ("table_wcu", "index_wcu", "rcu", "requests"):
            assert life[field] == pytest.approx(publish[field] + delivery[field], abs=0.002)
        assert life["wcu"] == pytest.approx(life["table_wcu"] + life["index_wcu"], abs=0.002)
    worker = lives["polling worker (default)"]
    assert worker["publish"]["index_wcu"] == 1  # the event enters gsi1
    assert worker["delivery"]["index_wcu"] > 0  # delivery moves it in and out of gsi1
    peers = {peer["by"]: peer for peer in worker["peers"]}
    # the plainest polling outbox: a put into the index (2), a claim that leaves it (2), a delete
    assert peers[costs_section.NAIVE_PEER]["wcu"] == 5
    assert peers["polling publisher (raw boto3)"]["index_wcu"] > 0
    relay = lives["stream relay (stream_handler, claim=False)"]
    [streams] = relay["peers"]
    assert streams["wcu"] == 1  # a put with no index and no write-back
    # the transactional outbox: a ~250 B business item and a ~600 B event in one transaction
    # (2 WCU each, a transaction costs twice) and the event's entry in gsi1
    together = rows["outbox", costs_section.TX_OPERATION]
    assert (together["table_wcu"], together["index_wcu"]) == (4, 1)
    share = rows["outbox", costs_section.TX_SHARE_OPERATION]
    assert (share["table_wcu"], share["index_wcu"], share["requests"]) == (3, 1, 0)
    slow = rows["outbox", costs_section.SLOW_OPERATION]
    assert slow["table_wcu"] > rows["outbox", "delivery per event: default worker"]["table_wcu"]
    text_rows = {r["operation"] for r in section["rows"]}
    assert "whole life per event: polling worker (default)" in text_rows
    assert section["ceilings"] and all(c["per_s"] or c["processes"] for c in section["ceilings"])
    text = render({"meta": {}, "sections": {"costs": {"status": "ok", **section}}})
    assert "$0.625 per million write request units" in text
    assert "### Ceilings of one key" in text
    assert "| counters | increment (one key) | one key | **1,000/s** |" in text
