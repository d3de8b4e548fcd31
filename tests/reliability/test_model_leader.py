"""Model-based test of leader election under faults, with an exact oracle.

A hypothesis ``RuleBasedStateMachine`` drives three candidate processes of one election, each
with its own backend, ``Leader`` (``heartbeat=False``: the machine renews) and ``ManualClock``.
The wall clocks are skewed (one 150 ms ahead, one 150 ms behind: 300 ms apart at most, within
the ``margin`` of 350 ms, the documented bound); all clocks advance together. Its generators:

* campaigns (one attempt), renewals and step-downs of any process;
* lost answers of both kinds on each of their writes: applied and re-sent by the client's own
  retry (``lossy.lose_next``), applied and raised, or raised unsent (``lossy.raise_next``);
* a renewal delivered late: time passes (up to twice the TTL) between the moment it is sent
  (its clock read) and the moment the store applies it, while the watchdog runs;
* kills (a process stops and is replaced by a new one with a new owner: its term is left to
  run out) and freezes (every process stops for longer than the TTL);
* clock moves of any size, also exactly onto a leader's local deadline and onto the store's
  expiry at a candidate's clock.

The oracle judges every applied election against the store and every candidate's local state,
with no "someone died or froze" excuse: when an acquire applies a new term, no other (living)
candidate's ``is_leader`` holds at that instant; every new term is above every earlier one;
after every step, at most one candidate leads, and a candidate that leads is what the store shows
(its owner and term) with an expiry no candidate's clock has reached (nobody could be elected
now); a step-down answers True exactly when the store held an item of the candidate's before it
(also when its answer was lost or raised), and frees nobody else's; every term a candidate won
ends in exactly one of: still leading, stepped down, or ``on_lost`` (once, and never while it
leads), which the watchdog fires within moments of the deadline even if nobody calls anything.

Runs on DynamoDB Local, Redis and MongoDB (mongomock), through the ``lossy`` fixture.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dynacoord import ManualClock
from dynacoord._clock import now_ms
from dynacoord.errors import BackendError
from dynacoord.leader import leader_key
from dynacoord.testing import unique_name
from tests.reliability.conftest import STRESS_SCALE, run_model

NAME = "lead"
KEY = leader_key(NAME)
TTL_MS = 1000
MARGIN_MS = 350
SKEW_MS = (0, 150, -150)
PROCESSES = st.integers(0, len(SKEW_MS) - 1)
ADVANCE_MS = st.one_of(st.sampled_from([0, 1, 349, 350, 351, 650]), st.integers(0, 1500))
#: no fault; applied and re-sent; applied and raised; raised unsent
FAULTS = st.sampled_from(["none", "none", "resent", "raised", "unsent"])
#: how long (real time) the watchdog may take to notice a deadline the clock moved past
WATCHDOG_PATIENCE = 5.0


def _raised_types() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import EndpointConnectionError

    types: list[type[BaseException]] = [EndpointConnectionError, BackendError]
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError

        types.append(RedisConnectionError)
    except ImportError:  # pragma: no cover - the extras are installed for the suite
        pass
    try:
        from pymongo.errors import AutoReconnect

        types.append(AutoReconnect)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def make_machine(lossy: Any) -> type[RuleBasedStateMachine]:
    raised_types = _raised_types()

    class LeaderMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.ns = unique_name("lead")
            self.start = ManualClock().time()
            self.clocks = [ManualClock(self.start + s / 1000) for s in SKEW_MS]
            self.procs: list[dict[str, Any]] = [self._spawn(i) for i in range(len(SKEW_MS))]
            self.dead: list[dict[str, Any]] = []
            self.max_term = 0

        # -- processes ---------------------------------------------------------------------

        def _spawn(self, index: int) -> dict[str, Any]:
            clock = self.clocks[index]
            proc: dict[str, Any] = {
                "clock": clock,
                "elected": [],
                "lost": [],
                "stepped": set(),
                "dead": False,
                "lock": threading.Lock(),
            }

            def on_elected(term: int) -> None:
                proc["elected"].append(term)

            def on_lost(term: int) -> None:
                with proc["lock"]:
                    proc["lost"].append(term)

            leader = lossy.backend(clock=clock, namespace=self.ns).leader(
                NAME,
                ttl=TTL_MS / 1000,
                margin=MARGIN_MS / 1000,
                on_elected=on_elected,
                on_lost=on_lost,
            )
            real = leader._store
            leader._store = _Judged(real, self, proc)
            proc.update(leader=leader, store=real)
            return proc

        def now(self, proc: dict[str, Any]) -> int:
            return now_ms(proc["clock"])

        def stored(self) -> Any:
            """The item as the slowest clock sees it (live for someone), one consistent read."""
            slowest = min(self.procs, key=self.now)
            return slowest["store"].get(KEY, self.now(slowest))

        def leading(self, but: dict[str, Any] | None = None) -> list[dict[str, Any]]:
            return [p for p in self.procs if p is not but and p["leader"].is_leader]

        def judge_acquire(self, proc: dict[str, Any]) -> None:
            """The oracle, at every acquire that reached the store (answered or raised)."""
            info = proc["store"].get(KEY, self.now(proc))
            if info is None or info.owner != proc["leader"].owner or info.fence <= self.max_term:
                return  # no new term applied
            others = self.leading(but=proc)
            assert not others, (
                f"term {info.fence} granted to {info.owner} while {others[0]['leader']!r} leads"
            )
            self.max_term = info.fence

        def _arm(self, fault: str) -> None:
            if fault == "resent":
                lossy.lose_next()
            elif fault in ("raised", "unsent"):
                lossy.raise_next(applied=fault == "raised")

        def _disarm(self) -> None:
            # a fault armed for a write that was not sent must not fire on a later one
            with lossy._faults._lock:
                lossy._faults._slots.clear()

        # -- rules -------------------------------------------------------------------------

        @rule(p=PROCESSES, fault=FAULTS)
        def campaign(self, p: int, fault: str) -> None:
            proc = self.procs[p]
            leader = proc["leader"]
            self._arm(fault)
            try:
                elected = leader.campaign(timeout=0, heartbeat=False)
            except raised_types:
                elected = False  # maybe applied: the next campaign recognises it
            finally:
                self._disarm()
            if elected:
                assert leader.is_leader and leader.term == proc["elected"][-1]
                info = proc["store"].get(KEY, self.now(proc))
                assert info is not None and (info.owner, info.fence) == (
                    leader.owner,
                    leader.term,
                )

        @precondition(lambda self: any(p["leader"].term is not None for p in self.procs))
        @rule(p=PROCESSES, fault=FAULTS)
        def renew(self, p: int, fault: str) -> None:
            proc = self.procs[p]
            leader = proc["leader"]
            was = leader.is_leader
            self._arm(fault)
            try:
                ok = leader.renew()
            except raised_types:
                ok = None
            finally:
                self._disarm()
            if not was:
                assert ok is False, "a renewal of a term that had ended"
            if ok:
                assert leader.is_leader

        @precondition(lambda self: any(p["leader"].is_leader for p in self.procs))
        @rule(late_ms=st.sampled_from([100, 349, 650, 1000, 2000]))
        def renew_late(self, late_ms: int) -> None:
            """The leader's renewal is sent (its clocks read), then every clock moves ``late_ms``
            before the store applies it: a request that hung in the network."""
            (proc,) = self.leading()
            judged = proc["leader"]._store
            judged.delay_next_extend = late_ms
            try:
                proc["leader"].renew()
            finally:
                judged.delay_next_extend = 0

        @rule(p=PROCESSES, fault=FAULTS)
        def step_down(self, p: int, fault: str) -> None:
            proc = self.procs[p]
            leader = proc["leader"]
            ours = {leader.term, *leader._ended}
            info = proc["store"].get(KEY, self.now(proc))
            held = info is not None and info.owner == leader.owner and info.fence in ours
            leading_term = leader.term if leader.is_leader else None
            self._arm(fault)
            try:
                ok = leader.step_down()
            except raised_types:
                self._disarm()
                ok = leader.step_down()  # the caller's next attempt
            finally:
                self._disarm()
            assert ok is held, f"step_down answered {ok}, the store held ours: {held}"
            assert not leader.is_leader
            if leading_term is not None:
                proc["stepped"].add(leading_term)
            after = proc["store"].get(KEY, self.now(proc))
            if info is not None and not held:
                assert after == info, "a step-down touched another leader's item"
            else:
                assert after is None

        @rule(p=PROCESSES)
        def kill(self, p: int) -> None:
            """The process dies (nothing more from it): a new one takes its place."""
            old = self.procs[p]
            old["dead"] = True
            self.dead.append(old)
            self.procs[p] = self._spawn(p)

        @rule()
        def freeze(self) -> None:
            """Every process stops for longer than the TTL."""
            self.advance(2500)

        @rule(ms=ADVANCE_MS)
        def advance(self, ms: int) -> None:
            for clock in self.clocks:
                clock.advance(ms / 1000)

        @precondition(lambda self: any(p["leader"].is_leader for p in self.procs))
        @rule(delta=st.sampled_from([-1, 0]))
        def advance_onto_deadline(self, delta: int) -> None:
            (proc,) = self.leading()
            gap = proc["leader"].deadline - proc["clock"].monotonic() + delta / 1000
            if gap > 0:
                self.advance(round(gap * 1000))

        @rule(p=PROCESSES, delta=st.sampled_from([-1, 0]))
        def advance_onto_expiry(self, p: int, delta: int) -> None:
            """Move the clocks so that the stored lease ends exactly now at ``p``'s clock."""
            proc = self.procs[p]
            info = proc["store"].get(KEY, self.now(proc))
            if info is not None:
                gap = info.expires_at_ms + delta - self.now(proc)
                if gap > 0:
                    self.advance(gap)

        # -- invariants --------------------------------------------------------------------

        @invariant()
        def at_most_one_leader_and_the_store_shows_it(self) -> None:
            leading = self.leading()
            assert len(leading) <= 1, f"{len(leading)} leaders"
            if not leading:
                return
            leader = leading[0]["leader"]
            info = self.stored()
            assert info is not None and (info.owner, info.fence) == (leader.owner, leader.term), (
                f"{leader!r} leads, the store shows {info}"
            )
            # the exact judgement: at the leader's local deadline, no candidate's clock (the
            # fastest) has reached the stored lease's end yet, so nobody can be elected while
            # this leader may still think it leads
            left_ms = (leading[0]["leader"].deadline - leading[0]["clock"].monotonic()) * 1000
            fastest = max(self.now(p) for p in self.procs)
            assert info.expires_at_ms > fastest + left_ms, (
                f"{leader!r} leads {left_ms:.0f} ms more, the fastest clock sees its lease end "
                f"in {info.expires_at_ms - fastest} ms"
            )

        @invariant()
        def every_term_ends_once(self) -> None:
            for proc in self.procs:
                leader = proc["leader"]
                elected = proc["elected"]
                assert elected == sorted(set(elected)), f"terms not increasing: {elected}"
                for term in elected:
                    if leader.is_leader and term == leader.term:
                        assert term not in proc["lost"], "on_lost of a term still led"
                        continue
                    if term in proc["stepped"]:
                        assert term not in proc["lost"], "on_lost of a term stepped down"
                        continue
                    end = time.monotonic() + WATCHDOG_PATIENCE
                    while term not in proc["lost"]:
                        assert time.monotonic() < end, f"term {term} ended with no on_lost"
                        time.sleep(0.005)
                with proc["lock"]:
                    lost = list(proc["lost"])
                assert len(lost) == len(set(lost)), f"on_lost twice: {lost}"

        def teardown(self) -> None:
            # every watchdog still polling ends with its term
            for clock in self.clocks:
                clock.advance(3600)

    return LeaderMachine


class _Judged:
    """The real lock store, with every acquire judged by the oracle once it reached the store,
    and a renewal that can be delivered late (``delay_next_extend`` ms after it was sent)."""

    def __init__(self, real: Any, machine: Any, proc: dict[str, Any]) -> None:
        self._real = real
        self._machine = machine
        self._proc = proc
        self.delay_next_extend = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def try_acquire(self, key: str, owner: str, ttl_ms: int, now_ms: int) -> Any:
        try:
            return self._real.try_acquire(key, owner, ttl_ms, now_ms)
        finally:
            self._machine.judge_acquire(self._proc)

    def extend(self, key: str, owner: str, fence: int, ttl_ms: int, now_ms: int) -> Any:
        if self.delay_next_extend:
            late, self.delay_next_extend = self.delay_next_extend, 0
            self._machine.advance(late)
            time.sleep(0.03)  # the watchdog's poll: it may see the deadline pass meanwhile
        return self._real.extend(key, owner, fence, ttl_ms, now_ms)


LOSSY_KINDS = ["dynamodb", "redis", "mongo"]


@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_leader_model(lossy: Any) -> None:
    """Never two leaders at once, judged by their local deadlines against the store's lease;
    terms strictly increasing; step-downs answered exactly and never freeing another's term;
    every term ends once (led, stepped down, or on_lost from the watchdog), under kills, freezes,
    late renewals, skewed clocks and lost answers of every kind."""
    run_model(make_machine(lossy), lossy)


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("lossy", LOSSY_KINDS, indirect=True)
def test_stress_leader_model(lossy: Any) -> None:
    """``make stress``: the same machine with five times the examples and twice the steps."""
    run_model(make_machine(lossy), lossy, scale=STRESS_SCALE)
