"""Batched claims, outcomes and lease extensions, and ordered groups, at the store level on
Redis (one primary and a 3-primary cluster) and MongoDB (mongomock): round trips per batch, racing
batches, lost responses, and the ordered-group gate (places, the run rule, postponing, the gate
moving on outcomes, a head's retry time, MongoDB's hole repair)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.outbox import ORDERED_RECHECK_MS, Event, EventRecord, EventStatus, Outcome

NOW = 1_700_000_000_000
LEASE = 30_000
KINDS = ["redis", "redis_cluster", "mongo"]


@dataclass
class Env:
    """One store in a fresh namespace, with a way to count its round trips."""

    kind: str
    backend: Any
    store: Any
    sent: list[str]

    def gate(self, group: str) -> dict[str, int]:
        """The ordered group's gate as stored (numbers as int)."""
        if self.kind == "mongo":
            doc = self.store._coll.collection.find_one(self.store._gate_key(group)) or {}
            fields = {k: v for k, v in doc.items() if k not in ("_id", "pk", "sk")}
        else:
            raw = self.store._conn.client.hgetall(self.store._gate(group))
            fields = {_text(k): _text(v) for k, v in raw.items()}
        return {k: int(v) for k, v in fields.items()}

    def counting(self) -> list[str]:
        self.sent.clear()
        return self.sent


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _CountingCollection:
    """Counts every call of a collection method (one call is one request to the server)."""

    def __init__(self, collection: Any, sent: list[str]) -> None:
        self._collection = collection
        self._sent = sent

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._collection, name)
        if not callable(attr):
            return attr
        sent = self._sent

        def call(*args: Any, **kwargs: Any) -> Any:
            sent.append(name)
            return attr(*args, **kwargs)

        return call


def _count_redis(client: Any, sent: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = client.execute_command

    def execute_command(*args: Any, **kwargs: Any) -> Any:
        sent.append(_text(args[0]))
        return real(*args, **kwargs)

    # an instance attribute shadows the method (scripts call it); undone after the test
    monkeypatch.setattr(client, "execute_command", execute_command)


@pytest.fixture(params=KINDS, ids=["single_redis", "cluster_redis", "mongomock"])
def env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    kind = request.param
    backend = request.getfixturevalue(f"{kind}_backend_factory")(clock=ManualClock(NOW / 1000))
    store = backend.outbox._store
    sent: list[str] = []
    if kind == "mongo":
        store._coll.collection = _CountingCollection(store._coll.collection, sent)
    else:
        _count_redis(store._conn.client, sent, monkeypatch)
    yield Env("mongo" if kind == "mongo" else "redis", backend, store, sent)


def events(n: int, *, group: str | None = None, ordered: bool = False) -> list[Event]:
    return [
        Event(
            "t",
            {"n": i},
            id=f"e{i:03d}-{uuid.uuid4().hex[:6]}",
            occurred_at=(NOW - 1000 + i) / 1000,
            group=group,
            ordered=ordered,
        )
        for i in range(n)
    ]


def due(store: Any, now: int = NOW, limit: int = 100) -> list[EventRecord]:
    records, _ = store.query_page(EventStatus.PENDING, 0, due_before_ms=now, limit=limit)
    return records


def tokens(n: int) -> list[str]:
    return [uuid.uuid4().hex for _ in range(n)]


def warm_up(env: Env) -> None:
    """Load the scripts (a first EVALSHA of a script the server lacks costs a SCRIPT LOAD)."""
    [e] = events(1)
    env.store.publish([e], NOW)
    [seen] = [r for r in due(env.store) if r.id == e.id]
    [claimed] = env.store.claim_many([seen], tokens(1), NOW + LEASE, NOW)
    env.store.extend_many([claimed], NOW + LEASE, NOW)
    assert env.store.finish_many([Outcome(claimed, "completed")], NOW, 60_000) == [True]


# -- batches ----------------------------------------------------------------------------------


def test_a_batch_claim_of_n_events_returns_n_records_in_one_round_trip(env: Env) -> None:
    warm_up(env)
    published = events(10)
    env.store.publish(published, NOW)
    seen = due(env.store)
    assert len(seen) == 10
    mine = tokens(10)
    sent = env.counting()
    claimed = env.store.claim_many(seen, mine, NOW + LEASE, NOW)
    # Redis: one script; MongoDB: one bulk_write, one find
    assert len(sent) == (2 if env.kind == "mongo" else 1), sent
    assert [r.id for r in claimed] == [r.id for r in seen]
    for record, token in zip(claimed, mine, strict=True):
        assert record.status is EventStatus.IN_FLIGHT
        assert record.lease_token == token
        assert record.attempts == 1 and record.event.attempt == 1
        assert record.due_at_ms == NOW + LEASE
    assert due(env.store) == []
    in_flight, _ = env.store.query_page(
        EventStatus.IN_FLIGHT, 0, due_before_ms=None, limit=100, cursor=None
    )
    assert sorted(r.id for r in in_flight) == sorted(r.id for r in seen)


def test_a_batch_of_outcomes_is_one_round_trip_and_each_lands(env: Env) -> None:
    warm_up(env)
    env.store.publish(events(4), NOW)
    claimed = env.store.claim_many(due(env.store), tokens(4), NOW + LEASE, NOW)
    outcomes = [
        Outcome(claimed[0], "completed"),
        Outcome(claimed[1], "pending", due_ms=NOW + 5000, error="boom"),
        Outcome(claimed[2], "pending", due_ms=NOW, count_attempt=False),
        Outcome(claimed[3], "failed", error="gave up"),
    ]
    sent = env.counting()
    assert env.store.finish_many(outcomes, NOW + 10, 60_000) == [True] * 4
    assert len(sent) == 1, sent
    got = [env.store.get(r.id, NOW + 10) for r in claimed]
    assert got[0] is not None and got[0].status is EventStatus.COMPLETED
    assert got[1] is not None and got[1].status is EventStatus.PENDING
    assert (got[1].due_at_ms, got[1].attempts, got[1].last_error) == (NOW + 5000, 1, "boom")
    assert got[2] is not None and (got[2].status, got[2].attempts) == (EventStatus.PENDING, 0)
    assert got[3] is not None and (got[3].status, got[3].last_error) == (
        EventStatus.FAILED,
        "gave up",
    )
    assert all(r.lease_token is None for r in got[1:] if r is not None)
    # the same outcomes again (no lost response): already written by this very claim: True
    assert env.store.finish_many(outcomes, NOW + 20, 60_000) == [True] * 4


def test_an_outcome_whose_lease_was_taken_over_is_refused(env: Env) -> None:
    env.store.publish(events(2), NOW)
    first = env.store.claim_many(due(env.store), tokens(2), NOW + LEASE, NOW)
    later = NOW + LEASE + 1
    zombies, _ = env.store.query_page(
        EventStatus.IN_FLIGHT, 0, due_before_ms=later, limit=10, cursor=None
    )
    second = env.store.claim_many(zombies, tokens(2), later + LEASE, later)
    assert len(second) == 2 and all(r.attempts == 2 for r in second)
    stale = [Outcome(r, "completed") for r in first]
    assert env.store.finish_many(stale, later, None) == [False, False]
    assert env.store.extend_many(first, later + 2 * LEASE, later) == [False, False]
    assert env.store.extend_many(second, later + 2 * LEASE, later) == [True, True]
    assert env.store.finish_many([Outcome(r, "completed") for r in second], later, None) == [
        True,
        True,
    ]
    assert all(env.store.get(r.id, later) is None for r in second)


def test_extend_many_moves_each_held_lease_in_one_round_trip(env: Env) -> None:
    warm_up(env)
    env.store.publish(events(3), NOW)
    claimed = env.store.claim_many(due(env.store), tokens(3), NOW + LEASE, NOW)
    sent = env.counting()
    assert env.store.extend_many(claimed, NOW + 3 * LEASE, NOW + 100) == [True] * 3
    assert len(sent) == 1, sent
    for record in claimed:
        got = env.store.get(record.id, NOW)
        assert got is not None and got.due_at_ms == NOW + 3 * LEASE
    # the index moved with it: not a zombie at the old lease end
    zombies, _ = env.store.query_page(
        EventStatus.IN_FLIGHT, 0, due_before_ms=NOW + LEASE + 1, limit=10, cursor=None
    )
    assert zombies == []


def test_refresh_shards_is_one_and_costs_no_request(env: Env) -> None:
    sent = env.counting()
    assert env.store.refresh_shards() == 1 and env.store.shards == 1
    assert sent == []


def test_racing_batch_claims_give_each_event_to_exactly_one(env: Env) -> None:
    env.store.publish(events(30), NOW)
    seen = due(env.store)
    results: list[list[EventRecord]] = [[], []]
    barrier = threading.Barrier(2)

    def racer(i: int) -> None:
        barrier.wait()
        # in a different order each, so the two batches interleave
        mine = list(reversed(seen)) if i else list(seen)
        results[i] = env.store.claim_many(mine, tokens(len(mine)), NOW + LEASE, NOW)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [r.id for batch in results for r in batch]
    assert sorted(ids) == sorted(r.id for r in seen)  # each exactly once
    for batch in results:
        for record in batch:
            stored = env.store.get(record.id, NOW)
            assert stored is not None and stored.lease_token == record.lease_token


def test_a_claim_of_events_no_longer_as_seen_takes_nothing(env: Env) -> None:
    env.store.publish(events(3), NOW)
    seen = due(env.store)
    assert len(env.store.claim_many(seen, tokens(3), NOW + LEASE, NOW)) == 3
    assert env.store.claim_many(seen, tokens(3), NOW + LEASE, NOW) == []
    # not due yet: not claimed
    [late] = events(1)
    env.store.publish([late], NOW)
    [record] = due(env.store)
    assert env.store.claim_many([record], tokens(1), NOW + LEASE, record.due_at_ms - 1) == []


def test_a_batch_claim_on_the_cluster_and_its_outcomes(redis_cluster_backend_factory) -> None:
    store = redis_cluster_backend_factory().outbox._store
    store.publish(events(5, group="g", ordered=True) + events(5), NOW)
    seen = due(store)
    claimed = store.claim_many(seen, tokens(10), NOW + LEASE, NOW)
    assert len(claimed) == 10
    assert store.finish_many([Outcome(r, "completed") for r in claimed], NOW, None) == [True] * 10
    assert due(store) == [] and all(store.get(r.id, NOW) is None for r in claimed)


# -- lost responses -----------------------------------------------------------------------------

LOSSY = pytest.mark.parametrize(
    "lossy",
    ["redis", "redis_cluster", "mongo"],
    ids=["single_redis", "cluster_redis", "mongomock"],
    indirect=True,
)
WRITE = {"redis": "EVALSHA", "mongo": "bulk_write"}


@LOSSY
def test_a_batch_claim_whose_response_was_lost_returns_its_claims(lossy) -> None:
    store = lossy.backend().outbox._store
    store.publish(events(4, group="g", ordered=True) + events(3), NOW)
    seen = due(store)
    lossy.lose_next(operation=WRITE[lossy.kind])
    claimed = store.claim_many(seen, tokens(7), NOW + LEASE, NOW)
    assert lossy.lost == 1
    assert sorted(r.id for r in claimed) == sorted(r.id for r in seen)
    assert all(r.attempts == 1 for r in claimed)


@LOSSY
@pytest.mark.parametrize("retention", [60_000, None])
def test_a_batch_of_outcomes_whose_response_was_lost_is_recognised(lossy, retention) -> None:
    store = lossy.backend().outbox._store
    store.publish(events(3, group="g", ordered=True) + events(3), NOW)
    claimed = store.claim_many(due(store), tokens(6), NOW + LEASE, NOW)
    outcomes = [Outcome(r, "completed") for r in claimed[:4]] + [
        Outcome(claimed[4], "pending", due_ms=NOW + 1000, error="e"),
        Outcome(claimed[5], "failed", error="x"),
    ]
    lossy.lose_next(operation=WRITE[lossy.kind])
    assert store.finish_many(outcomes, NOW, retention) == [True] * 6
    assert lossy.lost == 1
    pending = store.get(claimed[4].id, NOW)
    assert pending is not None and pending.attempts == 1  # written once


@LOSSY
def test_a_single_claim_whose_response_was_lost_is_ours(lossy) -> None:
    store = lossy.backend().outbox._store
    store.publish(events(1), NOW)
    [seen] = due(store)
    token = uuid.uuid4().hex
    lossy.lose_next(operation={"redis": "EVALSHA", "mongo": "find_one_and_update"}[lossy.kind])
    claimed = store.claim(seen, token, NOW + LEASE, NOW)
    assert lossy.lost == 1
    assert claimed is not None and claimed.lease_token == token and claimed.attempts == 1


@LOSSY
def test_an_ordered_publish_whose_response_was_lost_keeps_its_group_going(lossy) -> None:
    backend = lossy.backend(clock=ManualClock(NOW / 1000))
    store = backend.outbox._store
    [event] = events(1, group="g", ordered=True)
    lossy.lose_next(operation={"redis": "EVALSHA", "mongo": "find_one_and_update"}[lossy.kind])
    assert backend.outbox.publish(event) == [event.id]  # the retry's clash is its own event
    assert lossy.lost == 1
    [record] = due(store)
    if lossy.kind == "redis":  # one script: the retry finds the event and takes no place
        assert record.seq == 1
        assert [r.seq for r in store.claim_many([record], tokens(1), NOW + LEASE, NOW)] == [1]
        return
    # MongoDB: the place-taking $inc ran twice; place 1 stays empty and is skipped after 60 s
    assert record.seq == 2
    assert store.claim_many([record], tokens(1), NOW + LEASE, NOW) == []
    later = NOW + 60_000
    [record] = due(store, later)
    assert [r.seq for r in store.claim_many([record], tokens(1), later + LEASE, later)] == [2]


# -- ordered groups -----------------------------------------------------------------------------


def _by_seq(store: Any, now: int = NOW) -> list[EventRecord]:
    return sorted(due(store, now), key=lambda r: r.seq or 0)


def test_ordered_events_take_places_and_a_republish_takes_none(env: Env) -> None:
    first = events(3, group="g", ordered=True)
    assert env.store.publish(first, NOW) == {}
    assert [env.store.get(e.id, NOW).seq for e in first] == [1, 2, 3]
    assert env.gate("g")["published"] == 3
    clashes = env.store.publish(first[1:], NOW)  # the same events again
    assert set(clashes) == {first[1].id, first[2].id}
    assert env.gate("g")["published"] == 3
    [more] = events(1, group="g", ordered=True)
    [other] = events(1, group="h", ordered=True)
    [plain] = events(1, group="g")
    env.store.publish([more, other, plain], NOW)
    assert env.store.get(more.id, NOW).seq == 4
    assert env.store.get(other.id, NOW).seq == 1
    assert env.store.get(plain.id, NOW).seq is None
    assert env.gate("g")["published"] == 4 and env.gate("h")["published"] == 1


def test_round_trips_of_an_ordered_batch(env: Env) -> None:
    warm_up(env)
    env.store.publish(events(3, group="g", ordered=True) + events(3, group="h", ordered=True), NOW)
    seen = due(env.store)
    sent = env.counting()
    claimed = env.store.claim_many(seen, tokens(6), NOW + LEASE, NOW)
    assert len(claimed) == 6
    assert len(sent) == (2 if env.kind == "mongo" else 1), sent
    sent = env.counting()
    assert (
        env.store.finish_many([Outcome(r, "completed") for r in claimed], NOW, 60_000) == [True] * 6
    )
    # MongoDB: the events' bulk_write, then the gates' (written only for outcomes that landed)
    assert len(sent) == (2 if env.kind == "mongo" else 1), sent
    assert env.gate("g")["next_seq"] == 4 and env.gate("h")["next_seq"] == 4
    # a run held back costs MongoDB one more request: its claims given back, postponed
    env.store.publish(events(2, group="g", ordered=True), NOW)
    four, five = _by_seq(env.store)
    assert len(env.store.claim_many([four], tokens(1), NOW + LEASE, NOW)) == 1
    sent = env.counting()
    assert env.store.claim_many([five], tokens(1), NOW + LEASE, NOW) == []
    assert len(sent) == (3 if env.kind == "mongo" else 1), sent


def test_a_run_from_the_head_is_claimed_and_events_behind_a_gap_are_postponed(env: Env) -> None:
    env.store.publish(events(4, group="g", ordered=True), NOW)
    one, two, three, four = _by_seq(env.store)
    claimed = env.store.claim_many([one, two, four], tokens(3), NOW + LEASE, NOW)
    assert [r.seq for r in claimed] == [1, 2]
    postponed = env.store.get(four.id, NOW)
    assert postponed is not None and postponed.status is EventStatus.PENDING
    assert postponed.due_at_ms == NOW + ORDERED_RECHECK_MS
    assert postponed.attempts == 0 and postponed.lease_token is None
    # not the head: blocked, postponed, not returned
    assert env.store.claim_many([three], tokens(1), NOW + LEASE, NOW) == []
    assert env.store.get(three.id, NOW).due_at_ms == NOW + ORDERED_RECHECK_MS
    assert due(env.store) == []


def test_completing_and_failing_move_the_gate_and_let_the_next_go(env: Env) -> None:
    env.store.publish(events(3, group="g", ordered=True), NOW)
    one, two, three = _by_seq(env.store)
    [c1] = env.store.claim_many([one], tokens(1), NOW + LEASE, NOW)
    assert env.store.claim_many([two], tokens(1), NOW + LEASE, NOW) == []  # postponed
    assert env.store.finish_many([Outcome(c1, "completed")], NOW, 60_000) == [True]
    assert env.gate("g")["next_seq"] == 2
    later = NOW + ORDERED_RECHECK_MS
    [two] = [r for r in due(env.store, later) if r.seq == 2]
    [c2] = env.store.claim_many([two], tokens(1), later + LEASE, later)
    assert env.store.finish_many([Outcome(c2, "failed", error="x")], later, 60_000) == [True]
    assert env.gate("g")["next_seq"] == 3
    [three] = due(env.store, later)
    assert [r.seq for r in env.store.claim_many([three], tokens(1), later + LEASE, later)] == [3]


def test_a_run_finished_in_one_batch_moves_the_gate_past_it(env: Env) -> None:
    env.store.publish(events(4, group="g", ordered=True), NOW)
    seen = _by_seq(env.store)
    claimed = env.store.claim_many(seen[:3], tokens(3), NOW + LEASE, NOW)
    # outcomes out of place order: the store orders them
    outcomes = [Outcome(r, "completed") for r in reversed(claimed)]
    assert env.store.finish_many(outcomes, NOW, None) == [True] * 3
    assert env.gate("g")["next_seq"] == 4
    assert [r.seq for r in env.store.claim_many(seen[3:], tokens(1), NOW + LEASE, NOW)] == [4]


def test_a_run_stops_where_another_worker_holds_a_place(env: Env) -> None:
    env.store.publish(events(3, group="g", ordered=True), NOW)
    seen = _by_seq(env.store)
    [held] = env.store.claim_many(seen[:1], tokens(1), NOW + LEASE, NOW)
    # a second worker with a stale view of the head: 2 and 3 must wait behind 1
    assert env.store.claim_many(seen, tokens(3), NOW + LEASE, NOW) == []
    for record in seen[1:]:
        got = env.store.get(record.id, NOW)
        assert got is not None and got.status is EventStatus.PENDING
        assert got.due_at_ms == NOW + ORDERED_RECHECK_MS
    assert held.seq == 1


def test_a_retried_head_holds_its_group_until_its_retry_time(env: Env) -> None:
    env.store.publish(events(2, group="g", ordered=True), NOW)
    one, two = _by_seq(env.store)
    [c1] = env.store.claim_many([one], tokens(1), NOW + LEASE, NOW)
    retry_at = NOW + 10 * ORDERED_RECHECK_MS
    assert env.store.finish_many([Outcome(c1, "pending", due_ms=retry_at)], NOW, None) == [True]
    assert env.gate("g")["retry_due_ms"] == retry_at and env.gate("g").get("next_seq", 1) == 1
    assert env.store.claim_many([two], tokens(1), NOW + LEASE, NOW) == []
    assert env.store.get(two.id, NOW).due_at_ms == retry_at  # not due before its head
    again, _ = _by_seq(env.store, retry_at)  # the head first, its follower due with it
    assert again.seq == 1
    [c1] = env.store.claim_many([again], tokens(1), retry_at + LEASE, retry_at)
    assert env.store.finish_many([Outcome(c1, "completed")], retry_at, None) == [True]
    gate = env.gate("g")
    assert gate["next_seq"] == 2 and "retry_due_ms" not in gate


def test_a_released_head_leaves_the_gate_as_it_was(env: Env) -> None:
    env.store.publish(events(2, group="g", ordered=True), NOW)
    one, _ = _by_seq(env.store)
    [c1] = env.store.claim_many([one], tokens(1), NOW + LEASE, NOW)
    before = env.gate("g")
    released = Outcome(c1, "pending", due_ms=NOW, count_attempt=False)
    assert env.store.finish_many([released], NOW, None) == [True]
    assert env.gate("g") == before
    [again, _] = _by_seq(env.store)
    assert again.seq == 1 and again.attempts == 0


def test_a_follower_finished_before_its_head_never_moves_the_gate_back(env: Env) -> None:
    env.store.publish(events(3, group="g", ordered=True), NOW)
    seen = _by_seq(env.store)
    one, two = env.store.claim_many(seen[:2], tokens(2), NOW + LEASE, NOW)
    assert env.store.finish_many([Outcome(two, "completed")], NOW, None) == [True]
    assert env.gate("g")["next_seq"] == 3
    assert env.store.finish_many([Outcome(one, "completed")], NOW, None) == [True]
    assert env.gate("g")["next_seq"] == 3  # max, not 2


def test_a_failed_event_retried_after_its_group_moved_on_is_claimable(env: Env) -> None:
    env.store.publish(events(2, group="g", ordered=True), NOW)
    one, _ = _by_seq(env.store)
    [c1] = env.store.claim_many([one], tokens(1), NOW + LEASE, NOW)
    env.store.finish_many([Outcome(c1, "failed", error="x")], NOW, None)
    assert env.store.retry_failed(one.id, NOW, uuid.uuid4().hex) == "retried"
    [again] = [r for r in due(env.store) if r.id == one.id]
    assert [r.seq for r in env.store.claim_many([again], tokens(1), NOW + LEASE, NOW)] == [1]


def test_one_event_claims_keep_the_group_order(env: Env) -> None:
    env.store.publish(events(2, group="g", ordered=True), NOW)
    one, two = _by_seq(env.store)
    assert env.store.claim(two, uuid.uuid4().hex, NOW + LEASE, NOW) is None  # behind its head
    claimed = env.store.claim(one, uuid.uuid4().hex, NOW + LEASE, NOW)
    assert claimed is not None and claimed.seq == 1
    assert env.store.extend_many([claimed], NOW + 2 * LEASE, NOW) == [True]
    assert env.store.finish_many([Outcome(claimed, "completed")], NOW, 60_000) == [True]
    assert env.gate("g")["next_seq"] == 2
    later = NOW + ORDERED_RECHECK_MS
    [two] = due(env.store, later)
    claimed = env.store.claim(two, uuid.uuid4().hex, later + LEASE, later)
    assert claimed is not None
    retry = Outcome(claimed, "pending", due_ms=later + 5000, error="e")
    assert env.store.finish_many([retry], later, None) == [True]
    assert env.gate("g")["retry_due_ms"] == later + 5000


# -- MongoDB: a place taken but never written (the publisher died in between) --------------------


@pytest.fixture()
def mongo_store(mongo_backend_factory: Any) -> Any:
    return mongo_backend_factory().outbox._store


def _hole(store: Any, group: str) -> None:
    """A publisher that took place 1 of ``group`` and died before inserting its event."""
    store._coll.collection.update_one(
        store._gate_key(group),
        {"$inc": {"published": 1}, "$set": {"published_ms": NOW, "next_seq": 1}},
        upsert=True,
    )


def _next_seq(store: Any, group: str) -> int:
    return int(store._coll.collection.find_one(store._gate_key(group))["next_seq"])


def test_mongo_waits_for_a_publisher_that_may_still_be_writing(mongo_store) -> None:
    _hole(mongo_store, "g")
    mongo_store.publish(events(1, group="g", ordered=True), NOW)
    [two] = due(mongo_store)
    assert two.seq == 2
    soon = NOW + 59_000
    assert mongo_store.claim_many([two], tokens(1), soon + LEASE, soon) == []
    assert _next_seq(mongo_store, "g") == 1
    got = mongo_store.get(two.id, soon)
    assert got.status is EventStatus.PENDING and got.attempts == 0  # the claim was given back
    assert got.due_at_ms == soon + ORDERED_RECHECK_MS


def test_mongo_skips_a_place_left_empty_by_a_publisher_that_died(mongo_store) -> None:
    _hole(mongo_store, "g")
    mongo_store.publish(events(2, group="g", ordered=True), NOW)
    seen = due(mongo_store)
    later = NOW + 60_000  # place 2 was published 60 s ago, so place 1 was taken before
    sent: list[str] = []
    mongo_store._coll.collection = _CountingCollection(mongo_store._coll.collection, sent)
    claimed = mongo_store.claim_many(seen, tokens(2), later + LEASE, later)
    # bulk_write, find, then the places before the run looked up and the gate moved
    assert sent == ["bulk_write", "find", "find", "find_one_and_update"]
    assert [r.seq for r in claimed] == [2, 3]
    assert _next_seq(mongo_store, "g") == 2


def test_mongo_skips_every_empty_place_before_the_run_in_one_claim(mongo_store) -> None:
    """Places 1-3 empty (lost place-taking answers take places twice): one claim after the wait
    moves the gate past all of them; one place a claim took the group a claim round each, and
    the fault model's drain ran out of rounds."""
    for _ in range(3):
        _hole(mongo_store, "g")
    mongo_store.publish(events(2, group="g", ordered=True), NOW)
    seen = due(mongo_store)
    assert [r.seq for r in seen] == [4, 5]
    later = NOW + 60_000
    claimed = mongo_store.claim_many(seen, tokens(2), later + LEASE, later)
    assert [r.seq for r in claimed] == [4, 5]
    assert _next_seq(mongo_store, "g") == 4


def test_mongo_moves_past_a_finished_place_whose_gate_update_was_lost(mongo_store) -> None:
    mongo_store.publish(events(2, group="g", ordered=True), NOW)
    one, two = _by_seq(mongo_store)
    [c1] = mongo_store.claim_many([one], tokens(1), NOW + LEASE, NOW)
    # the worker died between writing the outcome and moving the gate
    mongo_store._move_gates = lambda written: None
    assert mongo_store.finish_many([Outcome(c1, "completed")], NOW, 60_000) == [True]
    del mongo_store._move_gates
    assert _next_seq(mongo_store, "g") == 1
    assert mongo_store.claim_many([two], tokens(1), NOW + LEASE, NOW) == []
    later = NOW + 60_000
    [two] = due(mongo_store, later)
    assert [r.seq for r in mongo_store.claim_many([two], tokens(1), later + LEASE, later)] == [2]


def test_mongo_an_ordered_publish_undone_by_a_clash_leaves_a_place_that_is_skipped(
    mongo_store,
) -> None:
    [taken] = events(1)
    mongo_store.publish([taken], NOW)
    first = events(1, group="g", ordered=True)
    # a racing publisher got `taken` in after our clash check: our insert is undone
    real = mongo_store._clashes
    calls = []

    def clashes_after_the_race(evs: Any, now_ms: int) -> Any:
        calls.append(1)
        return {} if len(calls) == 1 else real(evs, now_ms)

    mongo_store._clashes = clashes_after_the_race
    assert set(mongo_store.publish([*first, taken], NOW)) == {taken.id}
    del mongo_store._clashes
    assert mongo_store.get(first[0].id, NOW) is None
    assert mongo_store._coll.collection.find_one(mongo_store._gate_key("g"))["published"] == 1
    assert mongo_store.publish(first, NOW) == {}  # published again: place 2, behind the hole
    [record] = [r for r in due(mongo_store) if r.id == first[0].id]
    assert record.seq == 2
    assert mongo_store.claim_many([record], tokens(1), NOW + LEASE, NOW) == []
    later = NOW + 60_000
    [record] = [r for r in due(mongo_store, later) if r.id == first[0].id]
    assert [r.seq for r in mongo_store.claim_many([record], tokens(1), later + LEASE, later)] == [2]
