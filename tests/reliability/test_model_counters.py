"""Model-based test of counters, flags and fan-in joins against an in-memory reference model.

Two keys are shared by every kind, so kind clashes (incrementing a flag, joining a counter) are
exercised too. The ``ManualClock`` advances (also exactly onto expiry instants) so that expired
items are seen as absent and restarted. Runs on every contract backend (moto, DynamoDB Local, Redis, MongoDB).

One-shot writer processes (issue 49, section 3): a rule lets a batch of processes that each
write once (a cron job, a CLI call, a fork per task: tests/slot_pools.Process, a slot pool and a
memory of their own) increment a key, and another moves the clock past a whole retry window.
Besides the counts, the model holds the bound: a counter keeps the slots of the writers of one
window (and a bounded number of stale ones waiting for a writer to drop them), whatever their
lifetimes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dynacoord import ManualClock
from dynacoord._clock import now_ms
from dynacoord._writers import DEFAULT_WINDOW_MS, PRUNE_AT
from dynacoord.errors import CounterTypeError
from tests.reliability.conftest import run_model
from tests.slot_pools import Process, stored_slots

KEYS = ("x", "y")
TTL_MS = st.one_of(st.none(), st.integers(1, 3000))
JOIN_TTL_MS = 4000
EXPECTED = 3


@dataclass
class Item:
    kind: str
    value: Any
    expires: int | None
    members: set[str] = field(default_factory=set)
    #: joins: the member whose arrival completed it (its redeliveries fire again)
    completer: str | None = None


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class CountersMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.backend = factory(clock=self.clock)
            self.counters = self.backend.counters
            self.items: dict[str, Item] = {}
            self.table = getattr(self.backend, "table", None)
            self.window_ms = getattr(self.table, "count_window_ms", None) or DEFAULT_WINDOW_MS
            #: key -> when each writer (this process: None, or a one-shot one) last counted
            self.writers: dict[str, dict[object, int]] = {key: {} for key in KEYS}

        def now(self) -> int:
            return now_ms(self.clock)

        def live(self, key: str) -> Item | None:
            item = self.items.get(key)
            if item is None or (item.expires is not None and self.now() >= item.expires):
                return None
            return item

        @rule(key=st.sampled_from(KEYS), by=st.integers(-5, 5), ttl_ms=TTL_MS)
        def increment(self, key: str, by: int, ttl_ms: int | None) -> None:
            now = self.now()
            ttl = None if ttl_ms is None else ttl_ms / 1000
            item = self.live(key)
            if item is not None and item.kind != "counter":
                with pytest.raises(CounterTypeError):
                    self.counters.increment(key, by, ttl=ttl)
                return
            got = self.counters.increment(key, by, ttl=ttl)
            self.writers[key][None] = now
            if item is None:
                expires = None if ttl_ms is None else now + ttl_ms
                self.items[key] = item = Item("counter", by, expires)
            else:
                item.value += by
                if item.expires is None and ttl_ms is not None:
                    item.expires = now + ttl_ms
            assert got == item.value

        @rule(
            key=st.sampled_from(KEYS),
            value=st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(), st.booleans()),
            ttl_ms=TTL_MS,
        )
        def set_if_absent(self, key: str, value: Any, ttl_ms: int | None) -> None:
            now = self.now()
            ttl = None if ttl_ms is None else ttl_ms / 1000
            expected = self.live(key) is None
            assert self.counters.set_if_absent(key, value, ttl=ttl) is expected
            if expected:
                kind = (
                    "counter" if isinstance(value, int) and not isinstance(value, bool) else "flag"
                )
                self.items[key] = Item(kind, value, None if ttl_ms is None else now + ttl_ms)

        @rule(key=st.sampled_from(KEYS), member=st.sampled_from(["m1", "m2", "m3", "m4"]))
        def join(self, key: str, member: str) -> None:
            now = self.now()
            item = self.live(key)
            if item is not None and item.kind != "join":
                with pytest.raises(CounterTypeError):
                    self.counters.join(key, member, expected=EXPECTED, ttl=JOIN_TTL_MS / 1000)
                return
            result = self.counters.join(key, member, expected=EXPECTED, ttl=JOIN_TTL_MS / 1000)
            if item is None:
                self.items[key] = item = Item("join", 0, now + JOIN_TTL_MS)
            new = member not in item.members
            item.members.add(member)
            item.value = len(item.members)
            assert result.count == item.value
            assert result.complete is (item.value >= EXPECTED)
            if new and item.value == EXPECTED:
                item.completer = member
            assert result.fired is (item.value >= EXPECTED and item.completer == member)

        @rule(key=st.sampled_from(KEYS))
        def delete(self, key: str) -> None:
            expected = self.live(key) is not None
            assert self.counters.delete(key) is expected
            self.items.pop(key, None)

        @rule(key=st.sampled_from(KEYS), ttl_ms=st.integers(1, 3000))
        def extend_ttl(self, key: str, ttl_ms: int) -> None:
            now = self.now()
            item = self.live(key)
            assert self.counters.extend_ttl(key, ttl_ms / 1000) is (item is not None)
            if item is not None:
                item.expires = now + ttl_ms

        @rule(key=st.sampled_from(KEYS), processes=st.integers(1, 40))
        def one_shot_increments(self, key: str, processes: int) -> None:
            """``processes`` processes that each increment ``key`` once and exit, 10 ms apart."""
            item = self.live(key)
            if item is not None and item.kind != "counter":
                return
            for _ in range(processes):
                now = self.now()
                process = Process(self.table)
                got = process.run(self.counters.increment, key)
                self.writers[key][process] = now
                item = self.live(key)
                if item is None:
                    self.items[key] = item = Item("counter", 1, None)
                else:
                    item.value += 1
                assert got == item.value
                self.clock.advance(0.01)

        @rule()
        def pass_a_window(self) -> None:
            """Every call so far can no longer be retried: its slot is stale."""
            self.clock.advance(self.window_ms / 1000 + 1)

        @rule(ms=st.one_of(st.sampled_from([0, 1]), st.integers(0, 2500)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @rule(key=st.sampled_from(KEYS))
        def advance_onto_expiry(self, key: str) -> None:
            item = self.live(key)
            if item is None or item.expires is None:
                return
            while self.now() < item.expires:
                self.clock.advance(max(item.expires - self.now(), 1) / 1000)

        @invariant()
        def slots_of_one_window(self) -> None:
            # the writers whose calls may still be retried at the last write, the stale slots a
            # writer has not
            # dropped yet (DynamoDB leaves up to 4 x PRUNE_AT to a later write's own request),
            # and the writes a single write cannot drop at once
            kind = getattr(factory, "kind", "")
            slack = 4 * PRUNE_AT if "moto" in kind or "dynamodb" in kind else PRUNE_AT
            for key in KEYS:
                item = self.live(key)
                if item is None or item.kind != "counter":
                    continue
                # stale slots go with the next write: the bound holds as of the last one
                writes = self.writers[key].values()
                last = max(writes, default=0)
                recent = sum(1 for at in writes if at >= last - self.window_ms)
                slots = stored_slots(self.backend, kind, key)
                assert slots <= recent + slack + 1, (key, slots, recent)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for key in KEYS:
                got = self.counters.item(key)
                item = self.live(key)
                if item is None:
                    assert got is None, f"{key!r} should be absent at {self.now()}: {got}"
                    continue
                assert got is not None, f"{key!r} should be {item}"
                assert (got.kind, got.expires_at_ms) == (item.kind, item.expires)
                assert type(got.value) is type(item.value) and got.value == item.value
                if item.kind == "join":
                    assert set(got.members) == item.members and got.expected == EXPECTED

    return CountersMachine


def test_counters_model(make_backend: Any) -> None:
    """The counters state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
