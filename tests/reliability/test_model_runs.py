"""Model-based test of workflow runs against an in-memory reference model.

Runs start (an id that is live is refused; one that ended and outlived its TTL is reusable), take
context patches and heartbeats while running (refused once ended, or when missing), end as
completed or failed with a TTL, and are listed by status and found stalled (no update for
``older_than``, oldest first) exactly as the model says. The ``ManualClock`` advances so runs go
stale and ended runs expire. Runs on every contract backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from dynacoord import ManualClock, RunExistsError, RunNotFoundError
from dynacoord._clock import now_ms
from dynacoord.errors import RunNotRunningError
from dynacoord.runs import RunStatus
from tests.reliability.conftest import run_model

IDS = ("r1", "r#2", "r3")
id_st = st.sampled_from(IDS)
FIELDS = st.sampled_from(["step", "cursor", "n"])
VALUES = st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none())


@dataclass
class Model:
    status: RunStatus
    context: dict[str, Any]
    updated: int
    ttl_after_end: int
    expires: int | None = None
    result: Any = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def make_machine(factory: Any) -> type[RuleBasedStateMachine]:
    class RunsMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = ManualClock()
            self.runs = factory(clock=self.clock).runs
            self.model: dict[str, Model] = {}

        def now(self) -> int:
            return now_ms(self.clock)

        def live(self, run_id: str) -> Model | None:
            m = self.model.get(run_id)
            if m is None or (m.expires is not None and self.now() >= m.expires):
                return None
            return m

        def _expect_running(self, run_id: str) -> tuple[Model | None, type[Exception] | None]:
            m = self.live(run_id)
            if m is None:
                return None, RunNotFoundError
            if m.status is not RunStatus.RUNNING:
                return m, RunNotRunningError
            return m, None

        @rule(
            run_id=id_st,
            context=st.dictionaries(FIELDS, VALUES, max_size=2),
            ttl_ms=st.integers(1, 4000),
        )
        def start(self, run_id: str, context: dict[str, Any], ttl_ms: int) -> None:
            if self.live(run_id) is not None:
                with pytest.raises(RunExistsError):
                    self.runs.start(run_id, context=context, ttl_after_end=ttl_ms / 1000)
                return
            run = self.runs.start(run_id, context=context, ttl_after_end=ttl_ms / 1000)
            assert run.status is RunStatus.RUNNING and run.context == context
            self.model[run_id] = Model(RunStatus.RUNNING, dict(context), self.now(), ttl_ms)

        @rule(
            run_id=id_st,
            set_=st.dictionaries(FIELDS, VALUES, max_size=2),
            remove=st.lists(FIELDS, max_size=2, unique=True),
        )
        def patch(self, run_id: str, set_: dict[str, Any], remove: list[str]) -> None:
            remove = [f for f in remove if f not in set_]
            m, error = self._expect_running(run_id)
            if error is not None:
                with pytest.raises(error):
                    self.runs.patch(run_id, set=set_, remove=remove)
                return
            assert m is not None
            run = self.runs.patch(run_id, set=set_, remove=remove)
            m.context.update(set_)
            for name in remove:
                m.context.pop(name, None)
            m.updated = self.now()
            assert run.context == m.context and run.updated_at_ms == m.updated

        @rule(run_id=id_st)
        def heartbeat(self, run_id: str) -> None:
            m, error = self._expect_running(run_id)
            if error is not None:
                with pytest.raises(error):
                    self.runs.heartbeat(run_id)
                return
            assert m is not None
            assert self.runs.heartbeat(run_id).updated_at_ms == self.now()
            m.updated = self.now()

        @rule(run_id=id_st, ok=st.booleans(), result=VALUES)
        def finish(self, run_id: str, ok: bool, result: Any) -> None:
            m, error = self._expect_running(run_id)
            call = (
                (lambda: self.runs.complete(run_id, result))
                if ok
                else (lambda: self.runs.fail(run_id, "it broke"))
            )
            if error is not None:
                with pytest.raises(error):
                    call()
                return
            assert m is not None
            run = call()
            now = self.now()
            m.status = RunStatus.COMPLETED if ok else RunStatus.FAILED
            m.updated, m.expires = now, now + m.ttl_after_end
            m.result, m.error = (result, None) if ok else (None, "it broke")
            assert run.status is m.status and run.ended_at_ms == now
            assert run.expires_at_ms == m.expires

        @rule(older_than_ms=st.sampled_from([0, 1, 1000, 2500]))
        def stalled(self, older_than_ms: int) -> None:
            cutoff = self.now() - older_than_ms
            expected = sorted(
                (m.updated, run_id)
                for run_id in IDS
                if (m := self.live(run_id)) is not None
                and m.status is RunStatus.RUNNING
                and m.updated < cutoff
            )
            got = [(r.updated_at_ms, r.run_id) for r in self.runs.stalled(older_than_ms / 1000)]
            assert got == expected

        @rule(status=st.sampled_from(list(RunStatus)))
        def list_status(self, status: RunStatus) -> None:
            expected = sorted(
                (m.updated, run_id)
                for run_id in IDS
                if (m := self.live(run_id)) is not None and m.status is status
            )
            assert [(r.updated_at_ms, r.run_id) for r in self.runs.list(status)] == expected

        @rule(ms=st.one_of(st.sampled_from([0, 1]), st.integers(0, 3000)))
        def advance(self, ms: int) -> None:
            self.clock.advance(ms / 1000)

        @invariant()
        def store_agrees_with_model(self) -> None:
            for run_id in IDS:
                run = self.runs.get(run_id)
                m = self.live(run_id)
                if m is None:
                    assert run is None, f"{run_id!r} should be gone at {self.now()}: {run}"
                    continue
                assert run is not None, f"{run_id!r} should be {m}"
                assert (run.status, run.context, run.updated_at_ms, run.expires_at_ms) == (
                    m.status,
                    m.context,
                    m.updated,
                    m.expires,
                )
                assert (run.result, run.error) == (m.result, m.error)

    return RunsMachine


def test_runs_model(make_backend: Any) -> None:
    """The runs state machine on every contract backend (moto, DynamoDB Local, Redis, MongoDB)."""
    run_model(make_machine(make_backend), make_backend)
