"""Every write recognises its own applied write: the response of each conditional or counting
write is lost once after the write applied, the client's own retry sends it again, and the answer
is the one the caller would have got had the first response arrived (every backend)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.outbox import Event, EventStatus
from tests.outbox_helpers import drain

UPDATE = {"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "find_one_and_update"}
PUT = {"dynamodb": "PutItem", "redis": "EVALSHA", "mongo": None}


def _claim_operation(lossy: Any) -> str:
    """The request of an outbox's one-event claim on ``lossy``'s backend."""
    if lossy.kind == "redis":
        from dynacoord.backends.redis.outbox import _CLAIM_MANY

        return str(lossy.script(_CLAIM_MANY))
    return UPDATE[lossy.kind]


def _lose(lossy, op: dict[str, str | None]) -> None:
    lossy.lose_next(operation=op[lossy.kind])


# -- create if absent -------------------------------------------------------------------------


def test_cache_add_recognises_its_own_write(lossy):
    cache = lossy.backend().cache()
    lossy.lose_next()
    assert cache.add("k", {"v": 1}) is True
    assert lossy.lost == 1
    assert cache.get("k") == {"v": 1}
    assert cache.add("k", 2) is False  # a later add by anyone still sees it taken


def test_set_if_absent_recognises_its_own_write(lossy):
    counters = lossy.backend().counters
    lossy.lose_next()
    assert counters.set_if_absent("flag", "mine") is True
    assert lossy.lost == 1
    assert counters.get("flag") == "mine"
    assert counters.set_if_absent("flag", "other") is False


def test_set_if_absent_of_a_counter_recognises_its_own_write(lossy):
    counters = lossy.backend().counters
    lossy.lose_next()
    assert counters.set_if_absent("c", 5) is True
    assert lossy.lost == 1
    assert counters.increment("c") == 6


def test_runs_start_returns_its_own_run(lossy):
    runs = lossy.backend().runs
    lossy.lose_next()
    run = runs.start("run-1", context={"a": 1})
    assert lossy.lost == 1
    assert run.run_id == "run-1"
    assert runs.get("run-1").context == {"a": 1}


def test_checkpoint_save_with_a_sequence_returns_its_own_checkpoint(lossy):
    cps = lossy.backend().checkpoints
    lossy.lose_next()
    cp = cps.save("task", {"step": 7}, sequence=7)
    assert lossy.lost == 1
    assert cp.sequence == 7
    assert [c.sequence for c in cps.list("task")] == [7]


def test_checkpoint_save_next_sequence_stores_one_checkpoint(lossy):
    cps = lossy.backend().checkpoints
    cps.save("task", "first")
    lossy.lose_next()
    cp = cps.save("task", "second")
    assert lossy.lost == 1
    assert cp.sequence == 2
    assert [(c.sequence, c.data) for c in cps.list("task")] == [(1, "first"), (2, "second")]


# -- counting -----------------------------------------------------------------------------------


def test_increment_counts_once(lossy):
    counters = lossy.backend().counters
    counters.increment("n", 10)
    lossy.lose_next()
    assert counters.increment("n") == 11
    assert lossy.lost == 1
    assert counters.get("n") == 11


def test_increment_of_a_new_counter_counts_once(lossy):
    counters = lossy.backend().counters
    lossy.lose_next()
    assert counters.increment("fresh", 3) == 3
    assert lossy.lost == 1
    assert counters.get("fresh") == 3


def test_cache_incr_counts_once(lossy):
    cache = lossy.backend().cache()
    cache.set("n", 10)
    lossy.lose_next()
    assert cache.incr("n") == 11
    assert lossy.lost == 1
    assert cache.get("n") == 11


def test_join_completed_by_a_lost_response_fires(lossy):
    counters = lossy.backend().counters
    assert counters.join("fan", "a", expected=2).fired is False
    lossy.lose_next()
    result = counters.join("fan", "b", expected=2)
    assert lossy.lost == 1
    assert (result.count, result.complete, result.fired) == (2, True, True)
    # At least once: a redelivery of the completing member fires again; any other never does.
    assert counters.join("fan", "b", expected=2).fired is True
    assert counters.join("fan", "a", expected=2).fired is False
    extra = counters.join("fan", "c", expected=2)
    assert (extra.count, extra.fired) == (3, False)
    assert counters.join("fan", "b", expected=2).fired is True


def test_join_arrival_before_completion_with_a_lost_response(lossy):
    counters = lossy.backend().counters
    lossy.lose_next()
    first = counters.join("fan", "a", expected=2)
    assert lossy.lost == 1
    assert (first.count, first.fired) == (1, False)
    assert counters.join("fan", "b", expected=2).fired is True


def test_breaker_failure_count_is_exact(lossy):
    breaker = lossy.backend().breaker("svc", failure_threshold=3, reset_timeout=60)
    breaker.record_failure()
    lossy.lose_next()
    breaker.record_failure()
    assert lossy.lost == 1
    assert breaker.status().state == "closed"  # 2 failures, not 3
    breaker.record_failure()
    assert breaker.status().state == "open"


def test_breaker_trial_slot_won_by_a_lost_response_runs_the_trial(lossy):
    clock = ManualClock()
    transitions: list[tuple[str, str]] = []
    breaker = lossy.backend(clock=clock).breaker(
        "svc",
        failure_threshold=1,
        reset_timeout=10,
        on_transition=lambda name, old, new: transitions.append((str(old), str(new))),
    )
    breaker.record_failure()
    assert breaker.status().state == "open"
    clock.advance(11)
    lossy.lose_next()
    assert breaker.call(lambda: "trial ran") == "trial ran"
    assert lossy.lost == 1
    assert breaker.status().state == "closed"
    assert ("open", "half_open") in transitions or ("open", "half-open") in transitions


def _lose_in(lossy, store, method: str) -> None:
    """The next write of ``store.method`` loses its response (the client's retry runs)."""
    real = getattr(store, method)

    def losing(*args, **kwargs):
        lossy.lose_next()
        return real(*args, **kwargs)

    setattr(store, method, losing)


def _watched_breaker(lossy, **options):
    clock = ManualClock()
    transitions: list[tuple[str, str]] = []
    breaker = lossy.backend(clock=clock).breaker(
        "svc",
        reset_timeout=10,
        on_transition=lambda name, old, new: transitions.append((str(old), str(new))),
        **options,
    )
    return breaker, clock, transitions


def test_a_trip_at_the_threshold_with_a_lost_response_reports_its_transition(lossy):
    breaker, _, transitions = _watched_breaker(lossy, failure_threshold=1)
    _lose_in(lossy, breaker._store, "trip")
    breaker.record_failure()
    assert lossy.lost == 1
    assert breaker.status().state == "open"
    assert transitions == [("closed", "open")]


def test_a_manual_trip_and_reset_with_lost_responses_report_their_transitions(lossy):
    breaker, _, transitions = _watched_breaker(lossy, failure_threshold=5)
    breaker.record_failure()
    _lose_in(lossy, breaker._store, "trip")
    breaker.trip()
    assert lossy.lost == 1
    assert breaker.status().state == "open"
    _lose_in(lossy, breaker._store, "reset")
    breaker.reset()
    assert lossy.lost == 2
    assert breaker.status().state == "closed" and breaker.status().failures == 0
    assert transitions == [("closed", "open"), ("open", "closed")]


@pytest.mark.parametrize("outcome", ["close", "reopen"])
def test_a_trial_outcome_with_a_lost_response_reports_its_transition(lossy, outcome):
    breaker, clock, transitions = _watched_breaker(lossy, failure_threshold=1)
    breaker.record_failure()
    clock.advance(11)
    _lose_in(lossy, breaker._store, outcome)
    if outcome == "close":
        assert breaker.call(lambda: "ok") == "ok"
    else:
        with pytest.raises(ZeroDivisionError):
            breaker.call(lambda: 1 / 0)
    assert lossy.lost == 1
    expected = "closed" if outcome == "close" else "open"
    assert breaker.status().state == expected
    assert transitions == [("closed", "open"), ("open", "half_open"), ("half_open", expected)]


def test_a_trial_success_with_a_lost_response_counts_once(lossy):
    breaker, clock, _ = _watched_breaker(
        lossy, failure_threshold=1, success_threshold=2, half_open_max_calls=2
    )
    breaker.record_failure()
    clock.advance(11)
    _lose_in(lossy, breaker._store, "trial_success")
    breaker.call(lambda: "ok")
    assert lossy.lost == 1
    status = breaker.status()
    assert (status.state, status.successes, status.trial_calls) == ("half_open", 1, 0)
    breaker.call(lambda: "ok")
    assert breaker.status().state == "closed"


def test_a_trial_slot_joined_with_a_lost_response_is_the_callers(lossy):
    breaker, clock, _ = _watched_breaker(lossy, failure_threshold=1, half_open_max_calls=2)
    breaker.record_failure()
    clock.advance(11)
    with breaker:  # the first trial call holds the round's first slot
        _lose_in(lossy, breaker._store, "join_trial")
        with breaker:  # the second takes the last slot; its answer is lost
            assert lossy.lost == 1
            assert breaker.status().trial_calls == 2, "the slot is taken once"


def test_an_idempotency_completion_with_a_lost_response_reports_it(lossy):
    idempotency = lossy.backend().idempotency
    claim = idempotency.try_claim("k").claim
    assert claim is not None
    lossy.lose_next()
    assert idempotency.complete(claim, {"r": 1}) is True
    assert lossy.lost == 1
    record = idempotency.get("k")
    assert record is not None and record.completed and record.result == {"r": 1}
    # a claim that never completed this record is still refused
    other = idempotency.try_claim("j").claim
    assert other is not None and idempotency.complete(other, 1) is True
    assert idempotency.complete(dataclasses.replace(claim, key="j"), 2) is False


def test_an_idempotent_call_whose_completion_answer_is_lost_logs_no_takeover(lossy, caplog):
    backend = lossy.backend()
    calls: list[int] = []

    @backend.idempotent(key="id")
    def handler(event: dict[str, str]) -> dict[str, str]:
        calls.append(1)
        lossy.lose_next()  # the completion that follows loses its answer
        return {"ok": event["id"]}

    with caplog.at_level(logging.WARNING):
        assert handler({"id": "x"}) == {"ok": "x"}
    assert lossy.lost == 1 and calls == [1]
    assert "lost before completion" not in caplog.text
    assert handler({"id": "x"}) == {"ok": "x"} and calls == [1]


def test_a_release_with_a_lost_response_reports_it_and_frees_no_later_holder(lossy):
    locks = lossy.backend().locks
    lease = locks.acquire("k", ttl=30, owner="a")
    assert lease is not None
    taken: list[object] = []
    lossy.lose_next(then=lambda: taken.append(locks.acquire("k", ttl=30, owner="b", timeout=0)))
    assert lease.release() is True, "the lease was released by this call"
    assert lossy.lost == 1 and taken[0] is not None
    holder = locks.get("k")
    assert holder is not None and holder.owner == "b"
    # with nothing in the gap: released, reported True, the lock free
    second = locks.acquire("j", ttl=30, owner="a")
    assert second is not None
    lossy.lose_next()
    assert second.release() is True
    assert lossy.lost == 2 and locks.get("j") is None
    # a lease already lost still reports False
    assert second.release() is False


def test_a_force_release_with_a_lost_response_reports_it_and_frees_no_later_holder(lossy):
    locks = lossy.backend().locks
    assert locks.acquire("k", ttl=30, owner="a") is not None
    taken: list[object] = []
    # In the gap before the retry, another process takes the freed lock: the retry must not
    # free it again.
    lossy.lose_next(then=lambda: taken.append(locks.acquire("k", ttl=30, owner="b", timeout=0)))
    assert locks.force_release("k") is True, "a live lock was freed"
    assert lossy.lost == 1 and taken[0] is not None
    holder = locks.get("k")
    assert holder is not None and holder.owner == "b"
    # A force_release of a free lock whose answer is lost reports False, as answered at once.
    assert locks.force_release("k") is True
    lossy.lose_next()
    assert locks.force_release("k") is False
    assert lossy.lost == 2


@pytest.mark.parametrize(
    "case",
    [
        "idempotency.release",
        "idempotency.delete",
        "cache.delete",
        "counters.delete",
    ],
)
def test_a_removal_with_a_lost_response_is_applied_and_reports_false(lossy, case):
    """The documented exception (docs/guarantees.md): a write that removes what it reports on
    finds nothing on its retry, so it reports False; what is stored is right."""
    backend = lossy.backend()
    if case.startswith("idempotency."):
        claim = backend.idempotency.try_claim("k").claim
        assert claim is not None
        lossy.lose_next()
        if case == "idempotency.release":
            assert backend.idempotency.release(claim) is False
        else:
            assert backend.idempotency.delete("k") is False
        assert backend.idempotency.get("k") is None
        assert backend.idempotency.try_claim("k").claim is not None, "the key is free again"
    elif case == "cache.delete":
        cache = backend.cache()
        cache.set("k", 1)
        lossy.lose_next()
        assert cache.delete("k") is False
        assert cache.get("k") is None
    else:
        backend.counters.increment("k")
        lossy.lose_next()
        assert backend.counters.delete("k") is False
        assert backend.counters.get("k") is None
    assert lossy.lost == 1


# -- outbox -------------------------------------------------------------------------------------


def test_outbox_claim_with_a_lost_response_delivers_in_the_same_pass(lossy):
    backend = lossy.backend()
    backend.outbox.publish(Event("t", {"n": 1}, id="e1"))
    seen: list[int] = []
    worker = backend.outbox.worker(
        lambda e: seen.append(e.attempt), max_attempts=1, batch_claim=False
    )
    # The claim's answer, not the poll's (on Redis both are scripts: EVALSHA).
    lossy.lose_next(operation=_claim_operation(lossy))
    assert worker.run_once() == 1
    assert lossy.lost == 1
    assert seen == [1]
    record = backend.outbox.get("e1")
    assert record is None or record.status == EventStatus.COMPLETED


def test_outbox_retry_with_a_lost_response_reports_the_event_retried(lossy):
    """A failed event moved back to pending by ``outbox.retry`` whose answer was lost: the
    client's retry finds it pending, and the report still says retried, once."""
    backend = lossy.backend()
    outbox = backend.outbox
    outbox.publish(Event("t", {"n": 1}, id="doomed"))

    def poison(event):
        raise RuntimeError("poison")

    drain(outbox.worker(poison, max_attempts=1, heartbeat=False))
    assert outbox.get("doomed").status is EventStatus.FAILED
    lossy.lose_next(
        operation={"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "update_one"}[lossy.kind]
    )
    report = outbox.retry_report("doomed")
    assert lossy.lost == 1
    assert (report.retried, report.not_found, report.not_failed) == (["doomed"], [], [])
    record = outbox.get("doomed")
    assert record.status is EventStatus.PENDING and record.attempts == 0
    # a second retry, by anyone, finds it pending: not failed
    assert outbox.retry_report("doomed").not_failed == ["doomed"]


def test_an_outbox_retry_with_a_lost_response_is_not_applied_again(lossy):
    outbox = lossy.backend().outbox
    outbox.publish(Event("t", 1, id="x"))
    attempts: list[int] = []

    def poison(event: Event) -> None:
        attempts.append(event.attempt)
        raise RuntimeError("poison")

    worker = outbox.worker(poison, max_attempts=1, heartbeat=False)
    worker.run_once()
    # In the gap: a worker delivers the retried event and it fails again. The retry of the
    # move must not put it back to pending a second time.
    lossy.lose_next(then=worker.run_once)
    assert outbox.retry_report("x").retried == ["x"]
    assert lossy.lost == 1 and len(attempts) == 2
    assert outbox.get("x").status is EventStatus.FAILED
    assert worker.run_once() == 0 and len(attempts) == 2


@pytest.mark.parametrize("n", [1])
def test_idempotent_call_with_a_lost_claim_runs_once(lossy, n):
    backend = lossy.backend()
    calls: list[int] = []

    @backend.idempotent(key="id")
    def handler(event):
        calls.append(1)
        return {"ok": event["id"]}

    lossy.lose_next(n)
    assert handler({"id": "x"}) == {"ok": "x"}
    assert handler({"id": "x"}) == {"ok": "x"}
    assert calls == [1]


# -- numbers at the edges of each store ----------------------------------------------------------

#: the largest counter each backend holds exactly
LIMITS = {
    "moto": 10**38 - 1,
    "dynamodb": 10**38 - 1,
    "redis": 2**63 - 1,
    "redis_cluster": 2**63 - 1,
    "mongo": 2**63 - 1,
    "mongodb": 2**63 - 1,
}


@pytest.mark.parametrize("sign", [1, -1])
def test_an_increment_past_the_stores_range_is_refused_and_writes_nothing(make_backend, sign):
    from dynacoord import InvalidValueError

    backend = make_backend()
    top = LIMITS[backend_kind(make_backend)]
    # int64 is asymmetric: its lowest value is -(top + 1); DynamoDB's range is symmetric
    edge = top if sign > 0 else (-top if top == 10**38 - 1 else -top - 1)
    counters = backend.counters
    assert counters.set_if_absent("edge", edge) is True
    with pytest.raises(InvalidValueError, match="nothing was written"):
        counters.increment("edge", sign)
    assert counters.get("edge") == edge  # still readable, unchanged
    assert counters.increment("edge", -sign) == edge - sign


def test_an_increment_by_more_than_the_store_holds_is_refused(make_backend):
    from dynacoord import InvalidValueError

    backend = make_backend()
    with pytest.raises(InvalidValueError):
        backend.counters.increment("big", LIMITS[backend_kind(make_backend)] + 1)
    assert backend.counters.get("big") is None


def backend_kind(make_backend) -> str:
    return getattr(make_backend, "kind", "")


@pytest.mark.parametrize("sign", [1, -1])
def test_a_cache_incr_past_the_stores_range_is_refused_and_writes_nothing(make_backend, sign):
    from dynacoord import InvalidValueError

    top = LIMITS[backend_kind(make_backend)]
    edge = top if sign > 0 else (-top if top == 10**38 - 1 else -top - 1)
    cache = make_backend().cache()
    cache.set("edge", edge)
    with pytest.raises(InvalidValueError):
        cache.incr("edge", sign)
    assert cache.get("edge") == edge
    assert cache.incr("edge", -sign) == edge - sign


# -- state transitions ----------------------------------------------------------------------------


@pytest.mark.parametrize("end", ["complete", "fail"])
def test_a_run_ended_by_a_lost_response_returns_the_ended_run(lossy, end):
    runs = lossy.backend().runs
    runs.start("r", context={})
    lossy.lose_next()
    ended = runs.complete("r", result={"ok": 1}) if end == "complete" else runs.fail("r", "boom")
    assert lossy.lost == 1
    assert str(ended.status) == ("completed" if end == "complete" else "failed")


def test_a_run_heartbeat_with_a_lost_response_is_applied(lossy):
    runs = lossy.backend().runs
    runs.start("r", context={})
    lossy.lose_next()
    runs.heartbeat("r")
    assert lossy.lost == 1
    assert str(runs.get("r").status) == "running"
