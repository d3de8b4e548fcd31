"""Model-based test of the shared circuit breaker against an in-memory reference state machine.

Calls succeed or fail, trial callers may be abandoned (a process that took the half-open slot and
died), operators trip and reset, and the ``ManualClock`` advances past ``reset_timeout`` (also
exactly onto it). After every step the stored status must match the model: closed with the
failure count since the last success, open since ``opened_at``, or half-open with its slot.
Runs on every contract backend (moto, DynamoDB Local, Redis, MongoDB).

Writes applied and then raised (issue 49, section 2): a failure's count applies and its call
raises to the caller (or raises unsent). A count that reached the threshold without its trip
(the caller got the error instead) is recognised by the next admission, which trips the breaker
and refuses the call, instead of letting calls through a breaker that should be open.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from dynacoord import CircuitOpenError, ManualClock
from dynacoord._clock import now_ms
from dynacoord.breaker import State
from dynacoord.errors import BackendError
from tests.reliability.conftest import run_model

THRESHOLD = 3
RESET_MS = 2000


class BoomError(Exception):
    pass


class InjectedError(BackendError):
    """The client gave up on a write (its retries spent): maybe applied."""


class RaisingStore:
    """The breaker's store, whose next write named in ``armed`` raises to the breaker: after
    it applied (``applied``), or unsent."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.armed: tuple[str, bool] | None = None

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        armed = self.armed
        if armed is None or armed[0] != name:
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            self.armed = None
            if not armed[1]:
                raise InjectedError(f"injected: {name} not sent")
            attr(*args, **kwargs)
            raise InjectedError(f"injected: {name} applied, its answer lost")

        return call


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class BreakerMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.breaker = factory(clock=self.clock).breaker(
                "dep", failure_threshold=THRESHOLD, reset_timeout=RESET_MS / 1000
            )
            self.store = RaisingStore(self.breaker._store)
            self.breaker._store = self.store
            self.state = State.CLOSED
            self.failures = 0
            self.opened_at: int | None = None
            self.trial_started: int | None = None
            self.ran = 0

        def now(self) -> int:
            return now_ms(self.clock)

        def _admitted(self) -> bool:
            """Model of admission; moves open -> half_open when a trial starts."""
            now = self.now()
            if self.state is State.CLOSED and self.failures >= THRESHOLD:
                self._open()  # a count that reached the threshold without its trip
                return False
            if self.state is State.CLOSED:
                return True
            if self.state is State.OPEN:
                assert self.opened_at is not None
                if now < self.opened_at + RESET_MS:
                    return False
            elif self.trial_started is not None and now < self.trial_started + RESET_MS:
                return False  # half-open, the one slot is taken and its lease still runs
            self.state = State.HALF_OPEN
            self.trial_started = now
            return True

        def _open(self) -> None:
            self.state = State.OPEN
            self.opened_at = self.now()
            self.trial_started = None

        def _outcome(self, ok: bool, trial: bool) -> None:
            if not trial:
                if ok:
                    self.failures = 0
                else:
                    self.failures += 1
                    if self.failures >= THRESHOLD:
                        self._open()
                return
            if ok:
                self.state, self.failures, self.opened_at = State.CLOSED, 0, None
                self.trial_started = None
            else:
                self._open()

        @rule(ok=st.booleans())
        def call(self, ok: bool) -> None:
            trial = self.state is not State.CLOSED
            admitted = self._admitted()

            def dependency() -> str:
                self.ran += 1
                if not ok:
                    raise BoomError()
                return "fine"

            before = self.ran
            if not admitted:
                with pytest.raises(CircuitOpenError) as err:
                    self.breaker.call(dependency)
                assert err.value.retry_after > 0
                assert self.ran == before, "an open breaker must not make the call"
                return
            if ok:
                assert self.breaker.call(dependency) == "fine"
            else:
                with pytest.raises(BoomError):
                    self.breaker.call(dependency)
            assert self.ran == before + 1
            self._outcome(ok, trial)

        @rule(applied=st.booleans())
        def failure_raises(self, applied: bool) -> None:
            """A failing call whose failure count applies and then raises, or raises unsent."""
            if self.state is not State.CLOSED or self.failures >= THRESHOLD:
                return  # not a counted failure (a trial's or a refusal)
            self.store.armed = ("record_failure", applied)

            def dependency() -> str:
                self.ran += 1
                raise BoomError()

            with pytest.raises(InjectedError):
                self.breaker.call(dependency)
            assert self.store.armed is None
            if applied:
                self.failures += 1  # counted; no trip: the caller got the error instead

        @precondition(lambda self: self.state is not State.CLOSED)
        @rule()
        def abandoned_trial(self) -> None:
            """A caller takes the trial slot and never reports (its process died)."""
            if not self._admitted():
                with pytest.raises(CircuitOpenError):
                    self.breaker.__enter__()
                return
            self.breaker.__enter__()  # never exited

        @rule()
        def trip(self) -> None:
            self.breaker.trip()
            self._open()

        @rule()
        def reset(self) -> None:
            self.breaker.reset()
            self.state, self.failures, self.opened_at, self.trial_started = (
                State.CLOSED,
                0,
                None,
                None,
            )

        @rule(ms=st.one_of(st.sampled_from([0, 1, RESET_MS - 1, RESET_MS]), st.integers(0, 2500)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            status = self.breaker.status()
            assert status.state is self.state
            if self.state is State.CLOSED and self.failures < THRESHOLD:
                assert status.failures == self.failures
                assert status.retry_after is None
            elif self.state is State.OPEN:
                assert self.opened_at is not None
                assert status.opened_at is not None
                assert round(status.opened_at * 1000) == self.opened_at
                expected = max(0, self.opened_at + RESET_MS - self.now()) / 1000
                assert status.retry_after == pytest.approx(expected, abs=0.002)

    return BreakerMachine


def test_breaker_model(make_backend: Any) -> None:
    """The breaker state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)


def test_breaker_failure_at_the_threshold_applied_and_raised(make_backend: Any) -> None:
    """The history the generator reaches, replayed: the failure that reaches the threshold is
    counted, its call raises before the trip; the next call finds the count and trips."""
    machine = make_machine(make_backend)()
    try:
        for _ in range(THRESHOLD - 1):
            machine.call(ok=False)
            machine.store_agrees_with_model()
        machine.failure_raises(applied=True)
        machine.store_agrees_with_model()
        machine.call(ok=True)  # refused: the breaker is open now
        machine.store_agrees_with_model()
    finally:
        machine.teardown()
    assert machine.state is State.OPEN
