"""Circuit-breaker contract: every backend must pass these unchanged (public API only)."""

from __future__ import annotations

import contextlib
import enum
import sys
import threading
import time

import pytest

from dynacoord import BreakerState, CircuitOpenError, InvalidKeyError, ManualClock
from tests.conftest import needs_atomic_store

CLOSED, OPEN, HALF_OPEN = BreakerState.CLOSED, BreakerState.OPEN, BreakerState.HALF_OPEN


class BoomError(Exception):
    pass


def fail():
    raise BoomError("dependency failed")


def fail_n(breaker, n):
    for _ in range(n):
        with pytest.raises(BoomError):
            breaker.call(fail)


def test_states_are_str_enum():
    assert CLOSED == "closed" and OPEN == "open" and HALF_OPEN == "half_open"
    assert str(HALF_OPEN) == "half_open"
    assert f"{OPEN}|{HALF_OPEN:>10}" == "open| half_open"
    assert isinstance(OPEN, str) and BreakerState("half_open") is HALF_OPEN
    if sys.version_info >= (3, 11):
        assert issubclass(BreakerState, enum.StrEnum)


def test_str_enum_fallback_for_python_3_10_behaves_like_str_enum(monkeypatch):
    # the fallback is made only on 3.10: run the module's source as 3.10 would
    import importlib.util

    spec = importlib.util.find_spec("dynacoord._compat")
    assert spec is not None and spec.origin is not None
    with open(spec.origin, encoding="utf-8") as file:
        source = file.read()
    namespace: dict[str, object] = {"__name__": "dynacoord_compat_as_3_10"}
    monkeypatch.setattr(sys, "version_info", (3, 10, 14, "final", 0))
    exec(compile(source, spec.origin, "exec"), namespace)
    monkeypatch.undo()
    _StrEnum = namespace["StrEnum"]
    assert _StrEnum is not getattr(enum, "StrEnum", None)

    class Color(_StrEnum):  # type: ignore[misc,valid-type]
        RED = "red"
        DARK_BLUE = enum.auto()

    assert isinstance(Color.RED, str) and Color.RED == "red" and Color("red") is Color.RED
    assert str(Color.RED) == "red" and f"{Color.RED}" == "red" and f"{Color.RED:>5}" == "  red"
    assert Color.DARK_BLUE == "dark_blue"


def test_closed_calls_pass_through_and_failures_count(make_backend):
    breaker = make_backend().breaker("svc", failure_threshold=3)
    status = breaker.status()
    assert (status.state, status.failures, status.opened_at, status.retry_after) == (
        CLOSED,
        0,
        None,
        None,
    )
    assert breaker.call(lambda a, b=0: a + b, 1, b=2) == 3
    fail_n(breaker, 2)
    assert breaker.status().failures == 2
    assert breaker.state is CLOSED


def test_success_resets_the_failure_count(make_backend):
    breaker = make_backend().breaker("svc", failure_threshold=3)
    fail_n(breaker, 2)
    breaker.call(lambda: None)
    assert breaker.status().failures == 0
    fail_n(breaker, 2)
    assert breaker.state is CLOSED  # 2 + 2 non-consecutive failures do not trip at 3


def test_trips_at_threshold_and_open_refuses_without_calling(make_backend):
    clock = ManualClock()
    breaker = make_backend(clock=clock).breaker("svc", failure_threshold=3, reset_timeout=10)
    fail_n(breaker, 3)
    status = breaker.status()
    assert status.state is OPEN
    assert status.opened_at == pytest.approx(clock.time())
    assert status.retry_after == pytest.approx(10)
    clock.advance(4)
    called = []
    with pytest.raises(CircuitOpenError) as err:
        breaker.call(lambda: called.append(1))
    assert called == []
    assert err.value.name == "svc"
    assert err.value.retry_after == pytest.approx(6)
    assert err.value.opened_at == pytest.approx(clock.time() - 4)


def test_full_cycle_with_injected_clock(make_backend):
    clock = ManualClock()
    transitions = []
    breaker = make_backend(clock=clock).breaker(
        "cycle",
        failure_threshold=3,
        reset_timeout=10,
        on_transition=lambda name, old, new: transitions.append((name, old, new)),
    )
    fail_n(breaker, 3)
    assert breaker.state is OPEN
    clock.advance(9.999)
    with pytest.raises(CircuitOpenError) as err:
        breaker.call(lambda: "too early")
    assert err.value.retry_after == pytest.approx(0.001, abs=1e-6)
    clock.advance(0.001)
    # The trial call: closed -> open -> half_open -> closed.
    seen = []
    assert breaker.call(lambda: seen.append(breaker.state) or "ok") == "ok"
    assert seen == [HALF_OPEN]
    status = breaker.status()
    assert (status.state, status.failures, status.opened_at) == (CLOSED, 0, None)
    assert transitions == [
        ("cycle", CLOSED, OPEN),
        ("cycle", OPEN, HALF_OPEN),
        ("cycle", HALF_OPEN, CLOSED),
    ]
    # A failed trial re-opens with a fresh timer.
    fail_n(breaker, 3)
    clock.advance(10)
    with pytest.raises(BoomError):
        breaker.call(fail)
    status = breaker.status()
    assert status.state is OPEN
    assert status.opened_at == pytest.approx(clock.time())
    assert status.retry_after == pytest.approx(10)
    assert transitions[-2:] == [("cycle", OPEN, HALF_OPEN), ("cycle", HALF_OPEN, OPEN)]


def test_success_threshold_and_several_trial_slots(make_backend):
    clock = ManualClock()
    breaker = make_backend(clock=clock).breaker(
        "slots", failure_threshold=1, reset_timeout=5, success_threshold=2, half_open_max_calls=2
    )
    fail_n(breaker, 1)
    clock.advance(5)
    with breaker:
        assert breaker.state is HALF_OPEN
        assert breaker.status().retry_after == 0  # one of the two slots is still free
        with breaker:  # the second slot
            assert breaker.status().trial_calls == 2
            assert breaker.status().retry_after == pytest.approx(5)
            with pytest.raises(CircuitOpenError):
                breaker.call(lambda: "third")  # both slots taken
        assert breaker.state is HALF_OPEN  # one success of the two needed
    assert breaker.state is CLOSED


def test_success_threshold_with_one_slot_frees_the_slot_after_each_success(make_backend):
    clock = ManualClock()
    breaker = make_backend(clock=clock).breaker(
        "one-slot", failure_threshold=1, reset_timeout=5, success_threshold=3
    )
    fail_n(breaker, 1)
    clock.advance(5)
    breaker.call(lambda: None)
    breaker.call(lambda: None)
    assert breaker.state is HALF_OPEN
    breaker.call(lambda: None)
    assert breaker.state is CLOSED


def test_unreported_trial_slot_expires_and_its_late_report_is_ignored(make_backend):
    clock = ManualClock()
    breaker = make_backend(clock=clock).breaker("lease", failure_threshold=1, reset_timeout=5)
    fail_n(breaker, 1)
    clock.advance(5)
    crashed = breaker.__enter__()  # wins the trial slot, then "crashes": never reports
    assert crashed.state is HALF_OPEN
    with pytest.raises(CircuitOpenError) as err:
        breaker.call(lambda: None)
    assert err.value.retry_after == pytest.approx(5)
    clock.advance(5)  # the slot's lease ran out: a new trial round starts
    assert breaker.call(lambda: "recovered") == "recovered"
    assert breaker.state is CLOSED
    # The crashed caller comes back and reports a failure for its old round: ignored.
    breaker.__exit__(BoomError, BoomError("late"), None)
    assert breaker.state is CLOSED


def test_ignored_exceptions_do_not_count(make_backend):
    clock = ManualClock()
    breaker = make_backend(clock=clock).breaker(
        "ign", failure_threshold=2, reset_timeout=1, ignore=(KeyError, LookupError)
    )

    def not_found():
        raise KeyError("no such user")

    for _ in range(5):
        with pytest.raises(KeyError):
            breaker.call(not_found)
    assert breaker.status().failures == 0
    assert breaker.state is CLOSED
    fail_n(breaker, 2)
    assert breaker.state is OPEN
    clock.advance(1)
    with pytest.raises(KeyError):  # the dependency answered: the trial counts as a success
        breaker.call(not_found)
    assert breaker.state is CLOSED
    single = make_backend(clock=clock).breaker("ign2", failure_threshold=1, ignore=KeyError)
    with pytest.raises(KeyError):
        single.call(not_found)
    assert single.state is CLOSED


def test_decorator_and_context_manager(make_backend):
    breaker = make_backend().breaker("deco", failure_threshold=2)

    @breaker
    def double(x):
        """Doubles."""
        if x < 0:
            raise BoomError("negative")
        return 2 * x

    assert double(4) == 8
    assert double.__name__ == "double" and double.__doc__ == "Doubles."
    with pytest.raises(BoomError):
        double(-1)
    assert breaker.status().failures == 1
    with pytest.raises(BoomError):
        with breaker:
            raise BoomError("inside with")
    assert breaker.state is OPEN
    with pytest.raises(CircuitOpenError):
        double(1)
    with pytest.raises(CircuitOpenError):
        with breaker:
            pytest.fail("the block must not run while open")


def test_trip_and_reset(make_backend):
    transitions = []
    breaker = make_backend().breaker(
        "ops", reset_timeout=60, on_transition=lambda n, o, w: transitions.append((o, w))
    )
    breaker.trip()
    assert breaker.state is OPEN
    with pytest.raises(CircuitOpenError):
        breaker.call(lambda: None)
    breaker.reset()
    status = breaker.status()
    assert (status.state, status.failures) == (CLOSED, 0)
    assert breaker.call(lambda: 1) == 1
    assert transitions == [(CLOSED, OPEN), (OPEN, CLOSED)]
    breaker.reset()  # resetting a closed breaker is a no-op transition
    assert transitions == [(CLOSED, OPEN), (OPEN, CLOSED)]


def test_trial_outcome_from_before_a_reset_is_ignored(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    # Two callers of one breaker (each instance keeps its own in-flight trial).
    a, b = (backend.breaker("reset-round", failure_threshold=1, reset_timeout=5) for _ in "ab")
    fail_n(b, 1)
    clock.advance(5)
    a.__enter__()  # trial A takes the half-open slot and is still running...
    assert b.state is HALF_OPEN
    b.reset()  # ...when an operator resets the breaker
    assert b.state is CLOSED
    fail_n(b, 1)  # it trips again
    clock.advance(5)
    b.__enter__()  # trial B takes the slot of a new round
    assert b.state is HALF_OPEN
    # A's late failure belongs to a round started before the reset: it must not re-open.
    a.__exit__(BoomError, BoomError("late"), None)
    assert b.state is HALF_OPEN
    b.__exit__(None, None, None)  # B's success closes the breaker
    status = b.status()
    assert (status.state, status.failures, status.opened_at) == (CLOSED, 0, None)
    # The other way round: A's late success must not close the breaker during B's trial.
    fail_n(b, 1)
    clock.advance(5)
    a.__enter__()
    b.reset()
    fail_n(b, 1)
    clock.advance(5)
    b.__enter__()
    a.__exit__(None, None, None)
    assert b.state is HALF_OPEN
    b.__exit__(BoomError, BoomError("still down"), None)  # B's failure re-opens it
    status = b.status()
    assert (status.state, status.opened_at) == (OPEN, pytest.approx(clock.time()))


def test_state_is_shared_between_processes(make_backend):
    clock = ManualClock()
    first = make_backend(clock=clock)
    second = make_backend(clock=clock, namespace=first.namespace)  # another "process"
    a = first.breaker("shared", failure_threshold=2, reset_timeout=5)
    b = second.breaker("shared", failure_threshold=2, reset_timeout=5)
    fail_n(a, 1)
    fail_n(b, 1)
    assert a.state is OPEN and b.state is OPEN
    with pytest.raises(CircuitOpenError):
        b.call(lambda: None)
    other = first.breaker("other")
    assert other.state is CLOSED  # names isolate


def test_on_transition_errors_are_not_raised(make_backend):
    def broken(*_):
        raise RuntimeError("callback bug")

    breaker = make_backend().breaker("cb", failure_threshold=1, on_transition=broken)
    fail_n(breaker, 1)
    assert breaker.state is OPEN


def test_5_concurrent_record_failure_count_exactly_5(make_backend):
    needs_atomic_store(make_backend)
    breaker = make_backend().breaker("count", failure_threshold=100)
    barrier = threading.Barrier(5)

    def record():
        barrier.wait()
        breaker.record_failure()

    threads = [threading.Thread(target=record) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert breaker.status().failures == 5
    breaker.record_success()
    assert breaker.status().failures == 0


def test_concurrent_failures_trip_exactly_once(make_backend):
    needs_atomic_store(make_backend)
    transitions = []
    breaker = make_backend().breaker(
        "trip-once",
        failure_threshold=3,
        on_transition=lambda n, o, w: transitions.append((o, w)),
    )
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        with contextlib.suppress(BoomError, CircuitOpenError):
            breaker.call(fail)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert breaker.state is OPEN
    assert transitions == [(CLOSED, OPEN)]


def test_single_trial_call_when_8_threads_hit_half_open(make_backend):
    needs_atomic_store(make_backend)
    clock = ManualClock()  # frozen: the trial lease cannot run out during the test
    transitions = []
    breaker = make_backend(clock=clock).breaker(
        "trial",
        failure_threshold=1,
        reset_timeout=30,
        on_transition=lambda n, o, w: transitions.append((o, w)),
    )
    fail_n(breaker, 1)
    clock.advance(30)
    barrier = threading.Barrier(8)
    calls = []
    refused = []

    def trial():
        calls.append(1)
        time.sleep(1.0)  # still in flight while the others try, even on a loaded machine
        return "ok"

    def worker():
        barrier.wait()
        try:
            breaker.call(trial)
        except CircuitOpenError as exc:
            refused.append(exc.retry_after)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(refused) == 7
    assert all(r == pytest.approx(30) for r in refused)
    assert breaker.state is CLOSED
    assert transitions == [(CLOSED, OPEN), (OPEN, HALF_OPEN), (HALF_OPEN, CLOSED)]


def test_closed_call_costs_one_eventually_consistent_read(make_backend):
    backend = make_backend()
    client = getattr(backend, "client", None)
    if client is None or not hasattr(client, "meta"):
        pytest.skip("request counting needs a boto3 client")
    breaker = backend.breaker("cost", failure_threshold=5)
    requests = []

    def count(params, model, **_):
        requests.append((model.name, params.get("ConsistentRead")))

    client.meta.events.register("provide-client-params.dynamodb", count)
    try:
        breaker.call(lambda: None)
        assert requests == [("GetItem", False)]
        requests.clear()
        with pytest.raises(BoomError):
            breaker.call(fail)
        assert [name for name, _ in requests] == ["GetItem", "UpdateItem"]
        requests.clear()
        breaker.call(lambda: None)  # resets the count seen: one write
        assert [name for name, _ in requests] == ["GetItem", "UpdateItem"]
        requests.clear()
        breaker.call(lambda: None)
        assert requests == [("GetItem", False)]
        requests.clear()
        strict = backend.breaker("cost", failure_threshold=5, consistent_reads=True)
        strict.call(lambda: None)
        assert requests == [("GetItem", True)]
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb", count)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, InvalidKeyError),
        ({"name": 7}, InvalidKeyError),
        ({"name": "x" * 3000}, InvalidKeyError),
        ({"name": "b", "failure_threshold": 0}, ValueError),
        ({"name": "b", "failure_threshold": 1.5}, TypeError),
        ({"name": "b", "reset_timeout": 0}, ValueError),
        ({"name": "b", "reset_timeout": -1}, ValueError),
        ({"name": "b", "success_threshold": 0}, ValueError),
        ({"name": "b", "half_open_max_calls": 0}, ValueError),
        ({"name": "b", "ignore": ("KeyError",)}, TypeError),
        ({"name": "b", "on_transition": "print"}, TypeError),
    ],
)
def test_bad_configuration_raises_and_writes_nothing(make_backend, kwargs, error):
    backend = make_backend()
    kwargs = dict(kwargs)
    name = kwargs.pop("name")
    with pytest.raises(error) as err:
        backend.breaker(name, **kwargs)
    assert str(err.value)
    assert backend.breaker("b").status().failures == 0
    assert backend.breaker("b").state is CLOSED
