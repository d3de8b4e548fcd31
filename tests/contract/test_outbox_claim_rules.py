"""The outbox store's claim and finish rules, each on every backend and through both claim paths.

A claim is made from a read (a poll's page, a stream record's image): it applies only while the
event is still as that read saw it and due, and every write after it only while its claim holds
the event. Each test below breaks one clause by hand: a worker reads, something else writes the
event, and the write made from the old read must be refused. ``path`` is how the claim travels:
``claim`` (one event; a worker with ``batch_claim=False``) or ``claim_many`` (a batch; here the
stale read travels with a fresh event of its own, so that a store that batches does so). The
last two tests lose the answer of a claim's or an outcome's own request (tests/lossy.py: every
backend but moto, whose answers cannot be lost on the wire) and check the write recognises
itself.

tests/contract/test_store_rules.py lists these rules and checks each runs on every backend and
path; tests/mutations/guards.d/every-backend.toml breaks the clauses.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from dynacoord._clock import ManualClock
from dynacoord.outbox import Event, EventRecord, EventStatus, Outcome
from tests.outbox_helpers import drain

#: the two ways a claim reaches a store
PATHS = ("claim", "claim_many")
LEASE_MS = 30_000


class _Store:
    """An outbox's store, driven by hand on a manual clock."""

    def __init__(self, outbox: Any, clock: ManualClock) -> None:
        self.outbox = outbox
        self.store = outbox._store
        self.clock = clock

    def now(self) -> int:
        return int(self.clock.time() * 1000)

    def read(self, event_id: str) -> EventRecord:
        record = self.store.get(event_id, self.now())
        assert record is not None, event_id
        return record

    def claim(
        self,
        path: str,
        seen: EventRecord,
        lease_ms: int = LEASE_MS,
        before: Callable[[], object] | None = None,
    ) -> EventRecord | None:
        """Claim ``seen`` through ``path``; None when refused. Through ``claim_many`` a fresh
        unordered event goes with it, and must be claimed whatever becomes of ``seen``.
        ``before`` runs just before the claim's request (after the companion's publish)."""
        now = self.now()
        token = uuid.uuid4().hex
        if path == "claim":
            if before is not None:
                before()
            return self.store.claim(seen, token, now + lease_ms, now)
        companion_id = f"fresh-{uuid.uuid4().hex[:8]}"
        self.outbox.publish(Event("t", {}, id=companion_id))
        companion = self.read(companion_id)
        if before is not None:
            before()
        got = self.store.claim_many(
            [seen, companion], [token, uuid.uuid4().hex], now + lease_ms, now
        )
        by_id = {record.id: record for record in got}
        assert companion_id in by_id, "the fresh event of the batch is claimed"
        return by_id.get(seen.id)


@pytest.fixture(params=PATHS)
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _stores(make_backend: Any) -> _Store:
    clock = ManualClock()
    return _Store(make_backend(clock=clock).outbox, clock)


def test_a_claim_from_a_read_before_another_claim_is_refused(make_backend, path):
    """Status and lease token: two workers read one pending event; the first claim wins."""
    s = _stores(make_backend)
    s.outbox.publish(Event("t", {}, id="e1"))
    seen = s.read("e1")
    first = s.claim(path, seen)
    assert first is not None and first.lease_token is not None
    assert s.claim(path, seen) is None, "claimed again from a read made before the first claim"
    assert s.read("e1").lease_token == first.lease_token


def test_a_claim_from_a_read_before_a_renewal_is_refused(make_backend, path):
    """Due: worker B reads an in-flight event whose lease ran out; the holder's lease keeper
    renews it; B's claim from its read is refused (else two workers hold the event, each told
    it holds it alone)."""
    s = _stores(make_backend)
    s.outbox.publish(Event("t", {}, id="e1"))
    held = s.claim(path, s.read("e1"), lease_ms=1_000)
    assert held is not None
    s.clock.advance(2)
    stale = s.read("e1")
    assert stale.status is EventStatus.IN_FLIGHT and stale.due_at_ms < s.now(), "lease ran out"
    assert s.store.extend_many([held], s.now() + LEASE_MS, s.now()) == [True]
    assert s.claim(path, stale) is None, "claimed over a lease renewed after the read"
    assert s.read("e1").lease_token == held.lease_token
    assert s.store.finish_many([Outcome(held, "completed")], s.now(), 60_000) == [True]


def test_a_claim_from_a_read_before_a_retry_is_refused(make_backend, path):
    """Attempts: worker B reads a pending event; worker A claims it, its handler fails, and A
    puts it back with a backoff; once that backoff is over, B's claim from its old read (of an
    event that had not yet been tried) is refused. A fresh read claims it."""
    s = _stores(make_backend)
    s.outbox.publish(Event("t", {}, id="e1"))
    stale = s.read("e1")
    held = s.claim(path, s.read("e1"))
    assert held is not None and held.attempts == 1
    retry = Outcome(held, "pending", due_ms=s.now() + 1_000, error="downstream down")
    assert s.store.finish_many([retry], s.now(), None) == [True]
    s.clock.advance(2)
    back = s.read("e1")
    assert (back.status, back.lease_token, back.attempts) == (EventStatus.PENDING, None, 1)
    assert s.claim(path, stale) is None, "claimed from a read made before the attempt"
    again = s.claim(path, s.read("e1"))
    assert again is not None and again.attempts == 2


def test_a_claim_from_a_read_before_a_group_retry_is_refused(make_backend, path):
    """Place: e1 fails and ``retry(group=...)`` puts it behind e2 and e3 of its group; a claim
    from a read of e1 at its old place (a poll's page, a replayed stream image) is refused, and
    the group is delivered e2, e3, e1."""
    s = _stores(make_backend)
    s.outbox.publish([Event("t", {}, id=f"e{n}", group="G", ordered=True) for n in (1, 2, 3)])
    stale = s.read("e1")
    assert stale.seq == 1

    def refuse(event: Event) -> None:
        raise RuntimeError("down")

    assert s.outbox.worker(refuse, batch_size=1, max_attempts=1, heartbeat=False).run_once() == 1
    assert s.read("e1").status is EventStatus.FAILED
    assert s.outbox.retry(group="G") == 1
    assert s.read("e1").seq == 4
    assert s.claim(path, stale) is None, "claimed at the place it had before the group retry"
    order: list[str] = []
    worker = s.outbox.worker(
        lambda e: order.append(e.id) if e.group == "G" else None,
        batch_claim=path == "claim_many",
        heartbeat=False,
    )
    drain(worker, clock=s.clock)
    assert order == ["e2", "e3", "e1"]


def test_a_claim_behind_its_groups_head_is_refused(make_backend, path):
    """Gate: e2 is not claimed while e1, its group's head, is in flight; once e1 is completed
    it is."""
    s = _stores(make_backend)
    s.outbox.publish([Event("t", {}, id=f"e{n}", group="G", ordered=True) for n in (1, 2)])
    head = s.claim(path, s.read("e1"))
    assert head is not None
    assert s.claim(path, s.read("e2")) is None, "claimed while its head is in flight"
    assert s.store.finish_many([Outcome(head, "completed")], s.now(), 60_000) == [True]
    s.clock.advance(2)  # past the time a refused place keeps out of the due queue
    assert s.claim(path, s.read("e2")) is not None


@pytest.mark.parametrize("kind", ["completed", "pending", "failed"])
def test_an_outcome_or_renewal_after_a_takeover_is_refused(make_backend, path, kind):
    """Lease: A's lease runs out and B claims the event; A's outcome and A's renewal are
    refused, and B's outcome is written."""
    s = _stores(make_backend)
    s.outbox.publish(Event("t", {}, id="e1"))
    a = s.claim(path, s.read("e1"), lease_ms=1_000)
    assert a is not None
    s.clock.advance(2)
    b = s.claim(path, s.read("e1"))
    assert b is not None and b.lease_token != a.lease_token
    now = s.now()
    outcome = Outcome(a, kind, due_ms=now, error="late")  # type: ignore[arg-type]
    assert s.store.finish_many([outcome], now, 60_000) == [False]
    assert s.store.extend_many([a], now + LEASE_MS, now) == [False]
    assert s.read("e1").lease_token == b.lease_token
    assert s.store.finish_many([Outcome(b, "completed")], now, 60_000) == [True]


def _claim_request(lossy: Any, outbox: Any, path: str) -> str:
    """The name of the request a claim of ``path`` travels in, as the lossy client knows it."""
    if lossy.kind == "redis":
        return "EVALSHA"
    if lossy.kind == "mongo":
        return "find_one_and_update" if path == "claim" else "bulk_write"
    if path == "claim":
        return "UpdateItem"
    # a batch of two: PartiQL statements where the endpoint runs them, else a transaction
    return (
        "BatchExecuteStatement" if outbox._store._statements_supported() else "TransactWriteItems"
    )


def test_a_claim_whose_answer_was_lost_is_its_own(lossy, path):
    """Recognition: the claim applies, its answer is lost and the client sends it again; the
    refusal it meets shows its own lease token, so the claim is reported made, with the
    attempt counted once (not refused, which would leave the event held by no one until the
    lease ends)."""
    clock = ManualClock()
    s = _Store(lossy.backend(clock=clock).outbox, clock)
    s.outbox.publish(Event("t", {}, id="e1"))
    operation = _claim_request(lossy, s.outbox, path)
    got = s.claim(path, s.read("e1"), before=lambda: lossy.lose_next(operation=operation))
    assert lossy.lost == 1, f"no {operation} answer was lost"
    assert got is not None, "its own claim, applied, reported refused"
    stored = s.read("e1")
    assert (stored.status, stored.lease_token, stored.attempts) == (
        EventStatus.IN_FLIGHT,
        got.lease_token,
        1,
    )


@pytest.mark.parametrize("kind", ["completed", "deleted", "pending", "failed"])
def test_an_outcome_whose_answer_was_lost_is_its_own(lossy, path, kind):
    """Recognition: an outcome (one alone after ``claim``; two in one batch after
    ``claim_many``) applies, its answer is lost and the client sends it again; the refusal it
    meets shows its own token (``finished_by``; a deletion finds the event gone), so it is
    reported written, not as a lease lost (which would count the event lost and, for an
    ordered event, keep its gate where it was). ``deleted``: completed without retention."""
    clock = ManualClock()
    s = _Store(lossy.backend(clock=clock).outbox, clock)
    s.outbox.publish(Event("t", {}, id="e1"))
    seen = [s.read("e1")]
    if path == "claim_many":
        s.outbox.publish(Event("t", {}, id="e2"))
        seen.append(s.read("e2"))
    now = s.now()
    tokens = [uuid.uuid4().hex for _ in seen]
    if path == "claim":
        held = [s.store.claim(seen[0], tokens[0], now + LEASE_MS, now)]
    else:
        held = s.store.claim_many(seen, tokens, now + LEASE_MS, now)
    assert len(held) == len(seen) and all(held)
    stored_kind = "completed" if kind == "deleted" else kind
    outcomes = [
        Outcome(record, stored_kind, due_ms=now + 1_000, error="x")  # type: ignore[arg-type]
        for record in held
    ]
    lossy.lose_next()  # the next write: the outcomes' own
    written = s.store.finish_many(outcomes, now, None if kind == "deleted" else 60_000)
    assert lossy.lost == 1
    assert written == [True] * len(held), "its own outcome, applied, reported refused"
    for record in held:
        stored = s.store.get(record.id, now)
        if kind == "deleted":
            assert stored is None
        else:
            assert stored is not None and stored.status.value == kind
            assert stored.lease_token is None
