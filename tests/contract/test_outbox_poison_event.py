"""A poison event fails alone (issue 49): an event whose handler kills its process (SIGKILL, an
OOM kill, a Lambda timeout) is claimed in a batch with others; the process dies in its handler,
writing nothing. No event may fail unless *its own* handler starts (or deaths inside it) spent
its attempts: the batchmates whose handlers never ran are delivered, and an always-raising
batchmate fails after exactly ``max_attempts`` runs of its own handler.

The process death is simulated on every contract backend: from the moment the poison handler
runs, every store call of that "process" raises a BaseException, so nothing of it reaches the
store (no outcome, no give-back), as with SIGKILL. tests/reliability/test_outbox_poison_process.py
kills real processes on DynamoDB Local and redis-server.
"""

from __future__ import annotations

import contextlib
from typing import Any

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus, WorkerOptions
from dynacoord.outbox.worker import OutboxWorker

LEASE = 3.0
MAX_ATTEMPTS = 3


class KilledError(BaseException):
    """The process was killed: nothing after this point of it runs."""


class MortalStore:
    """A process's view of the store: every call raises once the process was killed."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.killed = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.killed:
                raise KilledError()
            return attr(*args, **kwargs)

        return call


def _one_shard(make_backend: Any) -> dict[str, Any]:
    return {"shards": 1} if make_backend.kind in ("moto", "dynamodb") else {}


def _rounds(
    make_backend: Any, events: list[Event], behaviour: dict[str, str], *, batch_size: int = 25
) -> tuple[Any, dict[str, int]]:
    """Publish ``events`` and run one fresh worker "process" a round (each a lease after the
    last), each polling until it finds nothing or dies, until every event is finished. Handlers
    per event id: ``"kill"`` kills the process, ``"raise"`` raises, else it succeeds. Returns
    the outbox and the handler starts per event."""
    clock = ManualClock()
    outbox = make_backend(clock=clock, **_one_shard(make_backend)).outbox
    outbox.publish(events)
    starts: dict[str, int] = {}
    for _round in range(6 * MAX_ATTEMPTS):
        store = MortalStore(outbox._store)

        def handler(event: Event, store: MortalStore = store) -> None:
            starts[event.id] = starts.get(event.id, 0) + 1
            if behaviour.get(event.id) == "kill":
                store.killed = True
                raise KilledError()
            if behaviour.get(event.id) == "raise":
                raise RuntimeError(f"{event.id} refused")

        worker = OutboxWorker(
            store,  # type: ignore[arg-type]
            handler,
            clock=clock,
            options=WorkerOptions(
                lease=LEASE,
                max_attempts=MAX_ATTEMPTS,
                backoff=0,
                max_backoff=0,
                heartbeat=False,
                batch_size=batch_size,
            ),
        )
        try:
            for _poll in range(4 * len(events)):
                if not worker.run_once():
                    break
        except KilledError:
            pass
        records = {e.id: outbox.get(e.id) for e in events}
        if all(
            r is not None and r.status in (EventStatus.COMPLETED, EventStatus.FAILED)
            for r in records.values()
        ):
            break
        clock.advance(LEASE + 1)  # the dead process's leases run out
    else:
        raise AssertionError(f"not finished: {records} after handler starts {starts}")
    return outbox, starts


def test_a_poison_event_fails_alone(make_backend: Any) -> None:
    """e1 kills its process, e2 and e3 were claimed with it: e1 fails after MAX_ATTEMPTS deaths
    in its own handler, e2 and e3 are delivered once each (on the code before the fix all three
    were stored failed, "claimed 4 times", and e2's and e3's handlers never ran)."""
    events = [Event("t", i, id=f"e{i}") for i in (1, 2, 3)]
    outbox, starts = _rounds(make_backend, events, {"e1": "kill"})
    assert outbox.get("e1").status is EventStatus.FAILED
    assert starts["e1"] == MAX_ATTEMPTS, starts
    for event_id in ("e2", "e3"):
        assert outbox.get(event_id).status is EventStatus.COMPLETED, (event_id, starts)
        assert starts[event_id] == 1, starts
    assert outbox.stats().failed == 1


def test_a_poison_event_behind_a_batchmate_fails_after_its_attempts_or_one_more(
    make_backend: Any,
) -> None:
    """e2 kills its process, after e1's handler ran in the same batch: e2 fails after
    MAX_ATTEMPTS deaths of its own, or one more (the known limit: the store cannot tell which of
    a dead batch's events was running, so the batch's death is not charged to any of them); e1
    and e3 are not charged at all."""
    events = [Event("t", i, id=f"e{i}") for i in (1, 2, 3)]
    outbox, starts = _rounds(make_backend, events, {"e2": "kill"})
    assert outbox.get("e2").status is EventStatus.FAILED
    assert MAX_ATTEMPTS <= starts["e2"] <= MAX_ATTEMPTS + 1, starts
    assert outbox.get("e3").status is EventStatus.COMPLETED
    assert starts["e3"] == 1, starts
    assert outbox.get("e1").status is EventStatus.COMPLETED


def test_an_always_raising_batchmate_of_a_poison_event_fails_after_its_own_attempts(
    make_backend: Any,
) -> None:
    """e2 always raises and was claimed in e1's batch: it fails after MAX_ATTEMPTS runs of its own
    handler, not sooner (the claims its dead batchmate cost it are not its attempts)."""
    events = [Event("t", i, id=f"e{i}") for i in (1, 2, 3)]
    outbox, starts = _rounds(make_backend, events, {"e1": "kill", "e2": "raise"})
    failed = outbox.get("e2")
    assert failed.status is EventStatus.FAILED
    assert starts["e2"] == MAX_ATTEMPTS, starts
    assert "e2 refused" in (failed.last_error or "")
    assert outbox.get("e3").status is EventStatus.COMPLETED
    assert starts["e3"] == 1, starts


def test_a_poison_event_delivered_one_at_a_time_fails_alone(make_backend: Any) -> None:
    """The same with a worker of batch_size=1 (each claim holds one event): the rounds it dies in
    are the poison event's own."""
    events = [Event("t", i, id=f"e{i}") for i in (1, 2, 3)]
    outbox, starts = _rounds(make_backend, events, {"e1": "kill"}, batch_size=1)
    assert outbox.get("e1").status is EventStatus.FAILED
    assert starts["e1"] == MAX_ATTEMPTS, starts
    assert {starts["e2"], starts["e3"]} == {1}


class LateAnswerStore(MortalStore):
    """A store whose claim of ``late`` is answered a lease after it applied (a loaded store, a
    long GC pause): the worker finds that lease ended before its turn and gives the event back
    unhandled."""

    def __init__(self, store: Any, clock: ManualClock, late: str) -> None:
        super().__init__(store)
        self._clock = clock
        self._late = late
        self.answered_late = False

    def claim(self, seen: Any, *args: Any, **kwargs: Any) -> Any:
        record = self._store.claim(seen, *args, **kwargs)
        if seen.id == self._late:
            self._clock.advance(LEASE + 1)
            self.answered_late = True
        return record


def _dead_batch(make_backend: Any) -> tuple[Any, ManualClock]:
    """e1, e2, e3 claimed in one batch by a process that dies in e1's handler; their leases
    have run out since."""
    clock = ManualClock()
    outbox = make_backend(clock=clock, **_one_shard(make_backend)).outbox
    outbox.publish([Event("t", i, id=f"e{i}") for i in (1, 2, 3)])
    store = MortalStore(outbox._store)

    def poison(event: Event) -> None:
        store.killed = True
        raise KilledError()

    worker = OutboxWorker(
        store,  # type: ignore[arg-type]
        poison,
        clock=clock,
        options=WorkerOptions(lease=LEASE, max_attempts=MAX_ATTEMPTS, heartbeat=False),
    )
    with contextlib.suppress(KilledError):
        worker.run_once()
    assert {outbox.get(f"e{i}").status for i in (1, 2, 3)} == {EventStatus.IN_FLIGHT}
    clock.advance(LEASE + 1)
    return outbox, clock


def test_a_reclaim_given_back_unhandled_keeps_no_attempt(make_backend: Any) -> None:
    """e2, a batchmate of the poison event e1, is re-claimed alone after the dead batch's lease,
    and that claim's answer comes after its lease ended: e2 is given back unhandled. Its handler
    never started, so it is stored with no attempt (before the fix: 1, the dead batch's claim,
    which then counted as a start: an always-raising e2 failed after MAX_ATTEMPTS - 1 runs)."""
    outbox, clock = _dead_batch(make_backend)
    store = LateAnswerStore(outbox._store, clock, late="e2")
    starts: list[str] = []
    worker = OutboxWorker(
        store,  # type: ignore[arg-type]
        lambda event: starts.append(event.id),
        clock=clock,
        options=WorkerOptions(lease=LEASE, max_attempts=MAX_ATTEMPTS, heartbeat=False),
    )
    worker.run_once(keep_going=lambda: not store.answered_late)
    record = outbox.get("e2")
    assert store.answered_late
    assert "e2" not in starts, starts
    assert record.status is EventStatus.PENDING, record
    assert record.attempts == 0, record


def test_a_reclaim_left_for_another_handler_keeps_no_attempt(make_backend: Any) -> None:
    """The same re-claim, by a worker without e2's handler (``on_missing_handler="leave"``):
    given back for a worker that has it, with no attempt (before the fix: 1). (e1 died in its
    own handler, but nothing in the store tells it from its batchmates: see
    test_a_poison_event_fails_after_exactly_its_attempts.)"""
    outbox, clock = _dead_batch(make_backend)
    worker = OutboxWorker(
        outbox._store,
        {"other": lambda event: None},
        clock=clock,
        options=WorkerOptions(lease=LEASE, max_attempts=MAX_ATTEMPTS, heartbeat=False),
    )
    worker.run_once()
    for event_id in ("e2", "e3"):
        record = outbox.get(event_id)
        assert record.status is EventStatus.PENDING, record
        assert record.attempts == 0, record
