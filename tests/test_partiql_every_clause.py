"""DynamoDB Local enforces every clause of a condition translated to PartiQL, not only the first.

The outbox sends a batch's conditional writes as ``BatchExecuteStatement`` (dynacoord/backends/
dynamodb/_partiql.py). Its startup probe is refused by its first clause alone, and a translation
that kept only the first ``AND`` clause of a condition would still pass it: these cases are
decided by a later clause. An outcome or an extension is conditional on ``status = in_flight AND
lease_token = :mine``: after another worker took an event over (its lease had run out), the
status is still ``in_flight`` and only the second clause refuses the first worker's writes.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.outbox import Event, EventStatus, Outcome
from dynacoord.testing import unique_name

LEASE_MS = 30_000


@pytest.fixture()
def setup(ddb_table: tuple[Any, str]) -> Any:
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("pq"), clock=clock)
    store = backend.outbox._store
    assert store._statements_supported(), "DynamoDB Local runs conditional PartiQL batches"
    sent: Counter[str] = Counter()

    def count(event_name: str, **_: Any) -> None:
        sent[event_name.rsplit(".", 1)[-1]] += 1

    client.meta.events.register("before-send.dynamodb.*", count)
    yield backend, store, clock, sent
    client.meta.events.unregister("before-send.dynamodb.*", count)


def _now(clock: ManualClock) -> int:
    return int(clock.time() * 1000)


def _claim(store: Any, clock: ManualClock, ids: list[str]) -> list[Any]:
    now = _now(clock)
    seen = [store.get(event_id, now) for event_id in ids]
    tokens = [uuid.uuid4().hex for _ in ids]
    claimed = store.claim_many(seen, tokens, now + LEASE_MS, now)
    assert sorted(r.id for r in claimed) == sorted(ids)
    return sorted(claimed, key=lambda r: r.id)


def test_a_batched_outcome_after_a_takeover_is_refused(setup: Any) -> None:
    backend, store, clock, sent = setup
    ids = ["e0", "e1", "e2"]
    backend.outbox.publish([Event("t", i, id=event_id) for i, event_id in enumerate(ids)])
    first = _claim(store, clock, ids)  # worker A
    clock.advance(LEASE_MS / 1000 + 1)  # A froze past its lease
    second = _claim(store, clock, ["e0", "e1"])  # worker B takes two of them over
    sent.clear()
    now = _now(clock)
    written = store.finish_many([Outcome(r, "completed") for r in first], now, 60_000)
    assert sent["BatchExecuteStatement"] >= 1, sent  # the statements path was taken
    assert written == [False, False, True], "A no longer holds e0 and e1"
    for record in second:
        got = backend.outbox.get(record.id)
        assert got is not None and got.status is EventStatus.IN_FLIGHT
        assert got.lease_token == record.lease_token, "still B's claim"
    assert store.finish_many([Outcome(r, "completed") for r in second], now, 60_000) == [
        True,
        True,
    ]


def test_a_batched_extension_after_a_takeover_is_refused(setup: Any) -> None:
    backend, store, clock, sent = setup
    ids = ["x0", "x1", "x2"]
    backend.outbox.publish([Event("t", i, id=event_id) for i, event_id in enumerate(ids)])
    first = _claim(store, clock, ids)
    clock.advance(LEASE_MS / 1000 + 1)
    second = _claim(store, clock, ["x1", "x2"])
    sent.clear()
    now = _now(clock)
    assert store.extend_many(first, now + LEASE_MS, now) == [True, False, False]
    assert sent["BatchExecuteStatement"] >= 1, sent
    for record in second:
        got = backend.outbox.get(record.id)
        assert got is not None and got.lease_token == record.lease_token


def test_a_batched_claim_of_an_event_claimed_since_it_was_seen_is_refused(setup: Any) -> None:
    """A claim is conditional on the event being as seen (status, due, lease token, attempts):
    two workers that saw the same expired claim cannot both take it over."""
    backend, store, clock, sent = setup
    ids = ["c0", "c1", "c2"]
    backend.outbox.publish([Event("t", i, id=event_id) for i, event_id in enumerate(ids)])
    _claim(store, clock, ids)
    clock.advance(LEASE_MS / 1000 + 1)
    now = _now(clock)
    seen = [store.get(event_id, now) for event_id in ids]  # both B and C see A's expired claim
    by_b = store.claim_many(seen, [uuid.uuid4().hex for _ in ids], now + LEASE_MS, now)
    assert len(by_b) == 3
    sent.clear()
    by_c = store.claim_many(seen, [uuid.uuid4().hex for _ in ids], now + LEASE_MS, now)
    assert sent["BatchExecuteStatement"] >= 1, sent
    assert by_c == [], "B holds them"
    for record in by_b:
        got = backend.outbox.get(record.id)
        assert got is not None and got.lease_token == record.lease_token
