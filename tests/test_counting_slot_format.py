"""How a counting slot is stored on DynamoDB, and what a process remembers of an item's slots
(docs/counters.md, "Who drops what").

A slot is ``w:`` + a 6-character process id + a serial, holding its token as a binary of the
integer's bytes (~15 bytes in all, where the previous round's took ~19: 120 slots and a counter
fit in 2 KB). Items written by earlier versions hold number tokens: they are read (a retry of
theirs is still recognised by them, and their stale slots are dropped) like the new ones.
"""

from __future__ import annotations

from typing import Any

from bench._units import item_size
from dynacoord import ManualClock, _writers
from dynacoord._writers import PRUNE_AT, TOKEN_SCALE
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._counting import CountingToken, slot_token, slot_value
from dynacoord.testing import unique_name
from tests.slot_pools import Process


def test_a_token_round_trips_through_its_binary_and_a_number_is_read_too() -> None:
    token = (1_764_230_000_000 + 400_000) * TOKEN_SCALE
    stored = slot_value(token)
    assert len(stored["B"]) == 6
    assert slot_token(stored) == token
    assert slot_token({"N": str(token)}) == token  # a slot an earlier version wrote
    assert slot_token({"S": "x"}) is None


def test_a_slot_of_a_process_is_15_bytes() -> None:
    pool = _writers._Pool()
    assert len(pool.process) == 6
    slot = pool.take()
    name = "w:" + slot.name
    value = slot_value((1_764_230_000_000 + 400_000) * TOKEN_SCALE)
    assert item_size({name: value}) == 15


def test_a_refusal_showing_the_token_as_a_number_is_recognised() -> None:
    token = CountingToken(0, "pk")
    token.name, token.token = "w:abcdef0", str(12345)
    assert token.applied({"w:abcdef0": {"B": (12345).to_bytes(2, "big")}})
    assert token.applied({"w:abcdef0": {"N": "12345"}})
    assert not token.applied({"w:abcdef0": {"B": (12346).to_bytes(2, "big")}})
    assert not token.applied(None)


def test_finished_names_only_this_process_free_slots() -> None:
    pool = _writers._Pool()
    saved = _writers._pool[0]
    _writers._pool[0] = pool
    try:
        held, _ = _writers.lease(0, 1)
        done, _ = _writers.lease(0, 1)
        _writers.release(done)
        other = _writers._Pool().take()
        assert _writers.finished([held.name, done.name, other.name]) == {done.name}
        _writers.remember("item", (("w:x", {"B": b"\x01"}, 5),))
        assert _writers.recall("item") == (("w:x", {"B": b"\x01"}, 5),)
        assert _writers.recall("item") == ()  # recalled once
    finally:
        _writers._pool[0] = saved


def test_stale_number_slots_of_an_earlier_version_are_dropped(ddb_table: Any) -> None:
    """Slots an earlier version left (numbers), stale, are dropped by the next writers like the
    new ones; a live one is kept."""
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("sf"), clock=clock)
    counters = backend.counters
    counters.increment("k")
    pk = f"COUNTER#{backend.namespace}#k"
    now = int(clock.time() * 1000)
    old = {f"w:old{i:05d}0": {"N": str((now - 1) * TOKEN_SCALE)} for i in range(4 * PRUNE_AT + 1)}
    live = {"w:livenum0": {"N": str((now + 10**9) * TOKEN_SCALE)}}
    names = {f"#s{i}": n for i, n in enumerate({**old, **live})}
    client.update_item(
        TableName=table,
        Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}},
        UpdateExpression="SET " + ", ".join(f"{n} = :s{n[2:]}" for n in names),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues={f":s{i}": v for i, v in enumerate({**old, **live}.values())},
    )
    Process(backend.table).run(counters.increment, "k")  # sees them stale: drops them at once
    item = client.get_item(
        TableName=table, Key={"pk": {"S": pk}, "sk": {"S": "COUNTER"}}, ConsistentRead=True
    )["Item"]
    slots = {n for n in item if n.startswith("w:")}
    assert not slots & set(old)
    assert "w:livenum0" in slots
    assert counters.get("k") == 2
