"""Model-based test of the cache against an in-memory reference model (a dict with expiry).

Covers set / add / get / has / delete / touch / incr / get_many / set_many / keys / clear with a
``ManualClock`` that advances (also exactly onto expiry instants): an expired entry is never
returned, ``add`` treats it as absent, ``incr`` restarts it from 0. Runs on every contract backend (moto, DynamoDB Local, Redis, MongoDB).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dynacoord import InvalidValueError, ManualClock
from dynacoord._clock import now_ms
from tests.reliability.conftest import run_model

KEYS = ("k1", "k2", "u:1", "u:2")
key_st = st.sampled_from(KEYS)
TTL_MS = st.one_of(st.none(), st.integers(1, 3000))
VALUES = st.one_of(
    st.integers(-10, 10),
    st.text(max_size=4),
    st.none(),
    st.just(1.5),
    st.lists(st.integers(0, 3), max_size=3),
    st.binary(max_size=3),
)
_MISSING = object()


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class CacheMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.cache = factory(clock=self.clock).cache()
            # key -> (value, expires_at_ms or None)
            self.entries: dict[str, tuple[Any, int | None]] = {}

        def now(self) -> int:
            return now_ms(self.clock)

        def live(self, key: str) -> tuple[Any, int | None] | None:
            entry = self.entries.get(key)
            if entry is None or (entry[1] is not None and self.now() >= entry[1]):
                return None
            return entry

        def _exp(self, ttl_ms: int | None) -> int | None:
            return None if ttl_ms is None else self.now() + ttl_ms

        @staticmethod
        def _ttl(ttl_ms: int | None) -> float | None:
            return None if ttl_ms is None else ttl_ms / 1000

        @rule(key=key_st, value=VALUES, ttl_ms=TTL_MS)
        def set(self, key: str, value: Any, ttl_ms: int | None) -> None:
            self.cache.set(key, value, ttl=self._ttl(ttl_ms))
            self.entries[key] = (value, self._exp(ttl_ms))

        @rule(key=key_st, value=VALUES, ttl_ms=TTL_MS)
        def add(self, key: str, value: Any, ttl_ms: int | None) -> None:
            expected = self.live(key) is None
            assert self.cache.add(key, value, ttl=self._ttl(ttl_ms)) is expected
            if expected:
                self.entries[key] = (value, self._exp(ttl_ms))

        @rule(key=key_st)
        def delete(self, key: str) -> None:
            assert self.cache.delete(key) is (self.live(key) is not None)
            self.entries.pop(key, None)

        @rule(key=key_st, ttl_ms=TTL_MS)
        def touch(self, key: str, ttl_ms: int | None) -> None:
            entry = self.live(key)
            assert self.cache.touch(key, self._ttl(ttl_ms)) is (entry is not None)
            if entry is not None:
                self.entries[key] = (entry[0], self._exp(ttl_ms))

        @rule(key=key_st, by=st.integers(-5, 5), ttl_ms=TTL_MS)
        def incr(self, key: str, by: int, ttl_ms: int | None) -> None:
            entry = self.live(key)
            if entry is not None and (type(entry[0]) is not int):
                with pytest.raises(InvalidValueError):
                    self.cache.incr(key, by, ttl=self._ttl(ttl_ms))
                return
            got = self.cache.incr(key, by, ttl=self._ttl(ttl_ms))
            if entry is None:
                self.entries[key] = (by, self._exp(ttl_ms))
            else:
                self.entries[key] = (entry[0] + by, entry[1])
            assert got == self.entries[key][0]

        @rule(mapping=st.dictionaries(key_st, VALUES, min_size=1, max_size=3), ttl_ms=TTL_MS)
        def set_many(self, mapping: dict[str, Any], ttl_ms: int | None) -> None:
            self.cache.set_many(mapping, ttl=self._ttl(ttl_ms))
            for key, value in mapping.items():
                self.entries[key] = (value, self._exp(ttl_ms))

        @rule(wanted=st.lists(key_st, min_size=1, max_size=4, unique=True))
        def get_many(self, wanted: list[str]) -> None:
            expected = {k: self.live(k)[0] for k in wanted if self.live(k) is not None}  # type: ignore[index]
            got = self.cache.get_many(wanted)
            assert repr(sorted(got.items())) == repr(sorted(expected.items()))

        @rule(pattern=st.sampled_from(["*", "u:*", "k?", "nothing*"]))
        def keys(self, pattern: str) -> None:
            import fnmatch

            expected = sorted(
                k for k in KEYS if self.live(k) is not None and fnmatch.fnmatchcase(k, pattern)
            )
            assert self.cache.keys(pattern) == expected

        @rule()
        def clear(self) -> None:
            expected = sum(1 for k in KEYS if self.live(k) is not None)
            assert self.cache.clear() == expected
            self.entries.clear()

        @rule(ms=st.one_of(st.sampled_from([0, 1]), st.integers(0, 2500)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @rule(key=key_st)
        def advance_onto_expiry(self, key: str) -> None:
            entry = self.live(key)
            if entry is None or entry[1] is None:
                return
            while self.now() < entry[1]:
                self.clock.advance(max(entry[1] - self.now(), 1) / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for key in KEYS:
                entry = self.live(key)
                got = self.cache.get(key, _MISSING)
                if entry is None:
                    assert got is _MISSING, f"{key!r} expired/absent but get returned {got!r}"
                else:
                    assert type(got) is type(entry[0]) and repr(got) == repr(entry[0])

    return CacheMachine


def test_cache_model(make_backend: Any) -> None:
    """The cache state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
