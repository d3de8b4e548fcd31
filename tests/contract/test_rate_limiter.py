"""Rate limiter contract: every backend must pass these unchanged (docs/ratelimit.md)."""

from __future__ import annotations

import threading

import pytest
from botocore.exceptions import EndpointConnectionError

from dynacoord import (
    ConfigurationError,
    InvalidKeyError,
    InvalidValueError,
    ManualClock,
    RateLimitedError,
)
from dynacoord.errors import BackendError
from tests.conftest import needs_atomic_store

#: what a caller sees when the client gave up: botocore's own error, or the backend's wrapper
RAISED = (EndpointConnectionError, BackendError)
#: the request an admission sends on each backend
WRITE = {"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "find_one_and_update"}


def _admitted(limiter, tries: int, n: int = 1) -> int:
    return sum(limiter.try_acquire(n).admitted for _ in range(tries))


def test_burst_then_refused_with_the_time_to_wait(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    limiter = backend.rate_limiter("api", rate=2, per=1, burst=3)
    first = limiter.try_acquire()
    assert first.admitted and bool(first) and first.retry_after == 0.0
    assert first.remaining == 2
    assert limiter.try_acquire().admitted and limiter.try_acquire().admitted
    refused = limiter.try_acquire()
    assert not refused and refused.retry_after == pytest.approx(0.5, abs=1e-5)
    assert limiter.try_acquire(2).retry_after == pytest.approx(1.0, abs=1e-5)
    # another process, which saw nothing yet, is refused by the store: the same wait
    other = backend.rate_limiter("api", rate=2, per=1, burst=3).try_acquire()
    assert not other and other.retry_after == pytest.approx(0.5, abs=1e-5)
    clock.advance(0.5)
    assert limiter.try_acquire().admitted
    assert not limiter.try_acquire().admitted
    clock.advance(10)  # idle: back to the burst, never more
    assert limiter.available() == 3
    assert _admitted(limiter, 5) == 3


def test_a_caller_that_saw_room_is_refused_by_the_store_when_there_is_none(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    a = backend.rate_limiter("race", rate=1, per=60, burst=3)
    b = backend.rate_limiter("race", rate=1, per=60, burst=3)
    assert a.try_acquire() and b.try_acquire() and a.try_acquire()
    # b last saw 2 of 3 taken: it sends its write, and the store's condition refuses it
    refused = b.try_acquire()
    assert not refused and refused.retry_after == pytest.approx(60.0, abs=1e-5)
    assert a.available() == 0


def test_calls_of_n_take_n(make_backend):
    clock = ManualClock()
    limiter = make_backend(clock=clock).rate_limiter("n", rate=10, per=60, burst=5)
    assert limiter.try_acquire(3).remaining == 2
    refused = limiter.try_acquire(3)
    assert not refused.admitted and refused.retry_after == pytest.approx(6.0, abs=1e-5)
    assert limiter.try_acquire(2).admitted
    assert limiter.available() == 0


def test_never_more_than_rate_x_elapsed_plus_burst_for_many_threads(make_backend):
    needs_atomic_store(make_backend)
    clock = ManualClock()
    backend = make_backend(clock=clock)
    rate, burst, threads = 4, 6, 6
    admitted: list[int] = []
    errors: list[BaseException] = []
    guard = threading.Lock()

    def round_of_calls() -> None:
        start = threading.Barrier(threads)

        def worker() -> None:
            limiter = backend.rate_limiter("many", rate=rate, per=1, burst=burst)  # one each
            try:
                start.wait()
                got = _admitted(limiter, 3)
                with guard:
                    admitted.append(got)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        assert not errors, errors

    round_of_calls()
    assert sum(admitted) == burst  # 18 tries at one instant: exactly the burst
    admitted.clear()
    clock.advance(1)
    round_of_calls()
    assert sum(admitted) == rate  # a second later: exactly what the rate gave back


def test_acquire_sleeps_the_stated_wait_or_gives_up_at_once(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    limiter = backend.rate_limiter("wait", rate=1, per=2, burst=1)
    assert limiter.acquire().admitted
    slept: list[float] = []
    real_sleep = clock.sleep

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)

    clock.sleep = sleep  # type: ignore[method-assign]
    assert limiter.acquire(timeout=5).admitted
    assert len(slept) == 1 and slept[0] == pytest.approx(2.0, abs=0.01)  # no poll in between
    # a wait that would end past the timeout: RateLimitedError at once, no sleep for nothing
    late = backend.rate_limiter("late", rate=1, per=10, burst=1)
    late.acquire()
    started = clock.monotonic()
    with pytest.raises(RateLimitedError) as limited:
        late.acquire(timeout=3)
    assert limited.value.name == "late"
    assert limited.value.retry_after == pytest.approx(10.0, abs=1e-5)
    assert clock.monotonic() == started and len(slept) == 1


def test_a_waiter_refused_again_spreads_its_next_wake(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    waiter = backend.rate_limiter("herd", rate=1, per=1, burst=1)
    other = backend.rate_limiter("herd", rate=1, per=1, burst=1)
    assert other.try_acquire()
    told: list[float] = []
    slept: list[float] = []
    real_sleep, real_try = clock.sleep, waiter.try_acquire

    def telling(n: int = 1):
        decision = real_try(n)
        told.append(decision.retry_after)
        return decision

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        real_sleep(seconds)
        if len(slept) < 4:
            assert other.try_acquire()  # another waiter takes the call first

    waiter.try_acquire = telling  # type: ignore[method-assign]
    clock.sleep = sleep  # type: ignore[method-assign]
    assert waiter.acquire(timeout=60)
    assert len(slept) == 4
    extra = [s - t for s, t in zip(slept, told, strict=False)]
    assert extra[0] == pytest.approx(0.001, abs=1e-4)  # the first wait is the one told
    for k, part in enumerate(extra[1:], start=1):  # then a random part up to 1, 2, 4 intervals
        assert 0 <= part - 0.001 <= 2 ** (k - 1) * waiter.interval + 1e-6
    assert max(extra[1:]) > 0.002  # waiters told one wait do not all wake together


def test_shards_share_the_rate_and_the_burst(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    limiter = backend.rate_limiter("wide", rate=8, per=1, burst=8, shards=4)
    assert limiter.max_n == 2
    # at one instant: never more than the burst, and every shard fills (random picks)
    assert _admitted(limiter, 60) == 8
    assert limiter.available() == 0
    clock.advance(0.5)  # each shard gives back 2 per second
    assert _admitted(limiter, 60) == 4
    with pytest.raises(InvalidValueError):
        limiter.try_acquire(3)  # more than one shard's burst: never admitted


def test_a_clock_ahead_takes_at_most_the_rate_of_its_skew(make_backend):
    clock = ManualClock()
    ahead = ManualClock(clock.time() + 1.0)  # one second ahead
    backend = make_backend(clock=clock)
    ontime = backend.rate_limiter("skew", rate=2, per=1, burst=2)
    early = make_backend(clock=ahead, namespace=backend.namespace).rate_limiter(
        "skew", rate=2, per=1, burst=2
    )
    assert _admitted(ontime, 3) == 2
    # a second ahead, the bucket looks full again to it: it takes rate x 1 s = 2 more
    assert _admitted(early, 3) == 2
    # which the on-time callers pay for: the next call waits 1 s more than it would have
    refused = backend.rate_limiter("skew", rate=2, per=1, burst=2).try_acquire()
    assert not refused and refused.retry_after == pytest.approx(1.5, abs=1e-5)
    # a caller that saw less waits less, then asks again: a lower bound, never an admission
    assert ontime.try_acquire().retry_after == pytest.approx(0.5, abs=1e-5)


def test_namespaces_isolate(make_backend):
    clock = ManualClock()
    one = make_backend(clock=clock).rate_limiter("shared", rate=1, per=60, burst=1)
    two = make_backend(clock=clock).rate_limiter("shared", rate=1, per=60, burst=1)
    assert one.try_acquire().admitted and two.try_acquire().admitted
    assert not one.try_acquire().admitted


def test_a_refusal_already_seen_sends_nothing(lossy):
    clock = ManualClock()
    limiter = lossy.backend(clock=clock).rate_limiter("seen", rate=1, per=60, burst=1)
    assert limiter.try_acquire().admitted
    sent = len(lossy.log)
    assert not limiter.try_acquire().admitted
    assert len(lossy.log) == sent  # the tat this object saw refuses it: no request


# -- lost responses ------------------------------------------------------------------------------


def test_an_admission_whose_answer_was_lost_counts_once(lossy):
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    limiter = backend.rate_limiter("lost", rate=1, per=60, burst=5)
    other = backend.rate_limiter("lost", rate=1, per=60, burst=5)
    assert limiter.try_acquire().admitted  # the item exists
    # in the gap before the client's retry, another process is admitted: the retry must still
    # recognise its own applied write (and there is room: counted again, it would apply)
    lossy.lose_next(operation=WRITE[lossy.kind], then=lambda: other.try_acquire())
    assert limiter.try_acquire().admitted
    assert lossy.lost == 1
    assert limiter.available() == 2  # 3 admitted, 3 counted


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "unsent"])
def test_a_call_that_raised_is_recognised_by_the_next(lossy, applied):
    clock = ManualClock()
    limiter = lossy.backend(clock=clock).rate_limiter("raised", rate=1, per=60, burst=2)
    assert limiter.available() == 2
    lossy.raise_next(operation=WRITE[lossy.kind], applied=applied)
    with pytest.raises(RAISED):
        limiter.try_acquire()
    assert limiter.try_acquire().admitted  # its own applied write, or sent now: counted once
    assert limiter.available() == 1
    assert limiter.try_acquire().admitted
    assert not limiter.try_acquire().admitted


def test_a_forked_child_never_claims_its_parents_raised_call(lossy, monkeypatch):
    import dynacoord.ratelimit

    clock = ManualClock()
    limiter = lossy.backend(clock=clock).rate_limiter("fork", rate=1, per=60, burst=3)
    lossy.raise_next(operation=WRITE[lossy.kind], applied=True)
    with pytest.raises(RAISED):
        limiter.try_acquire()  # applied: 1 spent, and the parent may still send it again
    parent = dynacoord.ratelimit.os.getpid()
    monkeypatch.setattr(dynacoord.ratelimit.os, "getpid", lambda: parent + 1)  # in a child
    assert limiter.try_acquire().admitted  # the child's own call: spent anew
    assert limiter.available() == 1


# -- bad input -------------------------------------------------------------------------------------


#: settings a limiter refuses, and the error (one backend per kind makes them all: a backend of
#: moto costs a second to set up)
BAD_SETTINGS = [
    ({"name": "", "rate": 1}, InvalidKeyError),
    ({"name": 5, "rate": 1}, InvalidKeyError),
    ({"name": "x" * 3000, "rate": 1}, InvalidKeyError),
    ({"name": "r", "rate": 0}, ConfigurationError),
    ({"name": "r", "rate": -1}, ConfigurationError),
    ({"name": "r", "rate": float("nan")}, ConfigurationError),
    ({"name": "r", "rate": float("inf")}, ConfigurationError),
    ({"name": "r", "rate": "5"}, TypeError),
    ({"name": "r", "rate": True}, TypeError),
    ({"name": "r", "rate": 1, "per": 0}, ConfigurationError),
    ({"name": "r", "rate": 1, "per": -2}, ConfigurationError),
    ({"name": "r", "rate": 1, "burst": 0}, ConfigurationError),
    ({"name": "r", "rate": 1, "burst": 2.5}, TypeError),
    ({"name": "r", "rate": 1, "shards": 0}, ConfigurationError),
    ({"name": "r", "rate": 100, "burst": 200, "shards": 101}, ConfigurationError),
    ({"name": "r", "rate": 4, "burst": 2, "shards": 4}, ConfigurationError),
]

#: calls a limiter (rate 1/s, burst 3) refuses before writing anything, and the error
BAD_CALLS = [
    (lambda limiter: limiter.try_acquire(0), InvalidValueError),
    (lambda limiter: limiter.try_acquire(4), InvalidValueError),
    (lambda limiter: limiter.try_acquire("1"), TypeError),
    (lambda limiter: limiter.try_acquire(True), TypeError),
    (lambda limiter: limiter.acquire(timeout=-1), ValueError),
    (lambda limiter: limiter.acquire(4, timeout=1), InvalidValueError),
]


def test_bad_settings_and_calls_raise_and_write_nothing(make_backend):
    backend = make_backend()
    for kwargs, error in BAD_SETTINGS:
        with pytest.raises(error):
            backend.rate_limiter(**kwargs)
    limiter = backend.rate_limiter("bad", rate=1, per=1, burst=3)
    for call, error in BAD_CALLS:
        with pytest.raises(error):
            call(limiter)
    assert limiter.available() == 3


def test_metrics_name_what_happened(make_backend):
    from tests.test_metrics import Recorder

    recorder = Recorder()
    limiter = make_backend(metrics=recorder, clock=ManualClock()).rate_limiter(
        "m", rate=1, per=60, burst=1
    )
    assert limiter.try_acquire().admitted
    assert not limiter.try_acquire().admitted
    names = recorder.names("ratelimit")
    assert names.count("RateAdmitted") == 1 and names.count("RateLimited") == 1
