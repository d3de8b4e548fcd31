"""Joins at a constant cost: on DynamoDB an arrival writes its member's bucket and
carries the bucket's count to the join item (two small items, whatever the member count), each
member counted once, the completer firing, exact under lost responses and a crash between the
two writes. Units by AWS's rules (bench/_units.py)."""

from __future__ import annotations

import threading

import pytest

from bench._units import UnitMeter
from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb.counters import _bucket_of, join_buckets
from dynacoord.testing import unique_name


def _backend(client, table, **options):
    return DynamoDBBackend(client, table_name=table, namespace=unique_name("jc"), **options)


def test_every_arrival_of_a_2000_member_join_costs_at_most_2_wcu(ddb_table):
    """On DynamoDB Local: the last arrival of a 2,000-member join (up to ~250 WCU if it rewrote
    one set of every member) costs 2 WCU, and fires."""
    client, table = ddb_table
    counters = _backend(client, table).counters
    n = 2000
    for i in range(n - 1):
        assert counters.join("fan", f"member-{i:05d}", expected=n).fired is False
    meter = UnitMeter(client, client, table)
    try:
        last = counters.join("fan", f"member-{n - 1:05d}", expected=n)
        redelivered = counters.join("fan", f"member-{n - 1:05d}", expected=n)
    finally:
        meter.close()
    assert last.fired and last.complete and last.count == n
    assert redelivered.fired and redelivered.count == n
    assert meter.wcu <= 4, meter.wcu  # 2 per arrival (the redelivery's refused writes too)
    assert max(meter.sizes.values()) < 1024
    item = counters.item("fan")
    assert item is not None and len(item.members) == n


def test_arrivals_cost_at_most_2_wcu_whatever_the_member_count(moto_table):
    client, table = moto_table
    counters = _backend(client, table).counters
    meter = UnitMeter(client, client, table)
    try:
        counters.join("big", "m0", expected=5000)  # creates the join item: one more write
        start = meter.wcu
        for i in range(1, 150):
            counters.join("big", f"m{i}", expected=5000)
        per_arrival = (meter.wcu - start) / 149
    finally:
        meter.close()
    assert per_arrival <= 2, per_arrival
    assert counters.get("big") == 150


def test_concurrent_arrivals_count_each_member_once_and_one_fires(ddb_table):
    client, table = ddb_table
    counters = _backend(client, table).counters
    n = 64
    fired: list[str] = []
    lock = threading.Lock()

    def arrive(i: int) -> None:
        for _ in range(2):  # and a redelivery of each
            if counters.join("c", f"m{i}", expected=n).fired:
                with lock:
                    fired.append(f"m{i}")

    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counters.get("c") == n
    assert len(set(fired)) == 1  # one member fired (again on its redelivery)


def test_a_crash_between_the_two_writes_is_repaired_by_the_redelivery(ddb_table):
    client, table = ddb_table
    backend = _backend(client, table)
    counters = backend.counters
    store = counters._store
    counters.join("k", "a", expected=2)
    pk = f"COUNTER#{backend.namespace}#k"
    gen = backend.table.state.join_gens[pk][0]
    # "b" reaches its bucket, then the process dies before carrying it to the join item
    store._bucket_add(pk, gen, _bucket_of("b", join_buckets(2)), "b", None, 0)
    assert counters.get("k") == 1
    again = counters.join("k", "b", expected=2)  # the redelivery
    assert again.count == 2 and again.fired
    assert counters.join("k", "b", expected=2).fired  # and every later one
    assert counters.join("k", "a", expected=2).fired is False
    assert counters.get("k") == 2


def test_a_lost_answer_of_either_write_counts_once(lossy):
    if lossy.kind != "dynamodb":
        pytest.skip("two writes per arrival only on DynamoDB")
    counters = lossy.backend().counters
    counters.join("k", "a", expected=3)
    lossy.lose_next(2, operation="UpdateItem")  # the bucket write, then the carry
    result = counters.join("k", "b", expected=3)
    assert lossy.lost == 2
    assert result.count == 2 and not result.fired
    lossy.lose_next(2, operation="UpdateItem")
    last = counters.join("k", "c", expected=3)
    assert last.count == 3 and last.fired
    assert counters.get("k") == 3


def test_an_expired_join_starts_again_without_its_old_members(ddb_table):
    client, table = ddb_table
    clock = ManualClock()
    counters = _backend(client, table, clock=clock).counters
    assert counters.join("t", "a", expected=2, ttl=10).fired is False
    clock.advance(11)
    again = counters.join("t", "a", expected=2, ttl=10)
    assert again.count == 1 and not again.fired  # a's old bucket entry is not this join's
    assert counters.join("t", "b", expected=2, ttl=10).fired


def test_extend_ttl_and_delete_take_the_buckets_along(ddb_table):
    client, table = ddb_table
    clock = ManualClock()
    backend = _backend(client, table, clock=clock)
    counters = backend.counters
    for m in "abc":
        counters.join("e", m, expected=5, ttl=10)
    assert counters.extend_ttl("e", 100)
    clock.advance(50)
    item = counters.item("e")
    assert item is not None and item.members == frozenset("abc")
    pk = f"COUNTER#{backend.namespace}#e"
    buckets = client.query(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :j)",
        ExpressionAttributeValues={":pk": {"S": pk}, ":j": {"S": "JOIN#"}},
    )["Items"]
    assert buckets and all(
        int(b["expires_at_ms"]["N"]) == int(clock.time() * 1000) - 50_000 + 100_000
        for b in buckets
    )
    assert counters.delete("e") is True
    left = client.query(
        TableName=table,
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": pk}},
    )["Items"]
    assert left == []


def test_a_process_with_a_stale_generation_learns_the_new_one_from_the_refusal(ddb_table):
    """No read again (an eventually consistent one could still show the old generation): the
    join item's refusal shows the generation to join."""
    client, table = ddb_table
    backend = _backend(client, table)
    counters = backend.counters
    pk = f"COUNTER#{backend.namespace}#g"
    counters.join("g", "a", expected=3)
    gens = backend.table.state.join_gens
    stale = gens[pk]
    counters.delete("g")  # "another process" deletes the join and starts it again
    counters.join("g", "b", expected=3)
    assert gens[pk][0] != stale[0]
    gens[pk] = stale  # this process still knows the old generation
    sent: list[str] = []

    def note(model, **_):
        sent.append(model.name)

    client.meta.events.register("before-parameter-build.dynamodb", note)
    try:
        result = counters.join("g", "c", expected=3)
    finally:
        client.meta.events.unregister("before-parameter-build.dynamodb", note)
    assert result.count == 2 and not result.fired
    assert sent == ["UpdateItem", "UpdateItem", "UpdateItem", "UpdateItem"]
