"""Model-based test of the rate limiter under faults, with an exact oracle.

A hypothesis ``RuleBasedStateMachine`` drives three processes sharing one limiter (4 per second,
burst 3), each with its own backend, ``RateLimiter`` object and ``ManualClock`` (skewed: one runs
150 ms ahead, one 150 ms behind; all advance together). Its generators:

* calls of ``try_acquire(n)`` for n of 1 or 2;
* lost answers of both kinds on a call: applied and re-sent by the client's own retry
  (``lossy.lose_next``), applied and raised, or raised unsent (``lossy.raise_next``); after a
  raise the caller may call again at once, later, or never (a kill);
* kills (a process is replaced by one with a new limiter object: what it saw and the writes it
  had not had answered are gone with it) and clock moves of any size, also onto the instant the
  next call would be admitted.

The oracle is GCRA itself, replayed on every write that applied, at the clock of the caller that
sent it: the store's ``tat`` after every step is exactly the model's (a write counted twice, or
an admission not counted, shows at once); every answer is the model's (admitted exactly when
``max(tat, now) + n x T - now <= burst x T`` at the caller's clock, or when it is the caller's own
write that had applied before its call raised); and over the admissions, each at the real time
its write applied, any interval ``[t0, t1]`` holds at most ``rate x (t1 - t0 + 0.3 s) + burst``
(0.3 s: the spread of the clocks). Whether a raised write applied is read from the store (``tat``
moved), never assumed.

Runs on DynamoDB Local, Redis and MongoDB (mongomock), through the ``lossy`` fixture.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynacoord import ManualClock
from dynacoord.errors import BackendError
from dynacoord.testing import unique_name
from tests.reliability.conftest import DELIVERY_STRESS_SCALE, run_model

RATE, BURST = 4, 3
NAME = "rate"
SKEW_MS = (0, 150, -150)
SPREAD_S = (max(SKEW_MS) - min(SKEW_MS)) / 1000
PROCESSES = st.integers(0, len(SKEW_MS) - 1)
COUNTS = st.sampled_from([1, 1, 2])
ADVANCE_MS = st.one_of(st.sampled_from([0, 1, 149, 150, 151, 250]), st.integers(0, 1500))
#: no fault; applied and re-sent; applied and raised; raised unsent
FAULTS = st.sampled_from(["none", "none", "resent", "raised", "unsent"])
MICROS = 1_000_000


def _raised_types() -> tuple[type[BaseException], ...]:
    # botocore's connection errors: EndpointConnectionError (the fault injected as raised), and a
    # lost answer's ReadTimeoutError raised instead of retried once the client's retry quota
    # ran out (standard mode: a long run of lost answers on one client), applied all the same
    from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

    return (EndpointConnectionError, ReadTimeoutError, BackendError)


def make_machine(lossy: Any) -> type[RuleBasedStateMachine]:
    raised_types = _raised_types()

    class RateLimiterMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ns = unique_name("rate")
            self.start = ManualClock().time()
            self.procs: list[dict[str, Any]] = [self._spawn(i) for i in range(len(SKEW_MS))]
            limiter = self.procs[0]["limiter"]
            self.interval = limiter._interval_us  # T, as the limiter rounds it
            self.tolerance = limiter._tolerance_us
            self.tat: int | None = None  # the model's
            self.admitted: list[tuple[int, int]] = []  # (real µs the write applied, n)
            # (process, n) -> whether that process's raised write of n had applied
            self.pending: dict[tuple[int, int], bool] = {}

        def _spawn(self, index: int, clock: ManualClock | None = None) -> dict[str, Any]:
            if clock is None:
                clock = ManualClock(self.start + SKEW_MS[index] / 1000)
            backend = lossy.backend(clock=clock, namespace=self.ns)
            limiter = backend.rate_limiter(NAME, rate=RATE, per=1, burst=BURST)
            return {"clock": clock, "limiter": limiter, "skew": SKEW_MS[index] * 1000}

        def stored(self) -> int | None:
            return self.procs[0]["limiter"]._store.read(NAME, None)

        def now(self, proc: dict[str, Any]) -> int:
            return int(proc["clock"].time() * MICROS)  # as the limiter reads it

        def admissible(self, now: int, n: int) -> bool:
            base = now if self.tat is None else max(self.tat, now)
            return base + n * self.interval - now <= self.tolerance

        def apply(self, proc: dict[str, Any], now: int, n: int) -> None:
            base = now if self.tat is None else max(self.tat, now)
            self.tat = base + n * self.interval
            self.admitted.append((now - proc["skew"], n))

        def _arm(self, fault: str) -> None:
            if fault == "resent":
                lossy.lose_next()
            elif fault in ("raised", "unsent"):
                lossy.raise_next(applied=fault == "raised")

        def _disarm(self) -> None:
            # a fault armed for a write that was not sent (refused from what the object saw)
            # must not fire on some later, unrelated request
            with lossy._faults._lock:
                lossy._faults._slots.clear()

        def call(self, p: int, n: int, fault: str) -> bool:
            """One try_acquire judged by the model; False when it raised."""
            proc = self.procs[p]
            now = self.now(proc)
            mine = self.pending.pop((p, n), None)
            expected = mine is True or self.admissible(now, n)
            before = self.stored()
            self._arm(fault)
            try:
                decision = proc["limiter"].try_acquire(n)
            except raised_types:
                self._disarm()
                applied = self.stored() != before
                if mine is True:
                    assert not applied, "a write recognised as applied was counted again"
                    self.pending[(p, n)] = True
                else:
                    if applied:
                        assert expected, "a raised write applied past the limit"
                        self.apply(proc, now, n)
                    self.pending[(p, n)] = applied
                return False
            finally:
                self._disarm()
            assert decision.admitted is expected, (
                f"answered {decision}, the model says {expected} (tat {self.tat}, now {now})"
            )
            if decision.admitted:
                if mine is not True:
                    self.apply(proc, now, n)
                assert decision.retry_after == 0.0
            else:
                assert decision.retry_after > 0
                base = now if self.tat is None else max(self.tat, now)
                # a lower bound of the real wait (a refusal from what the object saw), never more
                assert (
                    decision.retry_after * MICROS
                    <= base + n * self.interval - now - self.tolerance + 1
                )
            return True

        # -- rules -------------------------------------------------------------------------

        @rule(p=PROCESSES, n=COUNTS, fault=FAULTS, again=st.booleans())
        def try_acquire(self, p: int, n: int, fault: str, again: bool) -> None:
            if not self.call(p, n, fault) and again:
                self.call(p, n, "none")  # the caller's next attempt, at once

        @rule(p=PROCESSES)
        def kill(self, p: int) -> None:
            """The process dies (what it saw and its unanswered writes go with it): a new one,
            with a new limiter object, takes its place on the same clock."""
            self.procs[p] = self._spawn(p, self.procs[p]["clock"])
            for key in [k for k in self.pending if k[0] == p]:
                del self.pending[key]

        @rule(ms=ADVANCE_MS)
        def advance(self, ms: int) -> None:
            for proc in self.procs:
                proc["clock"].advance(ms / 1000)

        @precondition(lambda self: self.tat is not None)
        @rule(p=PROCESSES, n=COUNTS, delta=st.sampled_from([-1, 0, 1]))
        def advance_onto_admission(self, p: int, n: int, delta: int) -> None:
            """Move the clocks to the microsecond a call of ``n`` by ``p`` becomes admissible
            (or one before, or after): the boundary case."""
            assert self.tat is not None
            gap = self.tat + n * self.interval - self.tolerance + delta - self.now(self.procs[p])
            if gap > 0:
                for proc in self.procs:
                    proc["clock"].advance(gap / MICROS)

        @invariant()
        def the_store_holds_the_model(self) -> None:
            assert self.stored() == self.tat, f"stored {self.stored()}, model {self.tat}"

        @invariant()
        def never_more_than_rate_x_elapsed_plus_burst(self) -> None:
            times = sorted(self.admitted)
            for i, (t0, _) in enumerate(times):
                total = 0
                for t1, n in times[i:]:
                    total += n
                    bound = RATE * ((t1 - t0) / MICROS + SPREAD_S) + BURST
                    assert total <= bound + 1e-6, f"{total} admitted in [{t0}, {t1}]: {times}"

    return RateLimiterMachine


LOSSY_KINDS = ["dynamodb", "redis", "mongo"]


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_rate_limiter_model(lossy: Any) -> None:
    """The store's tat is GCRA replayed on every applied write, every answer is the model's,
    and no interval admits more than rate x (elapsed + clock spread) + burst, under skewed
    clocks, kills and lost answers of every kind."""
    run_model(make_machine(lossy), lossy)


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_stress_rate_limiter_model(lossy: Any) -> None:
    """``make stress``: the same model with 20 times the examples and twice the steps."""
    run_model(make_machine(lossy), lossy, scale=DELIVERY_STRESS_SCALE)
