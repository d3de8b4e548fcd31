"""Model-based test of task checkpoints against an in-memory reference model.

Auto-assigned sequences are highest stored + 1; an explicit sequence that is live is refused
(never overwritten) while an expired one counts as free; load / load_latest / list see only live
checkpoints, ascending; cleanup(keep) keeps the newest ``keep`` live ones and removes the rest
(expired ones too). The ``ManualClock`` advances so TTLs run out. Runs on every contract backend (moto, DynamoDB Local, Redis, MongoDB).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dynacoord import CheckpointExistsError, CheckpointNotFoundError, ManualClock
from dynacoord._clock import now_ms
from tests.reliability.conftest import run_model

TASKS = ("t1", "t#2")
task_st = st.sampled_from(TASKS)
TTL_MS = st.one_of(st.none(), st.integers(1, 3000))
DATA = st.one_of(
    st.integers(),
    st.text(max_size=5),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class CheckpointsMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.cps = factory(clock=self.clock).checkpoints
            # task -> sequence -> (data, expires_at_ms or None); expired ones stay until cleanup
            self.stored: dict[str, dict[int, tuple[Any, int | None]]] = {t: {} for t in TASKS}

        def now(self) -> int:
            return now_ms(self.clock)

        def live(self, task: str) -> dict[int, Any]:
            now = self.now()
            return {
                seq: data
                for seq, (data, exp) in sorted(self.stored[task].items())
                if exp is None or now < exp
            }

        @rule(task=task_st, data=DATA, ttl_ms=TTL_MS)
        def save_auto(self, task: str, data: Any, ttl_ms: int | None) -> None:
            now = self.now()
            cp = self.cps.save(task, data, ttl=None if ttl_ms is None else ttl_ms / 1000)
            assert cp.sequence == max(self.stored[task], default=0) + 1
            self.stored[task][cp.sequence] = (data, None if ttl_ms is None else now + ttl_ms)

        @rule(task=task_st, seq=st.integers(1, 6), data=DATA, ttl_ms=TTL_MS)
        def save_explicit(self, task: str, seq: int, data: Any, ttl_ms: int | None) -> None:
            now = self.now()
            ttl = None if ttl_ms is None else ttl_ms / 1000
            if seq in self.live(task):
                with pytest.raises(CheckpointExistsError):
                    self.cps.save(task, data, sequence=seq, ttl=ttl)
                return
            cp = self.cps.save(task, data, sequence=seq, ttl=ttl)
            assert cp.sequence == seq
            self.stored[task][seq] = (data, None if ttl_ms is None else now + ttl_ms)

        @rule(task=task_st, seq=st.integers(1, 6))
        def load(self, task: str, seq: int) -> None:
            live = self.live(task)
            if seq not in live:
                with pytest.raises(CheckpointNotFoundError):
                    self.cps.load(f"{task}@{seq}")
            else:
                assert self.cps.load(f"{task}@{seq}").data == live[seq]

        @rule(task=task_st, keep=st.integers(0, 3))
        def cleanup(self, task: str, keep: int) -> None:
            live = self.live(task)
            kept = sorted(live)[::-1][:keep]
            assert self.cps.cleanup(task, keep) == len(live) - len(kept)
            self.stored[task] = {s: v for s, v in self.stored[task].items() if s in kept}

        @rule(ms=st.one_of(st.sampled_from([0, 1]), st.integers(0, 2500)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for task in TASKS:
                live = self.live(task)
                listed = self.cps.list(task, page_size=2)
                assert [(c.sequence, c.data) for c in listed] == list(live.items())
                latest = self.cps.load_latest(task)
                if live:
                    assert latest is not None and latest.sequence == max(live)
                else:
                    assert latest is None

    return CheckpointsMachine


def test_checkpoints_model(make_backend: Any) -> None:
    """The checkpoints state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
