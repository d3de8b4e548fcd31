"""Outbox contract: every backend must pass these unchanged (public API only)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter

import pytest

from dynacoord import (
    DuplicateEventError,
    Event,
    EventStatus,
    InvalidKeyError,
    InvalidValueError,
    ManualClock,
    TransactionTooLargeError,
)
from dynacoord.errors import ConfigurationError
from tests.conftest import needs_atomic_store
from tests.outbox_helpers import drain


class Crash(BaseException):
    """Simulates a worker dying mid-event: not an Exception, so the worker does not record it."""


def test_publish_then_handler_receives_it_once(make_backend):
    outbox = make_backend().outbox
    event = Event(
        "order.created",
        {"order": "o-1", "total": 12, "raw": b"\x00\x01"},
        metadata={"trace": "t-1"},
        group="customer-7",
    )
    assert outbox.publish(event) == [event.id]
    received = []
    worker = outbox.worker({"order.created": received.append})
    assert worker.run_once() == 1
    assert worker.run_once() == 0
    assert len(received) == 1
    got = received[0]
    assert got.id == event.id and got.type == "order.created"
    assert got.payload == {"order": "o-1", "total": 12, "raw": b"\x00\x01"}
    assert got.metadata == {"trace": "t-1"} and got.group == "customer-7"
    assert got.attempt == 1
    assert abs(got.occurred_at - event.occurred_at) < 0.001
    record = outbox.get(event.id)
    assert record is not None and record.status is EventStatus.COMPLETED
    assert outbox.stats().pending == 0


def test_event_defaults_and_validation(make_backend):
    event = Event("t", None)
    assert len(event.id) == 32 and abs(event.occurred_at - time.time()) < 5
    assert event.metadata == {} and event.group is None
    with pytest.raises(InvalidValueError):
        Event("", {})
    with pytest.raises(InvalidValueError):
        Event("t", {1, 2})  # a set is not storable
    with pytest.raises(InvalidValueError):
        Event("t", {}, metadata=["not", "a", "mapping"])
    with pytest.raises(InvalidKeyError):
        Event("t", {}, id="")
    outbox = make_backend().outbox
    with pytest.raises(TypeError):
        outbox.publish(["not an event"])
    twice = Event("t", 1, id="same")
    with pytest.raises(InvalidValueError):
        outbox.publish([twice, Event("t", 2, id="same")])
    assert outbox.get("same") is None


def test_publish_many_in_one_call_and_101_raise_writing_nothing(make_backend):
    outbox = make_backend().outbox
    too_many = [Event("bulk", i) for i in range(101)]
    with pytest.raises(TransactionTooLargeError) as info:
        outbox.publish(too_many)
    assert info.value.size == 101 and info.value.limit == 100
    assert outbox.stats().pending == 0
    assert all(outbox.get(e.id) is None for e in too_many[:3])
    ids = outbox.publish(too_many[:100])
    assert len(ids) == 100
    assert outbox.stats().pending == 100
    seen = Counter()
    worker = outbox.worker(lambda e: seen.update([e.payload]), batch_size=40)
    assert drain(worker) == 100
    assert seen == Counter(range(100))


def test_republishing_the_same_event_is_a_no_op_and_a_different_one_is_refused(make_backend):
    outbox = make_backend().outbox
    first = Event("t", {"v": 1}, id="evt-1")
    outbox.publish(first)
    outbox.publish(first)  # a retry after a lost answer: no error, no second event
    # A batch mixing the already-stored event with new ones stores the new ones.
    outbox.publish([first, Event("t", {"v": 2}, id="evt-2")])
    with pytest.raises(DuplicateEventError) as info:
        outbox.publish([Event("t", {"v": "other"}, id="evt-1"), Event("t", 3, id="evt-3")])
    assert info.value.event_ids == ["evt-1"]
    assert outbox.get("evt-3") is None  # nothing of the refused batch was written
    with pytest.raises(DuplicateEventError):
        outbox.publish(Event("t", {"v": "other"}, id="evt-1"))
    received = []
    drain(outbox.worker(received.append))
    assert sorted((e.id, e.payload["v"]) for e in received) == [("evt-1", 1), ("evt-2", 2)]


def test_a_handler_error_with_a_lone_surrogate_is_recorded_escaped(make_backend):
    outbox = make_backend().outbox
    outbox.publish(Event("raw", 1, id="s1"))

    def boom(event):
        raise RuntimeError(b"bad \xff byte".decode("utf-8", "surrogateescape"))

    assert outbox.worker({"raw": boom}, max_attempts=3).run_once() == 1
    record = outbox.get("s1")
    assert record.status is EventStatus.PENDING and record.attempts == 1
    assert record.last_error == "RuntimeError: bad \\udcff byte"


def test_failures_back_off_then_fail_and_retry_redelivers_once(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("flaky", {"n": 1}, id="e1"))
    attempts = []

    def boom(event):
        attempts.append(event.attempt)
        raise RuntimeError(f"downstream unavailable ({event.attempt})")

    worker = outbox.worker({"flaky": boom}, max_attempts=3, backoff=2.0, max_backoff=3.0)
    start = clock.time()
    assert worker.run_once() == 1
    record = outbox.get("e1")
    assert record.status is EventStatus.PENDING and record.attempts == 1
    assert "downstream unavailable (1)" in record.last_error
    # attempt 1 -> 2 s backoff with equal jitter: between 1 and 2 seconds from now
    assert start * 1000 + 1000 <= record.due_at_ms <= start * 1000 + 2000
    assert worker.run_once() == 0  # not due yet
    clock.advance(2.0)
    assert worker.run_once() == 1
    record = outbox.get("e1")
    # attempt 2 -> min(3, 2 * 2) = 3 s, jittered to 1.5..3 s
    assert clock.time() * 1000 + 1500 <= record.due_at_ms <= clock.time() * 1000 + 3000
    clock.advance(3.0)
    assert worker.run_once() == 1
    assert attempts == [1, 2, 3]
    record = outbox.get("e1")
    assert record.status is EventStatus.FAILED and record.attempts == 3
    assert "downstream unavailable (3)" in record.last_error
    clock.advance(1000)
    assert worker.run_once() == 0  # failed events are never picked up again on their own
    failed = outbox.failed()
    assert [r.id for r in failed] == ["e1"]
    assert outbox.stats().failed == 1

    report = outbox.retry_report(["e1", "nope"])
    assert report.retried == ["e1"] and report.not_found == ["nope"]
    assert outbox.get("nope") is None  # unknown ids are never created
    assert outbox.failed() == []
    good = []
    healed = outbox.worker({"flaky": good.append})
    assert drain(healed) == 1
    assert [e.id for e in good] == ["e1"]
    assert good[0].attempt == 1  # attempts were reset by retry()
    assert outbox.get("e1").status is EventStatus.COMPLETED
    assert outbox.retry(["e1"]) == 0  # completed, not failed: left alone


def test_retry_of_unknown_or_not_failed_ids_changes_nothing(make_backend):
    outbox = make_backend().outbox
    outbox.publish(Event("t", 1, id="waiting"))
    assert outbox.retry(["ghost-1", "ghost-2", "waiting"]) == 0
    assert outbox.get("ghost-1") is None and outbox.get("ghost-2") is None
    assert outbox.retry("ghost-3") == 0
    stats = outbox.stats()
    assert (stats.pending, stats.failed, stats.in_flight) == (1, 0, 0)
    with pytest.raises(InvalidKeyError):
        outbox.retry([""])


def test_worker_killed_mid_event_is_recovered_after_the_lease(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("job", {"x": 1}, id="z1"))

    def die(event):
        raise Crash()

    crashed = outbox.worker(die, lease=30, heartbeat=False)
    with pytest.raises(Crash):
        crashed.run_once()
    record = outbox.get("z1")
    assert record.status is EventStatus.IN_FLIGHT and record.attempts == 1
    assert outbox.stats().in_flight == 1
    received = []
    rescuer = outbox.worker(received.append, lease=30)
    clock.advance(29.9)
    assert rescuer.run_once() == 0  # the lease still holds
    clock.advance(0.1)
    # A worker looks for expired leases at most every lease/2 (its first poll did, at 29.9).
    assert rescuer.run_once() == 0
    clock.advance(15)
    assert rescuer.run_once() == 1
    assert [(e.id, e.attempt) for e in received] == [("z1", 2)]
    assert outbox.get("z1").status is EventStatus.COMPLETED
    assert rescuer.run_once() == 0


def test_run_once_stops_claiming_when_keep_going_says_no(make_backend):
    outbox = make_backend().outbox
    outbox.publish([Event("t", i, id=f"k{i}") for i in range(5)])
    received = []
    answers = iter([True, True, True, False])  # the poll, then one answer before each claim

    worker = outbox.worker(received.append, batch_size=10)
    assert worker.run_once(keep_going=lambda: next(answers)) == 2
    assert len(received) == 2
    assert outbox.stats().pending == 3  # nothing claimed and left behind
    assert worker.run_once(keep_going=lambda: False) == 0
    assert outbox.stats().pending == 3
    with pytest.raises(TypeError, match="keep_going"):
        worker.run_once(keep_going=5)
    assert worker.run_once() == 3


def test_an_event_that_always_kills_its_worker_ends_failed_after_max_attempts(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("poison", {"x": 1}, id="p1"))
    calls = []

    def die(event):
        calls.append(event.attempt)
        raise Crash()

    worker = outbox.worker(die, lease=10, max_attempts=3, heartbeat=False)
    for _ in range(3):
        with pytest.raises(Crash):
            worker.run_once()
        clock.advance(10)  # the dead worker's lease runs out
    assert calls == [1, 2, 3]
    assert worker.run_once() == 1  # the 4th claim fails it without calling the handler
    assert calls == [1, 2, 3]
    record = outbox.get("p1")
    assert record.status is EventStatus.FAILED and record.attempts == 4
    assert "without an outcome" in record.last_error
    assert [r.event.id for r in outbox.failed()] == ["p1"]
    clock.advance(3600)
    assert worker.run_once() == 0  # failed events are never picked up on their own
    assert outbox.retry(["p1"]) == 1
    received = []
    assert outbox.worker(received.append).run_once() == 1
    assert [(e.id, e.attempt) for e in received] == [("p1", 1)]


def test_a_worker_whose_lease_expired_cannot_complete_over_the_new_claimant(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("slow", 1, id="l1"))
    new_claimant = outbox.worker(lambda e: (_ for _ in ()).throw(Crash()), lease=10)

    def slow(event):
        clock.advance(11)  # overran the 10 s lease
        with pytest.raises(Crash):
            new_claimant.run_once()  # claims (attempt 2) and keeps it in flight
        # returning normally: the old worker now tries to complete

    old = outbox.worker(slow, lease=10, heartbeat=False)
    assert old.run_once() == 1
    assert old.lost == 1 and old.delivered == 0
    record = outbox.get("l1")
    assert record.status is EventStatus.IN_FLIGHT and record.attempts == 2  # untouched

    # Same for a failure report by a worker that lost its lease.
    def slow_and_failing(event):
        clock.advance(11)
        with pytest.raises(Crash):
            new_claimant.run_once()
        raise RuntimeError("late failure")

    clock.advance(11)  # the crashed claimant's lease runs out
    loser = outbox.worker(slow_and_failing, lease=10, heartbeat=False, max_attempts=10)
    assert loser.run_once() == 1
    assert loser.lost == 1
    record = outbox.get("l1")
    assert record.status is EventStatus.IN_FLIGHT and record.attempts == 4
    assert record.last_error is None


def test_missing_handler_policies(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("unknown", 1, id="m1")])
    outbox.worker({"other": print}, on_missing_handler="fail").run_once()
    record = outbox.get("m1")
    assert record.status is EventStatus.FAILED
    assert "no handler for event type 'unknown'" in record.last_error

    outbox.publish(Event("unknown", 2, id="m2"))
    retrying = outbox.worker({"other": print}, on_missing_handler="retry", max_attempts=2)
    assert retrying.run_once() == 1
    assert outbox.get("m2").status is EventStatus.PENDING
    clock.advance(5)
    retrying.run_once()
    assert outbox.get("m2").status is EventStatus.FAILED

    outbox.publish(Event("unknown", 3, id="m3"))
    outbox.worker({"other": print}, on_missing_handler="skip").run_once()
    assert outbox.get("m3").status is EventStatus.COMPLETED

    with pytest.raises(ConfigurationError):
        outbox.worker(print, on_missing_handler="ignore")


def test_handler_map_with_catch_all_and_single_callable(make_backend):
    outbox = make_backend().outbox
    outbox.publish([Event("a", 1), Event("b", 2), Event("c", 3)])
    got = []
    worker = outbox.worker(
        {"a": lambda e: got.append(("a", e.payload)), "*": lambda e: got.append(("*", e.payload))}
    )
    drain(worker)
    assert sorted(got) == [("*", 2), ("*", 3), ("a", 1)]
    with pytest.raises(ConfigurationError):
        outbox.worker({"a": "not callable"})
    with pytest.raises(ConfigurationError):
        outbox.worker(42)


def test_completed_events_are_kept_for_the_retention_or_deleted(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("t", 1, id="kept"))
    assert outbox.worker(lambda e: None, retention=3600).run_once() == 1
    outbox.publish(Event("u", 2, id="gone"))
    assert outbox.worker(lambda e: None, retention=None).run_once() == 1
    assert outbox.get("kept").status is EventStatus.COMPLETED
    assert outbox.get("gone") is None
    clock.advance(3599)
    assert outbox.get("kept") is not None
    clock.advance(1)
    assert outbox.get("kept") is None  # past retention: absent even before the TTL sweeper runs
    # An expired completed event no longer blocks its id.
    outbox.publish(Event("t", "again", id="kept"))
    assert outbox.get("kept").status is EventStatus.PENDING


def test_default_retention_is_seven_days(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish(Event("t", 1, id="r"))
    outbox.worker(lambda e: None).run_once()
    clock.advance(7 * 86400 - 1)
    assert outbox.get("r") is not None
    clock.advance(1)
    assert outbox.get("r") is None


def test_every_shard_and_page_is_covered(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox  # DynamoDB: 4 index shards by default
    events = [Event("s", i, id=f"ev-{i:03d}") for i in range(40)]
    outbox.publish(events)
    assert outbox.stats().pending == 40 and outbox.stats().due == 40
    assert len(outbox.pending(limit=100)) == 40
    assert len(outbox.pending(limit=7)) == 7
    seen = []

    def fail_evens(event):
        seen.append(event.id)
        if event.payload % 2 == 0:
            raise ValueError("even")

    worker = outbox.worker(fail_evens, batch_size=6, max_attempts=1)
    assert drain(worker) == 40
    assert sorted(seen) == sorted(e.id for e in events)
    failed = outbox.failed(limit=100)
    assert sorted(r.id for r in failed) == [f"ev-{i:03d}" for i in range(0, 40, 2)]
    assert len(outbox.failed(limit=5)) == 5
    stats = outbox.stats()
    assert (stats.pending, stats.in_flight, stats.failed) == (0, 0, 20)
    assert outbox.retry([r.id for r in failed]) == 20
    assert drain(outbox.worker(lambda e: None, batch_size=4)) == 20


def test_stats_counts_by_status(make_backend):
    clock = ManualClock()
    outbox = make_backend(clock=clock).outbox
    outbox.publish([Event("ok", 1), Event("bad", 2), Event("stuck", 3), Event("later", 4)])

    def handle(event):
        if event.type == "bad":
            raise RuntimeError("no")
        if event.type == "stuck":
            raise Crash()
        if event.type == "later":
            raise RuntimeError("again later")

    worker = outbox.worker(handle, max_attempts=1, heartbeat=False)
    for _ in range(4):
        with contextlib.suppress(Crash):
            worker.run_once()
    stats = outbox.stats()
    assert stats.in_flight == 1 and stats.failed == 2 and stats.pending == 0
    assert stats.as_dict() == {
        "pending": 0,
        "due": 0,
        "in_flight": 1,
        "failed": 2,
        "oldest_due_age": None,  # nothing pending
        "expired_lease_age": None,  # the stuck event's lease still holds
    }


def test_stop_finishes_the_current_event_and_claims_no_more(make_backend):
    outbox = make_backend().outbox
    outbox.publish([Event("t", i) for i in range(5)])
    handled = []

    def handler(event):
        handled.append(event.id)
        worker.stop()

    worker = outbox.worker(handler)
    assert worker.run_once() == 1
    assert len(handled) == 1
    assert outbox.stats().pending == 4 and outbox.stats().in_flight == 0


def test_run_loops_until_the_stop_event(make_backend):
    outbox = make_backend().outbox
    received = []
    stop = threading.Event()
    worker = outbox.worker(received.append, poll_interval=0.01)
    thread = threading.Thread(target=worker.run, kwargs={"stop_event": stop})
    thread.start()
    try:
        outbox.publish([Event("t", i) for i in range(5)])
        deadline = time.monotonic() + 20
        while len(received) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert sorted(e.payload for e in received) == [0, 1, 2, 3, 4]


def test_stop_ends_run(make_backend):
    outbox = make_backend().outbox
    worker = outbox.worker(lambda e: None, poll_interval=5)
    thread = threading.Thread(target=worker.run)
    thread.start()
    time.sleep(0.05)
    worker.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_heartbeat_keeps_a_long_handler_s_lease(make_backend):
    outbox = make_backend().outbox
    outbox.publish(Event("long", 1, id="hb"))
    other_result = []

    def long_handler(event):
        # The lease is 0.9 s (renewed every 0.3 s): after 1.5 s only the heartbeat keeps it.
        time.sleep(1.5)
        other_result.append(other.run_once())
        time.sleep(0.1)

    other = outbox.worker(lambda e: None, lease=0.9)
    worker = outbox.worker(long_handler, lease=0.9)
    assert worker.run_once() == 1
    assert other_result == [0]
    assert worker.delivered == 1 and worker.lost == 0
    assert outbox.get("hb").attempts == 1


def test_two_workers_racing_never_deliver_twice(make_backend):
    needs_atomic_store(make_backend)
    outbox = make_backend().outbox
    for start in range(0, 120, 60):
        outbox.publish([Event("race", i) for i in range(start, start + 60)])
    deliveries = Counter()
    guard = threading.Lock()

    def handler(event):
        with guard:
            deliveries[event.payload] += 1

    workers = [outbox.worker(handler, batch_size=10) for _ in range(2)]
    barrier = threading.Barrier(2)

    def run(w):
        barrier.wait()
        drain(w, rounds=200)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert deliveries == Counter(range(120))
    assert outbox.stats().pending == 0
