"""Model-based test of the failure-rate breaker (``policy=FailureRate(...)``) against a reference
model, on every contract backend.

Three processes (three breakers on one store, one ``ManualClock``) make calls that succeed, fail,
run slow or raise an ignored error; processes flush their counts, operators trip and reset, and
the clock advances (onto bucket edges, the flush interval and ``reset_timeout`` too). The model
holds what the policy promises, written plainly: each process's counts not written yet and the
window it last saw, written every ``FLUSH_S`` or at once after a failure that could trip by that
window; the stored window of the current generation; the breaker opens when a write leaves at
least ``MIN_CALLS`` calls in the window with at least ``THRESHOLD`` of them failed, and a trip or
reset starts a new generation into which older counts are never written. After every step the
stored state (and ``opened_at``) and each process's unwritten counts and last seen window must
match the model's.

Writes applied and then raised (issue 49, section 2): a flush's window write applies and its call
raises (or raises unsent). The model holds what the breaker promises: the write is kept as it was
and sent again first by the next flush, under its own token, so the store adds its counts exactly
once (the re-send of an applied write adds nothing and answers the window as stored); counts
made since go in a write of their own; a generation that moved on, or a token past its time,
drops them.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dynacoord import CircuitOpenError, FailureRate, ManualClock
from dynacoord._clock import now_ms
from dynacoord._writers import token_ms
from dynacoord.breaker import State
from dynacoord.errors import BackendError
from tests.reliability.conftest import run_model

PROCESSES = 3
THRESHOLD = 0.5
MIN_CALLS = 4
WINDOW_MS = 2000
BUCKETS = 4
BUCKET_MS = WINDOW_MS // BUCKETS
FLUSH_S = 1.0
SLOW_S = 0.3
RESET_MS = 3000


class BoomError(Exception):
    pass


class _Process:
    """The model of one process's share of the window."""

    def __init__(self, mono: float) -> None:
        self.gen = 0
        self.pending: dict[int, list[int]] = {}
        self.seen: dict[int, tuple[int, int]] | None = None
        self.flushed_at = mono
        # a write whose call raised: its counts, whether it applied, until when its token holds
        self.unanswered: tuple[dict[int, tuple[int, int]], bool, int] | None = None

    def adopt(self, gen: int) -> None:
        if gen != self.gen:
            self.gen, self.pending, self.seen = gen, {}, None
            self.unanswered = None


class InjectedError(BackendError):
    """The client gave up on a window write (its retries spent): maybe applied."""


class RaisingStore:
    """A process's breaker store whose next window write, when armed, raises to the breaker:
    after it applied (``"applied"``: only a write the store took) or before it was sent."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.armed: str | None = None
        self.fired: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def add_window(self, *args: Any, **kwargs: Any) -> Any:
        armed, self.armed = self.armed, None
        if armed == "unsent":
            self.fired = armed
            raise InjectedError("injected: window write not sent")
        stored = self._store.add_window(*args, **kwargs)
        if armed == "applied" and stored is not None:
            self.fired = armed
            raise InjectedError("injected: window write applied, its answer lost")
        return stored


def _totals(counts: Any, oldest: int) -> tuple[int, int]:
    calls = failures = 0
    for bucket, (c, f) in counts.items():
        if bucket >= oldest:
            calls += c
            failures += f
    return calls, failures


def _trips(calls: int, failures: int) -> bool:
    return calls >= MIN_CALLS and failures >= THRESHOLD * calls


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class RateMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            first = factory(clock=self.clock)
            backends = [first] + [
                factory(clock=self.clock, namespace=first.namespace) for _ in range(PROCESSES - 1)
            ]
            policy = FailureRate(
                threshold=THRESHOLD,
                minimum_calls=MIN_CALLS,
                window=WINDOW_MS / 1000,
                buckets=BUCKETS,
                slow_call_seconds=SLOW_S,
                flush_interval=FLUSH_S,
            )
            self.breakers = [
                b.breaker("dep", policy=policy, reset_timeout=RESET_MS / 1000, ignore=(KeyError,))
                for b in backends
            ]
            self.stores = [RaisingStore(b._store) for b in self.breakers]
            for breaker, store in zip(self.breakers, self.stores, strict=True):
                breaker._store = store
            self.procs = [_Process(self.clock.monotonic()) for _ in range(PROCESSES)]
            # the store
            self.exists = False
            self.state = State.CLOSED
            self.opened_at: int | None = None
            self.gen = 0
            self.window: dict[int, list[int]] = {}

        def now(self) -> int:
            return now_ms(self.clock)

        def oldest(self) -> int:
            return self.now() // BUCKET_MS - BUCKETS + 1

        def _open(self) -> None:
            self.exists = True
            self.state, self.opened_at = State.OPEN, self.now()

        def _new_gen(self) -> None:
            self.gen += 1
            self.window = {}

        def _add(self, p: _Process, counts: dict[int, tuple[int, int]]) -> bool:
            """One window write of ``counts`` by ``p`` as the store takes it: added while closed
            in ``p``'s generation (True), else refused."""
            if self.state is not State.CLOSED or self.gen != p.gen:
                return False
            self.exists = True
            for bucket, (c, f) in counts.items():
                stored = self.window.setdefault(bucket, [0, 0])
                stored[0] += c
                stored[1] += f
            return True

        def _flush(self, p: _Process, raised: str | None = None) -> None:
            """``p``'s flush; ``raised``: its write of new counts raises, after it applied
            ("applied") or unsent ("unsent")."""
            oldest = self.oldest()
            batch, p.pending = p.pending, {}
            unanswered, p.unanswered = p.unanswered, None
            p.flushed_at = self.clock.monotonic()
            answered = False
            if unanswered is not None:
                kept, applied, until = unanswered
                old = {b: cf for b, cf in kept.items() if b >= oldest}
                if old and self.now() < until:
                    if raised is not None:  # the re-send is the write that raises again
                        applied = applied or self._again(p, old, raised)
                        p.unanswered = (kept, applied, self._token_until(p))
                        self._pend(p, batch)
                        return
                    if applied:
                        # recognised by its token: nothing added, the window as stored
                        if self.state is State.CLOSED and self.gen == p.gen:
                            p.seen = {b: (c, f) for b, (c, f) in self.window.items()}
                        else:  # the store's answer for a window that moved on
                            p.seen = self._seen_of(p)
                    elif not self._add(p, old):
                        p.seen = None
                        return
                    else:
                        p.seen = {b: (c, f) for b, (c, f) in self.window.items()}
                    answered = True
            counts = {b: cf for b, cf in batch.items() if b >= oldest}
            if counts:
                if raised is not None:
                    applied = raised == "applied" and self._add(p, counts)
                    p.unanswered = (dict(counts), applied, self._token_until(p))
                    return
                if not self._add(p, counts):
                    p.seen = None  # refused: a window that is gone
                    return
                p.seen = {b: (c, f) for b, (c, f) in self.window.items()}
                answered = True
            if not answered:
                return
            if (
                self.state is State.CLOSED
                and self.gen == p.gen
                and _trips(*_totals(p.seen or {}, oldest))
            ):
                self._open()
                self._new_gen()

        def _again(self, p: _Process, counts: dict[int, tuple[int, int]], raised: str) -> bool:
            """A re-send of an unapplied write that raises again: applied now or not."""
            return raised == "applied" and self._add(p, counts)

        def _pend(self, p: _Process, batch: dict[int, list[int]]) -> None:
            for bucket, (c, f) in batch.items():
                pending = p.pending.setdefault(bucket, [0, 0])
                pending[0] += c
                pending[1] += f

        def _process(self, p: _Process) -> int:
            return self.procs.index(p)

        def _token_until(self, p: _Process) -> int:
            """Until when the token of ``p``'s unanswered write is recognised (its client's
            retry window, which the token carries)."""
            window = self.breakers[self._process(p)]._window
            assert window is not None and window.unanswered is not None
            write = window.unanswered[1]
            # never sent (raised unsent): it takes its slot and token when it is sent
            return token_ms(write.token) if write.token else 2**62

        def _seen_of(self, p: _Process) -> dict[int, tuple[int, int]] | None:
            """The window a recognised re-send answered after the breaker moved on (a trip or
            reset since): what is left of the old generation on the item, which each backend
            prunes in its own way; read from the breaker."""
            window = self.breakers[self._process(p)]._window
            assert window is not None
            if window.seen is None:
                return None
            return {b: (c, f) for b, c, f in window.seen.buckets}

        def _count(self, p: _Process, failed: bool) -> None:
            counts = p.pending.setdefault(self.now() // BUCKET_MS, [0, 0])
            counts[0] += 1
            counts[1] += failed
            oldest = self.oldest()
            calls, failures = _totals(p.seen or {}, oldest)
            mine = _totals(p.pending, oldest)
            could_trip = _trips(calls + mine[0], failures + mine[1])
            if self.clock.monotonic() - p.flushed_at >= FLUSH_S or (failed and could_trip):
                self._flush(p)

        @rule(
            i=st.integers(0, PROCESSES - 1),
            outcome=st.sampled_from(["ok", "ok", "fail", "fail", "slow", "ignored"]),
        )
        def call(self, i: int, outcome: str) -> None:
            p, breaker = self.procs[i], self.breakers[i]
            p.adopt(self.gen)  # the read that admits the call
            trial = False
            if self.state is State.OPEN:
                assert self.opened_at is not None
                if self.now() < self.opened_at + RESET_MS:
                    with pytest.raises(CircuitOpenError):
                        breaker.call(lambda: None)
                    return
                trial = True

            def dependency() -> str:
                if outcome == "fail":
                    raise BoomError()
                if outcome == "ignored":
                    raise KeyError("not found")
                if outcome == "slow":
                    self.clock.advance(SLOW_S + 0.05)
                return outcome

            expected = {"fail": BoomError, "ignored": KeyError}.get(outcome)
            if expected is None:
                assert breaker.call(dependency) == outcome
            else:
                with pytest.raises(expected):
                    breaker.call(dependency)
            failed = outcome in ("fail", "slow")
            if trial:
                if failed:
                    self._open()  # reopened: the generation started at the trip stays
                else:
                    self.state, self.opened_at = State.CLOSED, None
                return
            self._count(p, failed)

        @rule(i=st.integers(0, PROCESSES - 1))
        def flush(self, i: int) -> None:
            self.breakers[i].flush()
            self._flush(self.procs[i])

        @rule(i=st.integers(0, PROCESSES - 1), kind=st.sampled_from(["applied", "unsent"]))
        def flush_raises(self, i: int, kind: str) -> None:
            """A flush whose (first) window write raises to the breaker: applied, or unsent."""
            store = self.stores[i]
            store.armed, store.fired = kind, None
            with contextlib.suppress(InjectedError):
                self.breakers[i].flush()
            store.armed, fired = None, store.fired
            self._flush(self.procs[i], raised=fired)

        @rule(i=st.integers(0, PROCESSES - 1))
        def trip(self, i: int) -> None:
            self.breakers[i].trip()
            self._open()
            self._new_gen()
            self.procs[i].adopt(self.gen)

        @rule(i=st.integers(0, PROCESSES - 1))
        def reset(self, i: int) -> None:
            self.breakers[i].reset()
            if not self.exists:
                return  # nothing stored: nothing to reset
            self.state, self.opened_at = State.CLOSED, None
            self._new_gen()
            self.procs[i].adopt(self.gen)

        @rule(
            ms=st.one_of(
                st.sampled_from([1, BUCKET_MS, int(FLUSH_S * 1000), WINDOW_MS, RESET_MS]),
                st.integers(0, RESET_MS + 500),
            )
        )
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            status = self.breakers[0].status()
            assert status.state is self.state
            if self.state is State.OPEN:
                assert self.opened_at is not None and status.opened_at is not None
                assert round(status.opened_at * 1000) == self.opened_at

        @invariant()
        def processes_agree_with_model(self) -> None:
            for p, breaker in zip(self.procs, self.breakers, strict=True):
                window = breaker._window
                assert window is not None
                assert window.gen == p.gen
                assert {b: tuple(cf) for b, cf in window.pending.items()} == {
                    b: tuple(cf) for b, cf in p.pending.items()
                }
                if p.unanswered is None:
                    assert window.unanswered is None
                else:
                    assert window.unanswered is not None
                    assert {b: tuple(cf) for b, cf in window.unanswered[0].items()} == {
                        b: tuple(cf) for b, cf in p.unanswered[0].items()
                    }
                if p.seen is None:
                    assert window.seen is None
                else:
                    assert window.seen is not None
                    stored = {b: (c, f) for b, c, f in window.seen.buckets}
                    oldest = self.oldest()
                    assert _totals(stored, oldest) == _totals(p.seen, oldest)

    return RateMachine


def test_failure_rate_breaker_model(make_backend: Any) -> None:
    """The failure-rate breaker on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
