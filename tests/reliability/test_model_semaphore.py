"""Model-based test of the leased semaphore under faults, with an exact oracle.

A hypothesis ``RuleBasedStateMachine`` drives three processes sharing one semaphore (limit 2),
each with its own backend, ``Semaphore`` object and ``ManualClock`` (skewed: one runs 150 ms
ahead, one 150 ms behind; all advance together). Its generators:

* acquires (non-blocking) with any TTL, renewals and releases of the permits a process holds;
* lost answers of both kinds on an acquire or a release: applied and re-sent by the client's own
  retry (``lossy.lose_next``), applied and raised, or raised unsent (``lossy.raise_next``): the
  caller's next call must recognise its own write;
* kills (a process stops renewing and is replaced: its permits are left to expire) and
  freezes (time jumps past every TTL while the processes hold what they hold);
* clock moves of any size, also exactly onto a permit's expiry.

The oracle judges each write against the store's state, never excusing a fault: after every
acquire that reached the store (answered or raised), every permit live before it at the
acquirer's clock is still there, the item read at that clock holds at most ``LIMIT`` live permits (not released, ``expires_at_ms > now``) and at most ``2 * LIMIT``
slots, and a permit new to the store has a fence above every fence handed out before. An acquire
refused as full saw ``LIMIT`` live permits at its clock (no permit leaks); a release answers True
exactly when the permit was live before it (also when its answer was lost); a renewal succeeds
exactly when the permit is live at the renewer's clock.

Runs on DynamoDB Local, Redis and MongoDB (mongomock), through the ``lossy`` fixture.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynacoord import ManualClock, SemaphoreFullError
from dynacoord._clock import now_ms
from dynacoord.errors import BackendError
from dynacoord.testing import unique_name
from tests.reliability.conftest import run_model

LIMIT = 2
NAME = "sem"
SKEW_MS = (0, 150, -150)
PROCESSES = st.integers(0, len(SKEW_MS) - 1)
TTL_MS = st.sampled_from([150, 300, 1000, 2000])
ADVANCE_MS = st.one_of(st.sampled_from([0, 1, 149, 150, 151]), st.integers(0, 1500))
#: no fault; applied and re-sent; applied and raised; raised unsent
FAULTS = st.sampled_from(["none", "none", "resent", "raised", "unsent"])


def _raised_types() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import EndpointConnectionError

    return (EndpointConnectionError, BackendError)


def make_machine(lossy: Any) -> type[RuleBasedStateMachine]:
    raised_types = _raised_types()

    class SemaphoreMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ns = unique_name("sem")
            self.start = ManualClock().time()
            self.procs: list[dict[str, Any]] = [self._spawn(i) for i in range(len(SKEW_MS))]
            self.max_fence = 0
            self.fence_of: dict[str, int] = {}  # token -> fence, as first seen in the store

        # -- processes ---------------------------------------------------------------------

        def _spawn(self, index: int, clock: ManualClock | None = None) -> dict[str, Any]:
            if clock is None:
                clock = ManualClock(self.start + SKEW_MS[index] / 1000)
            sem = lossy.backend(clock=clock, namespace=self.ns).semaphore(NAME, limit=LIMIT, ttl=1)
            real = sem._store
            sem._store = _Judged(real, self)
            return {"clock": clock, "sem": sem, "store": real, "permits": []}

        def now(self, proc: dict[str, Any]) -> int:
            return now_ms(proc["clock"])

        def live(self, proc: dict[str, Any]) -> list[Any]:
            """The slots live at ``proc``'s clock by the store's state (one read)."""
            now = self.now(proc)
            state = proc["store"].read(NAME, now)
            return [s for s in state.slots if not s.released and s.expires_at_ms > now]

        def judge_acquire(self, store: Any, now: int, before: Any) -> None:
            """The oracle, at every acquire that reached the store (answered or raised)."""
            state = store.read(NAME, now)
            live = [s for s in state.slots if not s.released and s.expires_at_ms > now]
            # a write never takes a slot that was live at the acquirer's clock
            was_live = {s.token for s in before.slots if not s.released and s.expires_at_ms > now}
            assert was_live <= {s.token for s in live}, f"a live permit was dropped: {state}"
            assert len(live) <= LIMIT, f"{len(live)} live permits at {now}: {state}"
            assert len(state.slots) <= 2 * LIMIT, f"{len(state.slots)} slots: {state}"
            for slot in sorted(state.slots, key=lambda s: s.fence):
                known = self.fence_of.get(slot.token)
                if known is None:
                    assert slot.fence > self.max_fence, f"fence {slot.fence} not above {self}"
                    self.fence_of[slot.token] = slot.fence
                    self.max_fence = slot.fence
                else:
                    assert slot.fence == known, "a slot's fence changed"

        def _arm(self, fault: str) -> None:
            if fault == "resent":
                lossy.lose_next()
            elif fault in ("raised", "unsent"):
                lossy.raise_next(applied=fault == "raised")

        def _disarm(self) -> None:
            # a fault armed for a write that was not sent (decided from a read) must not fire on
            # some later, unrelated write
            with lossy._faults._lock:
                lossy._faults._slots.clear()

        # -- rules -------------------------------------------------------------------------

        @rule(p=PROCESSES, ttl_ms=TTL_MS, fault=FAULTS)
        def acquire(self, p: int, ttl_ms: int, fault: str) -> None:
            proc = self.procs[p]

            def attempt() -> Any:
                try:
                    return proc["sem"].acquire(blocking=False, ttl=ttl_ms / 1000)
                except SemaphoreFullError:
                    # refused: the store showed every permit live at this clock (none leaked)
                    assert len(self.live(proc)) >= LIMIT, "refused with a free permit"
                    return None

            self._arm(fault)
            try:
                permit = attempt()
            except raised_types:
                # maybe applied: the next acquire of this process sends the same token
                self._disarm()
                permit = attempt()
            finally:
                self._disarm()
            if permit is None:
                return
            mine = {s.token for s in self.live(proc) if s.owner == permit.owner}
            assert mine == {permit.token}, "an acquire that raised left a second permit"
            now = self.now(proc)
            assert permit.token in {s.token for s in self.live(proc)}, "a permit not in store"
            assert permit.expires_at_ms > now
            proc["permits"].append(permit)

        @precondition(lambda self: any(proc["permits"] for proc in self.procs))
        @rule(p=PROCESSES, which=st.integers(0, 3), fault=FAULTS)
        def release(self, p: int, which: int, fault: str) -> None:
            proc = self.procs[p]
            if not proc["permits"]:
                return
            permit = proc["permits"].pop(which % len(proc["permits"]))
            held = permit.token in {s.token for s in self.live(proc)} and not permit.lost
            self._arm(fault)
            try:
                ok = permit.release()
            except raised_types:
                self._disarm()
                ok = permit.release()  # the caller's next attempt
            finally:
                self._disarm()
            assert ok is held, f"release answered {ok}, the permit was live: {held}"
            assert permit.token not in {s.token for s in self.live(proc)}

        @precondition(lambda self: any(proc["permits"] for proc in self.procs))
        @rule(p=PROCESSES)
        def renew(self, p: int) -> None:
            proc = self.procs[p]
            for permit in list(proc["permits"]):
                held = permit.token in {s.token for s in self.live(proc)} and not permit.lost
                assert permit.extend() is held
                if not held:
                    proc["permits"].remove(permit)

        @rule(p=PROCESSES)
        def kill(self, p: int) -> None:
            """The process dies holding what it holds (no release, no renewal): a new one,
            with a new Semaphore object, takes its place on the same clock."""
            self.procs[p] = self._spawn(p, self.procs[p]["clock"])

        @rule()
        def freeze(self) -> None:
            """Every process stops for longer than any TTL (a GC pause, a frozen Lambda)."""
            for proc in self.procs:
                proc["clock"].advance(2.5)

        @rule(ms=ADVANCE_MS)
        def advance(self, ms: int) -> None:
            for proc in self.procs:
                proc["clock"].advance(ms / 1000)

        @precondition(lambda self: any(proc["permits"] for proc in self.procs))
        @rule(p=PROCESSES, delta=st.sampled_from([-1, 0]))
        def advance_onto_expiry(self, p: int, delta: int) -> None:
            """Move the clocks so that a permit's expiry is exactly now (or 1 ms ahead) at its
            holder's clock: the boundary case."""
            proc = self.procs[p]
            if not proc["permits"]:
                return
            gap = proc["permits"][0].expires_at_ms + delta - self.now(proc)
            if gap > 0:
                self.advance(gap)

        @invariant()
        def at_most_limit_live_at_every_clock(self) -> None:
            for proc in self.procs:
                assert len(self.live(proc)) <= LIMIT

    return SemaphoreMachine


class _Judged:
    """A store whose every acquire is judged by the machine's oracle once it reached the store."""

    def __init__(self, real: Any, machine: Any) -> None:
        self._real = real
        self._machine = machine
        self.reads_first = real.reads_first

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def try_acquire(
        self, name: str, token: str, owner: str, limit: int, ttl_ms: int, now_ms: int, seen: Any
    ) -> Any:
        before = self._real.read(name, now_ms)
        try:
            return self._real.try_acquire(name, token, owner, limit, ttl_ms, now_ms, seen)
        finally:
            self._machine.judge_acquire(self._real, now_ms, before)


LOSSY_KINDS = ["dynamodb", "redis", "mongo"]


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_semaphore_model(lossy: Any) -> None:
    """At most LIMIT live permits at every applied acquire, fences strictly increasing, no
    permit leaked, releases and renewals answered exactly, under kills, freezes, skewed clocks
    and lost answers of every kind."""
    run_model(make_machine(lossy), lossy)
