"""The ordered group's gate rules (dynacoord.outbox._gates), the one table of cases the DynamoDB
and MongoDB stores build their gate writes from."""

from __future__ import annotations

import pytest

from dynacoord.outbox import Event, EventStatus, Outcome
from dynacoord.outbox._gates import GateMove, by_group, gate_move
from dynacoord.outbox.event import new_record


def _outcome(
    seq: int, kind: str, *, due: int = 0, counted: bool = True, group: str = "g"
) -> Outcome:
    event = Event("t", {}, id=f"e{seq}", group=group, ordered=True)
    record = new_record(event, EventStatus.IN_FLIGHT, 1, 0, "token", None, None, seq)
    return Outcome(record, kind, due_ms=due, count_attempt=counted)  # type: ignore[arg-type]


CASES = [
    # (outcomes as (seq, kind, due, counted), expected move)
    ([(1, "completed", 0, True)], GateMove(2, None, None)),
    ([(1, "failed", 0, True)], GateMove(2, None, None)),  # a failed place lets its group go on
    ([(1, "completed", 0, True), (2, "completed", 0, True)], GateMove(3, None, None)),
    ([(2, "completed", 0, True), (1, "completed", 0, True)], GateMove(3, None, None)),
    ([(1, "pending", 500, True)], GateMove(None, 1, 500)),  # the head retried: wait until 500
    ([(1, "completed", 0, True), (2, "pending", 700, True)], GateMove(2, 2, 700)),
    ([(1, "completed", 0, True), (2, "pending", 0, False)], GateMove(2, None, None)),
    ([(1, "pending", 0, False)], None),  # given back unhandled: nothing moves
    ([(1, "pending", 900, True), (2, "pending", 900, False)], GateMove(None, 1, 900)),
]


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_gate_move(given: list[tuple[int, str, int, bool]], expected: GateMove | None) -> None:
    outcomes = [_outcome(seq, kind, due=due, counted=counted) for seq, kind, due, counted in given]
    assert gate_move(outcomes) == expected


def test_a_retry_behind_the_moved_gate_is_at_its_head_only_there() -> None:
    move = gate_move([_outcome(1, "completed"), _outcome(2, "pending", due=5)])
    assert move is not None and move.retry_at_head
    move = gate_move([_outcome(1, "completed"), _outcome(3, "pending", due=5)])
    assert move is not None and not move.retry_at_head


def test_only_ordered_events_have_a_gate() -> None:
    plain = Event("t", {}, id="p1")
    record = new_record(plain, EventStatus.IN_FLIGHT, 1, 0, "token", None, None, None)
    grouped = by_group([Outcome(record, "completed"), _outcome(1, "completed", group="a")])
    assert list(grouped) == ["a"]
