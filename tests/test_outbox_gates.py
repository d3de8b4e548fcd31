"""The ordered group's gate rules (dynacoord.outbox._gates), the one table of cases the DynamoDB
and MongoDB stores build their gate writes from."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus, Outcome
from dynacoord.outbox._gates import GateMove, by_group, gate_move
from dynacoord.outbox.event import new_record


def _outcome(
    seq: int, kind: str, *, due: int = 0, counted: bool = True, group: str = "g"
) -> Outcome:
    event = Event("t", {}, id=f"e{seq}", group=group, ordered=True)
    record = new_record(event, EventStatus.IN_FLIGHT, 1, 0, "token", None, None, seq)
    return Outcome(record, kind, due_ms=due, count_attempt=counted)  # type: ignore[arg-type]


CASES = [
    # (outcomes as (seq, kind, due, counted), expected move)
    ([(1, "completed", 0, True)], GateMove(2, None, None)),
    ([(1, "failed", 0, True)], GateMove(2, None, None)),  # a failed place lets its group go on
    ([(1, "completed", 0, True), (2, "completed", 0, True)], GateMove(3, None, None)),
    ([(2, "completed", 0, True), (1, "completed", 0, True)], GateMove(3, None, None)),
    ([(1, "pending", 500, True)], GateMove(None, 1, 500)),  # the head retried: wait until 500
    ([(1, "completed", 0, True), (2, "pending", 700, True)], GateMove(2, 2, 700)),
    ([(1, "completed", 0, True), (2, "pending", 0, False)], GateMove(2, None, None)),
    ([(1, "pending", 0, False)], None),  # given back unhandled: nothing moves
    ([(1, "pending", 900, True), (2, "pending", 900, False)], GateMove(None, 1, 900)),
]


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_gate_move(given: list[tuple[int, str, int, bool]], expected: GateMove | None) -> None:
    outcomes = [_outcome(seq, kind, due=due, counted=counted) for seq, kind, due, counted in given]
    assert gate_move(outcomes) == expected


def test_a_retry_behind_the_moved_gate_is_at_its_head_only_there() -> None:
    move = gate_move([_outcome(1, "completed"), _outcome(2, "pending", due=5)])
    assert move is not None and move.retry_at_head
    move = gate_move([_outcome(1, "completed"), _outcome(3, "pending", due=5)])
    assert move is not None and not move.retry_at_head


def test_only_ordered_events_have_a_gate() -> None:
    plain = Event("t", {}, id="p1")
    record = new_record(plain, EventStatus.IN_FLIGHT, 1, 0, "token", None, None, None)
    grouped = by_group([Outcome(record, "completed"), _outcome(1, "completed", group="a")])
    assert list(grouped) == ["a"]


# -- every store's gate against the same cases (the Redis script keeps its own copy in Lua) ------


def _read_gate(store: Any, kind: str, group: str) -> dict[str, Any]:
    if kind == "redis":
        raw = store._conn.client.hgetall(store._gate_prefix + group)
        return {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
    if kind == "mongo":
        return store._coll.collection.find_one(store._gate_key(group)) or {}
    return store._gate(group)


@pytest.mark.parametrize("kind", ["moto", "redis", "mongo"])
@pytest.mark.parametrize(("given", "expected"), CASES)
def test_every_store_moves_its_gate_by_the_same_rules(
    request: pytest.FixtureRequest,
    kind: str,
    given: list[tuple[int, str, int, bool]],
    expected: GateMove | None,
) -> None:
    from tests.conftest import backend_factory

    clock = ManualClock()
    outbox = backend_factory(request, kind)(clock=clock).outbox
    outbox.publish(
        [
            Event("t", {}, id=f"e{n}", group="g", ordered=True, occurred_at=clock.time())
            for n in (1, 2, 3)
        ]
    )
    store = outbox._store
    now = int(clock.time() * 1000)
    seen = [
        record
        for shard in range(store.shards)
        for record in store.query_page(EventStatus.PENDING, shard, due_before_ms=now, limit=10)[0]
    ]
    claimed = {
        r.seq: r for r in store.claim_many(seen, [f"tok{r.seq}" for r in seen], now + 30_000, now)
    }
    assert sorted(claimed) == [1, 2, 3]
    outcomes = sorted(
        (
            Outcome(claimed[seq], kind_, due_ms=due, count_attempt=counted)  # type: ignore[arg-type]
            for seq, kind_, due, counted in given
        ),
        key=lambda o: o.record.seq or 0,
    )
    assert all(store.finish_many(outcomes, now, 3_600_000))
    gate = _read_gate(store, kind, "g")
    next_seq = int(gate.get("next_seq") or 1)
    retry = gate.get("retry_due_ms")
    after = expected.after if expected is not None and expected.after is not None else 1
    assert next_seq == after
    waits = expected is not None and expected.retry_seq == next_seq
    assert (None if retry is None else int(retry)) == (expected.retry_due_ms if waits else None)
