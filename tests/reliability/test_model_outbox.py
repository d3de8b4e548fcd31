"""Model-based test of the outbox against an in-memory reference model.

Events are published (and re-published: a no-op while stored), handlers succeed, fail (retried
with backoff 0 until ``max_attempts``, then ``failed``) or crash the worker mid-event (a
``BaseException``: the claim stays until its lease runs out, then any worker recovers the event
with the next attempt number, or marks it failed when that claim comes after ``max_attempts``);
``retry`` moves failed events back to pending with a fresh attempt
count; completed events are kept for ``retention``. After every step each event's status and
attempt count, and the per-status counts, must match the model. Runs on every contract backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from dynacoord import ManualClock
from dynacoord._clock import now_ms
from dynacoord.outbox import Event, EventStatus
from tests.reliability.conftest import run_model

LEASE_MS = 5000
RETENTION_MS = 20000
MAX_ATTEMPTS = 3


class CrashError(BaseException):
    """The worker process dies in the middle of a handler."""


class HandlerError(Exception):
    pass


@dataclass
class Model:
    status: EventStatus
    attempts: int
    due: int  # pending: next attempt; in_flight: lease end; completed: end of retention


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class OutboxMachine(RuleBasedStateMachine):
        events = Bundle("events")

        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.outbox = factory(clock=self.clock).outbox
            self.model: dict[str, Model] = {}
            self.failing: set[str] = set()
            self.delivered: list[tuple[str, int]] = []
            self.crash = False
            self.counts: dict[EventStatus, int] = {}

        def now(self) -> int:
            return now_ms(self.clock)

        def stored(self, event_id: str) -> Model | None:
            m = self.model.get(event_id)
            if m is None or (m.status is EventStatus.COMPLETED and self.now() >= m.due):
                return None
            return m

        def due(self) -> list[str]:
            now = self.now()
            return sorted(
                i
                for i, m in self.model.items()
                if m.status in (EventStatus.PENDING, EventStatus.IN_FLIGHT) and m.due <= now
            )

        def handler(self, event: Event) -> None:
            self.delivered.append((event.id, event.attempt))
            if self.crash:
                raise CrashError()
            if event.id in self.failing:
                raise HandlerError("the downstream said no")

        def worker(self) -> Any:
            return self.outbox.worker(
                self.handler,
                batch_size=100,
                lease=LEASE_MS / 1000,
                max_attempts=MAX_ATTEMPTS,
                backoff=0,
                max_backoff=0,
                heartbeat=False,
                retention=RETENTION_MS / 1000,
            )

        @precondition(lambda self: len(self.model) < 6)
        @rule(target=events, count=st.integers(1, 3), failing=st.booleans())
        def publish(self, count: int, failing: bool) -> Any:
            batch = [Event("t", {"n": n}) for n in range(count)]
            assert self.outbox.publish(batch) == [e.id for e in batch]
            for e in batch:
                self.model[e.id] = Model(EventStatus.PENDING, 0, self.now())
                if failing:
                    self.failing.add(e.id)
            return multiple(*batch)

        @rule(event=events)
        def republish(self, event: Event) -> None:
            assert self.outbox.publish(event) == [event.id]
            if self.stored(event.id) is None:  # completed and past retention: stored anew
                self.model[event.id] = Model(EventStatus.PENDING, 0, self.now())

        @rule(event=events, failing=st.booleans())
        def set_failing(self, event: Event, failing: bool) -> None:
            if failing:
                self.failing.add(event.id)
            else:
                self.failing.discard(event.id)

        @rule()
        def run_once(self) -> None:
            due = self.due()
            # run_once's first pass takes expired leases back, its second the due events: an
            # event recovered from a dead worker whose handler fails is due again at once
            # (backoff 0) and may run a second time in the second pass, and only such an event
            recovered = {i for i in due if self.model[i].status is EventStatus.IN_FLIGHT}
            self.delivered = []
            handled = self.worker().run_once()
            now = self.now()
            exhausted = [i for i in due if self.model[i].attempts >= MAX_ATTEMPTS]
            assert not set(exhausted) & {i for i, _ in self.delivered}
            assert handled == len(self.delivered) + len(exhausted)
            for event_id in exhausted:  # every attempt so far crashed: failed, not delivered
                m = self.model[event_id]
                m.attempts += 1
                m.status, m.due = EventStatus.FAILED, now
            assert sorted({i for i, _ in self.delivered} | set(exhausted)) == due
            seen: set[str] = set()
            for event_id, attempt in self.delivered:
                m = self.model[event_id]
                if event_id in seen:  # its second run: recovered, failed, and due again now
                    assert event_id in recovered and m.status is EventStatus.PENDING, event_id
                seen.add(event_id)
                m.attempts += 1
                assert attempt == m.attempts
                if event_id not in self.failing:
                    m.status, m.due = EventStatus.COMPLETED, now + RETENTION_MS
                elif m.attempts >= MAX_ATTEMPTS:
                    m.status, m.due = EventStatus.FAILED, now
                else:
                    m.status, m.due = EventStatus.PENDING, now

        @precondition(
            lambda self: len(self.due()) == 1 and self.model[self.due()[0]].attempts < MAX_ATTEMPTS
        )
        @rule()
        def worker_crashes_mid_event(self) -> None:
            (event_id,) = self.due()
            self.crash = True
            self.delivered = []
            try:
                with pytest.raises(CrashError):
                    self.worker().run_once()
            finally:
                self.crash = False
            m = self.model[event_id]
            m.attempts += 1
            assert self.delivered == [(event_id, m.attempts)]
            m.status, m.due = EventStatus.IN_FLIGHT, self.now() + LEASE_MS

        @rule(chosen=st.lists(events, max_size=3, unique_by=lambda e: e.id))
        def retry(self, chosen: list[Event]) -> None:
            ids = [e.id for e in chosen]
            failed = [i for i in ids if (m := self.stored(i)) and m.status is EventStatus.FAILED]
            assert self.outbox.retry(ids) == len(failed)
            for event_id in failed:
                self.model[event_id] = Model(EventStatus.PENDING, 0, self.now())

        @rule(ms=st.one_of(st.sampled_from([0, 1, LEASE_MS]), st.integers(0, 8000)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            counts = dict.fromkeys(EventStatus, 0)
            for event_id in self.model:
                m = self.stored(event_id)
                record = self.outbox.get(event_id)
                if m is None:
                    assert record is None, f"{event_id} should be gone: {record}"
                    continue
                counts[m.status] += 1
                assert record is not None, f"{event_id} should be {m}"
                assert (record.status, record.attempts) == (m.status, m.attempts)
            self.counts = counts

        @rule()
        def stats(self) -> None:
            """The per-status counts (COUNT queries over every shard) agree with the model."""
            self.store_agrees_with_model()
            stats = self.outbox.stats()
            assert (stats.pending, stats.in_flight, stats.failed) == (
                self.counts[EventStatus.PENDING],
                self.counts[EventStatus.IN_FLIGHT],
                self.counts[EventStatus.FAILED],
            )

    return OutboxMachine


def test_outbox_model(make_backend: Any) -> None:
    """The outbox state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)


def test_a_recovered_event_that_fails_may_run_again_in_the_same_pass(
    mongo_backend_factory: Any,
) -> None:
    """The history make stress found (on DynamoDB Local): a failing event's worker dies in its
    handler, the lease runs out, and one run_once recovers it (attempt 2, fails, due again at
    once with backoff 0) and runs it again in its second pass (attempt 3: failed). The model
    expected one run per due event (2 == 1)."""
    machine = make_machine(mongo_backend_factory)()
    machine.store_agrees_with_model()
    machine.publish(count=1, failing=True)
    machine.worker_crashes_mid_event()
    machine.advance(ms=LEASE_MS)
    machine.run_once()
    machine.store_agrees_with_model()
    (model,) = machine.model.values()
    assert (model.status, model.attempts) == (EventStatus.FAILED, MAX_ATTEMPTS)
    machine.teardown()
