"""Model-based test of locks: the real backend against an in-memory reference model.

A hypothesis ``RuleBasedStateMachine`` acquires, re-acquires, extends, releases and force-releases
locks on a few keys with a few owners while a ``ManualClock`` advances (also exactly onto expiry
instants), and after every step checks that ``locks.get`` agrees with the model for every key.
The model is the specification in a dozen lines: a key is held by (owner, fence, expires_at_ms)
until ``now >= expires_at_ms``; acquiring a free key yields a fence above every earlier fence of
that key; the same owner re-acquiring keeps the fence; extend/release succeed only for the
(owner, fence) that holds the lock now.

Runs on every contract backend (moto, DynamoDB Local, Redis, MongoDB).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from dynacoord import ManualClock
from dynacoord._clock import now_ms
from tests.reliability.conftest import run_model

KEYS = st.sampled_from(["a", "b", "k#1"])
OWNERS = st.sampled_from(["o1", "o2", "o3"])
# Millisecond TTLs, including values whose seconds form is not exact in binary floating point.
TTL_MS = st.one_of(st.integers(1, 3000), st.sampled_from([1, 2, 999, 1000, 2007, 4001]))
ADVANCE_MS = st.one_of(st.sampled_from([0, 1]), st.integers(0, 2500))


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class LocksMachine(RuleBasedStateMachine):
        leases = Bundle("leases")

        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.locks = factory(clock=self.clock).locks
            # model: key -> (owner, fence, expires_at_ms); a released/forced key is dropped
            self.held: dict[str, tuple[str, int, int]] = {}
            self.last_fence: dict[str, int] = {}
            # leases this process knows are finished (released, or found lost by extend/release)
            self.dead: set[int] = set()

        def now(self) -> int:
            return now_ms(self.clock)

        def live(self, key: str) -> tuple[str, int, int] | None:
            h = self.held.get(key)
            return h if h is not None and self.now() < h[2] else None

        @rule(target=leases, key=KEYS, owner=OWNERS, ttl_ms=TTL_MS)
        def acquire(self, key: str, owner: str, ttl_ms: int) -> Any:
            now = self.now()
            lease = self.locks.acquire(key, ttl_ms / 1000, owner=owner)
            holder = self.live(key)
            if holder is None:
                assert lease is not None, f"{key!r} is free in the model but acquire failed"
                assert lease.fence > self.last_fence.get(key, -1)
                assert lease.expires_at_ms == now + ttl_ms
                self.last_fence[key] = lease.fence
                self.held[key] = (owner, lease.fence, now + ttl_ms)
            elif holder[0] == owner:
                assert lease is not None, "re-acquire by the holder must succeed"
                assert lease.fence == holder[1], "re-acquire must keep the fence"
                assert lease.expires_at_ms == now + ttl_ms
                self.held[key] = (owner, holder[1], now + ttl_ms)
            else:
                assert lease is None, f"{key!r} held by {holder[0]!r} but {owner!r} got it"
            return lease if lease is not None else multiple()

        @rule(lease=leases, ttl_ms=TTL_MS)
        def extend(self, lease: Any, ttl_ms: int) -> None:
            now = self.now()
            holder = self.live(lease.key)
            expected = id(lease) not in self.dead and holder is not None
            expected = expected and holder[:2] == (lease.owner, lease.fence)  # type: ignore[index]
            ok = lease.extend(ttl_ms / 1000)
            assert ok is expected
            if ok:
                assert lease.expires_at_ms == now + ttl_ms
                self.held[lease.key] = (lease.owner, lease.fence, now + ttl_ms)
            else:
                assert lease.lost or lease.released
                self.dead.add(id(lease))

        @rule(lease=leases)
        def release(self, lease: Any) -> None:
            holder = self.live(lease.key)
            expected = id(lease) not in self.dead and holder is not None
            expected = expected and holder[:2] == (lease.owner, lease.fence)  # type: ignore[index]
            assert lease.release() is expected
            self.dead.add(id(lease))
            if expected:
                del self.held[lease.key]

        @rule(key=KEYS)
        def force_release(self, key: str) -> None:
            expected = self.live(key) is not None
            assert self.locks.force_release(key) is expected
            self.held.pop(key, None)

        @rule(lease=leases)
        def is_held(self, lease: Any) -> None:
            holder = self.live(lease.key)
            expected = id(lease) not in self.dead and holder is not None
            expected = expected and holder[:2] == (lease.owner, lease.fence)  # type: ignore[index]
            assert lease.is_held() is expected

        @rule(ms=ADVANCE_MS)
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @precondition(lambda self: any(self.live(k) for k in ("a", "b", "k#1")))
        @rule(key=KEYS, delta=st.sampled_from([-1, 0]))
        def advance_onto_expiry(self, key: str, delta: int) -> None:
            """Move the clock to exactly expires_at_ms (or 1 ms before): the boundary case."""
            holder = self.live(key)
            if holder is None:
                return
            target = holder[2] + delta
            while self.now() < target:
                self.clock.advance(max(target - self.now(), 1) / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for key in ("a", "b", "k#1"):
                info = self.locks.get(key)
                holder = self.live(key)
                if holder is None:
                    assert info is None, f"{key!r} should be free at {self.now()}, got {info}"
                else:
                    assert info is not None, f"{key!r} should be held by {holder}"
                    assert (info.owner, info.fence, info.expires_at_ms) == holder

    return LocksMachine


def test_locks_model(make_backend: Any) -> None:
    """The locks state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
