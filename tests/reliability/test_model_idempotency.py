"""Model-based test of idempotency records against an in-memory reference model.

A key is absent, IN_PROGRESS (a claim with a token and a lease) or COMPLETED (a stored result
with a TTL); an expired record of either kind counts as absent for a new claim. complete/release
act only for the token that holds the record (a claim that was taken over can neither store its
result nor delete the new claim). The ``ManualClock`` advances so leases and results expire.
Runs on every contract backend (moto, DynamoDB Local, Redis, MongoDB).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    rule,
)

from dynacoord import ManualClock
from dynacoord._clock import now_ms
from dynacoord.idempotency import IdempotencyStatus
from tests.reliability.conftest import run_model

KEYS = ("order-1", "order#2")
key_st = st.sampled_from(KEYS)
MS = st.integers(1, 3000)
RESULTS = st.one_of(
    st.integers(), st.text(max_size=4), st.none(), st.lists(st.booleans(), max_size=2)
)


@dataclass
class Record:
    status: IdempotencyStatus
    expires: int
    token: str | None = None
    result: Any = None
    payload_hash: str | None = None


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class IdempotencyMachine(RuleBasedStateMachine):
        claims = Bundle("claims")

        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.idem = factory(clock=self.clock).idempotency
            self.records: dict[str, Record] = {}  # stored, expired or not

        def now(self) -> int:
            return now_ms(self.clock)

        def live(self, key: str) -> Record | None:
            record = self.records.get(key)
            return record if record is not None and self.now() < record.expires else None

        @rule(target=claims, key=key_st, lease_ms=MS, payload=st.sampled_from([None, "p1", "p2"]))
        def try_claim(self, key: str, lease_ms: int, payload: str | None) -> Any:
            now = self.now()
            live = self.live(key)
            outcome = self.idem.try_claim(key, lease=lease_ms / 1000, payload_hash=payload)
            if live is not None:
                assert outcome.claim is None
                existing = outcome.existing
                assert existing is not None and existing.status is live.status
                assert existing.expires_at_ms == live.expires
                assert existing.payload_hash == live.payload_hash
                if live.status is IdempotencyStatus.COMPLETED:
                    assert existing.result == live.result
                return multiple()
            claim = outcome.claim
            assert claim is not None and claim.expires_at_ms == now + lease_ms
            self.records[key] = Record(
                IdempotencyStatus.IN_PROGRESS, now + lease_ms, claim.token, payload_hash=payload
            )
            return claim

        @rule(claim=claims, result=RESULTS, ttl_ms=MS)
        def complete(self, claim: Any, result: Any, ttl_ms: int) -> None:
            now = self.now()
            record = self.records.get(claim.key)
            expected = (
                record is not None
                and record.status is IdempotencyStatus.IN_PROGRESS
                and record.token == claim.token
            )
            assert self.idem.complete(claim, result, ttl=ttl_ms / 1000) is expected
            if expected:
                assert record is not None
                record.status = IdempotencyStatus.COMPLETED
                record.expires = now + ttl_ms
                record.token = None
                record.result = result

        @rule(claim=claims)
        def release(self, claim: Any) -> None:
            record = self.records.get(claim.key)
            expected = record is not None and record.token == claim.token
            assert self.idem.release(claim) is expected
            if expected:
                del self.records[claim.key]

        @rule(key=key_st)
        def delete(self, key: str) -> None:
            assert self.idem.delete(key) is (key in self.records)
            self.records.pop(key, None)

        @rule(ms=st.one_of(st.sampled_from([0, 1]), st.integers(0, 2500)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for key in KEYS:
                got = self.idem.get(key)
                live = self.live(key)
                if live is None:
                    assert got is None, f"{key!r} should be absent at {self.now()}: {got}"
                    continue
                assert got is not None
                assert (got.status, got.expires_at_ms, got.payload_hash) == (
                    live.status,
                    live.expires,
                    live.payload_hash,
                )
                if live.status is IdempotencyStatus.COMPLETED:
                    assert got.result == live.result

    return IdempotencyMachine


def test_idempotency_model(make_backend: Any) -> None:
    """The idempotency state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
