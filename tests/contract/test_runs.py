"""Workflow-run and reconciler contract: every backend must pass these unchanged."""

from __future__ import annotations

import threading
import time

import pytest

from dynacoord import (
    InvalidKeyError,
    InvalidValueError,
    ManualClock,
    RunExistsError,
    RunNotFoundError,
    RunNotRunningError,
    RunStatus,
    ValueTooLargeError,
)
from tests.conftest import needs_atomic_store

DAY = 24 * 3600


def runs_of(make_backend, **kwargs):
    return make_backend(**kwargs).runs


# -- lifecycle ------------------------------------------------------------------------------------


def test_start_and_get(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    started = runs.start("r1", context={"order": "o-1", "amount": 12.5, "raw": b"\x01"})
    assert started.status is RunStatus.RUNNING and started.running
    got = runs.get("r1")
    assert got is not None
    assert got.run_id == "r1"
    assert got.status == RunStatus.RUNNING == "running"
    assert got.context == {"order": "o-1", "amount": 12.5, "raw": b"\x01"}
    assert isinstance(got.context["amount"], float)
    assert got.created_at == got.updated_at == clock.time()
    assert got.result is None and got.error is None and got.ended_at is None
    assert started == got  # start returns the run as stored, without reading it back
    assert runs.start("r2") == runs.get("r2")
    assert runs.get("missing") is None


def test_start_refuses_a_context_over_the_item_limit_and_writes_nothing(make_backend):
    runs = make_backend().runs
    with pytest.raises(ValueTooLargeError):
        runs.start("big", context={"blob": "x" * 300_000, "more": "é" * 60_000})
    assert runs.get("big") is None
    # just under the limit still starts (the size is estimated, not guessed from a bound)
    started = runs.start("fits", context={"blob": "x" * 350_000})
    assert len(started.context["blob"]) == 350_000


def test_start_refuses_an_existing_run(make_backend):
    runs = runs_of(make_backend)
    runs.start("r", context={"a": 1})
    with pytest.raises(RunExistsError) as info:
        runs.start("r", context={"a": 2})
    assert info.value.run_id == "r"
    assert runs.get("r").context == {"a": 1}
    runs.complete("r")
    with pytest.raises(RunExistsError):
        runs.start("r")  # a finished run still exists until its TTL


def test_bad_input_is_refused_before_writing(make_backend):
    runs = runs_of(make_backend)
    with pytest.raises(InvalidKeyError):
        runs.start("")
    with pytest.raises(InvalidValueError):
        runs.start("r", context={"x": {1, 2}})
    with pytest.raises(InvalidValueError):
        runs.start("r", context={"": 1})
    with pytest.raises(TypeError):
        runs.start("r", context=[("a", 1)])
    assert runs.get("r") is None
    runs.start("r")
    with pytest.raises(ValueError):
        runs.patch("r", set={"a": 1}, remove=["a"])
    with pytest.raises(InvalidValueError):
        runs.set("r", "x" * 256, 1)
    with pytest.raises(TypeError):
        runs.patch("r", remove="a")
    assert runs.get("r").context == {}


def test_set_and_patch_update_the_context_in_place(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("r", context={"a": 1, "b": 2, "keep": "k"})
    clock.advance(1)
    after_set = runs.set("r", "c", 0.1)
    assert after_set.context == {"a": 1, "b": 2, "keep": "k", "c": 0.1}
    assert after_set.updated_at == clock.time()
    clock.advance(1)
    patched = runs.patch("r", set={"a": {"nested": [1, 2]}, "d.e": "dots are fine"}, remove=["b"])
    assert patched.context == {
        "a": {"nested": [1, 2]},
        "keep": "k",
        "c": 0.1,
        "d.e": "dots are fine",
    }
    assert runs.get("r").context == patched.context
    assert runs.get("r").updated_at == clock.time()
    assert runs.patch("r", remove=["not-there"]).context == patched.context


def test_writes_to_a_missing_run_raise_not_found(make_backend):
    runs = runs_of(make_backend)
    with pytest.raises(RunNotFoundError):
        runs.set("ghost", "a", 1)
    with pytest.raises(RunNotFoundError):
        runs.heartbeat("ghost")
    with pytest.raises(RunNotFoundError):
        runs.complete("ghost")
    with pytest.raises(RunNotFoundError):
        runs.fail("ghost", "x")
    assert runs.get("ghost") is None  # nothing was created by the failed writes


def test_complete_and_fail_end_the_run_with_a_ttl(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("ok", ttl_after_end=3600)
    runs.start("bad")
    clock.advance(5)
    done = runs.complete("ok", result={"total": 3.5})
    assert done.status is RunStatus.COMPLETED and not done.running
    assert done.result == {"total": 3.5}
    assert done.ended_at == clock.time()
    assert done.expires_at_ms == done.ended_at_ms + 3600 * 1000
    failed = runs.fail("bad", "payment declined")
    assert failed.status is RunStatus.FAILED and failed.error == "payment declined"
    assert failed.expires_at_ms == failed.ended_at_ms + 7 * DAY * 1000  # the default
    assert runs.get("ok").result == {"total": 3.5}
    assert runs.get("bad").status is RunStatus.FAILED


def test_ended_runs_cannot_change(make_backend):
    runs = runs_of(make_backend)
    runs.start("r")
    runs.complete("r", result=1)
    with pytest.raises(RunNotRunningError) as info:
        runs.complete("r", result=2)
    assert info.value.status == "completed"
    with pytest.raises(RunNotRunningError):
        runs.fail("r", "late")
    with pytest.raises(RunNotRunningError):
        runs.set("r", "a", 1)
    with pytest.raises(RunNotRunningError):
        runs.heartbeat("r")
    assert runs.get("r").result == 1


def test_ended_run_expires_and_its_id_can_be_reused(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("r", ttl_after_end=10)
    runs.fail("r", "boom")
    clock.advance(9.999)
    assert runs.get("r") is not None
    clock.advance(0.001)
    assert runs.get("r") is None
    with pytest.raises(RunNotFoundError):
        runs.complete("r")
    again = runs.start("r", context={"attempt": 2})
    assert again.status is RunStatus.RUNNING
    assert runs.get("r").context == {"attempt": 2}
    assert runs.get("r").error is None


def test_heartbeat_moves_the_update_time(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("r")
    clock.advance(30)
    beat = runs.heartbeat("r")
    assert beat.updated_at == clock.time()
    assert beat.created_at == clock.time() - 30


# -- stalled --------------------------------------------------------------------------------------


def test_stalled_finds_old_running_runs_across_pages_oldest_first(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.page_size = 2  # force several index pages
    for i in range(5):
        runs.start(f"old{i}")
        clock.advance(1)
    runs.start("beating")
    clock.advance(100)
    runs.heartbeat("beating")
    runs.start("fresh")
    clock.advance(30)
    stalled = list(runs.stalled(60))
    assert [r.run_id for r in stalled] == [f"old{i}" for i in range(5)]
    assert all(r.running for r in stalled)
    assert [r.run_id for r in runs.stalled(60, limit=3)] == ["old0", "old1", "old2"]
    assert {r.run_id for r in runs.stalled(10)} == {f"old{i}" for i in range(5)} | {
        "beating",
        "fresh",
    }
    assert list(runs.stalled(3600)) == []


def test_completed_and_failed_runs_are_never_stalled(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("done")
    runs.start("broken")
    runs.start("stuck")
    runs.complete("done")
    runs.fail("broken", "x")
    clock.advance(3 * DAY)
    assert [r.run_id for r in runs.stalled(60)] == ["stuck"]
    assert [r.run_id for r in runs.stalled(0)] == ["stuck"]
    assert [r.run_id for r in runs.list("completed")] == ["done"]
    assert [r.run_id for r in runs.list(RunStatus.FAILED)] == ["broken"]


def test_context_update_counts_as_a_sign_of_life(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("r")
    clock.advance(100)
    runs.set("r", "step", 2)
    clock.advance(30)
    assert list(runs.stalled(60)) == []
    clock.advance(31)
    assert [r.run_id for r in runs.stalled(60)] == ["r"]


# -- reconcile ------------------------------------------------------------------------------------


def test_reconcile_hands_each_stalled_run_to_the_handler(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.page_size = 2
    for i in range(3):
        runs.start(f"s{i}", context={"i": i})
    runs.start("ended")
    runs.complete("ended")
    clock.advance(120)
    runs.start("fresh")
    handled = []
    stats = runs.reconcile(60, lambda run: handled.append((run.run_id, run.context["i"])))
    assert handled == [("s0", 0), ("s1", 1), ("s2", 2)]
    assert (stats.scanned, stats.stalled, stats.reconciled, stats.failed) == (3, 3, 3, 0)
    # Reconciled runs were touched: not stalled again until another quiet period.
    assert runs.get("s0").reconciles == 1
    assert runs.reconcile(60, handled.append).scanned == 0
    clock.advance(61)
    assert runs.reconcile(60, lambda run: None).reconciled == 4  # s0..s2 and fresh
    assert runs.get("s0").reconciles == 2


def test_a_failing_handler_is_counted_and_the_pass_continues(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    for name in ("a", "b", "c"):
        runs.start(name)
    clock.advance(120)
    seen = []

    def handler(run):
        seen.append(run.run_id)
        if run.run_id == "b":
            raise RuntimeError("queue unavailable")

    stats = runs.reconcile(60, handler)
    assert seen == ["a", "b", "c"]
    assert (stats.scanned, stats.stalled, stats.reconciled, stats.failed) == (3, 3, 2, 1)
    assert stats.failures == [("b", "RuntimeError: queue unavailable")]
    # The failed one stays stalled for the next pass; the others were touched.
    assert [r.run_id for r in runs.stalled(60)] == ["b"]


def test_handler_may_end_the_run(make_backend):
    clock = ManualClock()
    runs = runs_of(make_backend, clock=clock)
    runs.start("r")
    clock.advance(120)
    stats = runs.reconcile(60, lambda run: runs.fail(run.run_id, "stalled"))
    assert stats.reconciled == 1
    assert runs.get("r").status is RunStatus.FAILED
    assert list(runs.stalled(60)) == []


def test_a_run_locked_by_another_reconciler_is_skipped(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    runs = backend.runs
    runs.start("r")
    clock.advance(120)
    lease = backend.locks.acquire("reconcile:r", 30, owner="other-reconciler")
    assert lease is not None
    stats = runs.reconcile(60, lambda run: pytest.fail("handled while locked"))
    assert (stats.scanned, stats.stalled, stats.reconciled) == (1, 0, 0)
    lease.release()
    assert runs.reconcile(60, lambda run: None).reconciled == 1


def test_two_reconcilers_at_once_handle_each_stalled_run_once(make_backend):
    needs_atomic_store(make_backend)
    clock = ManualClock()
    first = make_backend(clock=clock)
    runs_a = first.runs
    runs_b = make_backend(clock=clock, namespace=first.namespace).runs
    runs_a.page_size = runs_b.page_size = 3
    ids = [f"run{i}" for i in range(12)]
    for run_id in ids:
        runs_a.start(run_id)
    clock.advance(300)
    handled: list[str] = []
    guard = threading.Lock()
    start = threading.Barrier(2)
    stats = {}
    errors: list[BaseException] = []

    def handler(run):
        with guard:
            handled.append(run.run_id)
        time.sleep(0.01)  # widen the window in which the other reconciler sees the run

    def reconciler(name, runs):
        try:
            start.wait()
            stats[name] = runs.reconcile(60, handler)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=reconciler, args=("a", runs_a)),
        threading.Thread(target=reconciler, args=("b", runs_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(handled) == sorted(ids)  # every run once, none twice
    assert stats["a"].reconciled + stats["b"].reconciled == len(ids)
    assert all(runs_a.get(run_id).reconciles == 1 for run_id in ids)


def test_a_handler_that_overruns_lock_ttl_keeps_its_run(make_backend):
    """The reconcile lock is renewed while the handler runs: a second reconciler arriving after
    ``lock_ttl`` has passed still finds the run locked instead of handling it a second time."""
    needs_atomic_store(make_backend)
    first = make_backend()
    runs_a = first.runs
    runs_b = make_backend(namespace=first.namespace).runs
    runs_a.start("slow")
    time.sleep(0.05)  # the run's last update is now in the past: stalled for older_than=0
    handled: list[str] = []
    in_handler = threading.Event()
    release_handler = threading.Event()
    stats_a = []

    def slow_handler(run):
        handled.append("a")
        in_handler.set()
        release_handler.wait(30)

    thread = threading.Thread(
        target=lambda: stats_a.append(runs_a.reconcile(0, slow_handler, lock_ttl=1.5))
    )
    thread.start()
    try:
        assert in_handler.wait(30)
        time.sleep(2.5)  # well past lock_ttl: only the heartbeat can still hold the lock
        stats_b = runs_b.reconcile(0, lambda run: handled.append("b"), lock_ttl=1.5)
    finally:
        release_handler.set()
        thread.join()
    assert handled == ["a"]
    assert (stats_b.scanned, stats_b.stalled, stats_b.reconciled) == (1, 0, 0)
    assert stats_a[0].reconciled == 1
    assert runs_a.get("slow").reconciles == 1
