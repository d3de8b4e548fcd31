"""The worker's delivery decision, a pure function: what is stored for an event it holds, given
what came of it (handler succeeded, raised, was missing, or the event was claimed too often)."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord.outbox import Event, EventRecord, EventStatus, Outcome
from dynacoord.outbox._decide import (
    CLAIMED_TOO_OFTEN,
    NO_HANDLER,
    SUCCEEDED,
    Result,
    decide,
    raised,
    retry_delay_ms,
)
from dynacoord.outbox.options import WorkerOptions

NOW = 1_700_000_000_000
CRASHED = (
    "claimed {n} times; the last attempt ended without an outcome "
    "(worker crashed or overran its lease)"
)
NO_HANDLER_TEXT = "no handler for event type 'order.placed'"


def held(attempts: int) -> EventRecord:
    return EventRecord(
        Event("order.placed", {"n": 1}, id="e1", occurred_at=NOW / 1000),
        EventStatus.IN_FLIGHT,
        attempts,
        NOW + 30_000,
        lease_token="tok",
    )


def top(low: float, high: float) -> float:
    """The jitter that takes the whole spread: the full (capped) delay."""
    assert low == 0
    return high


def bottom(low: float, high: float) -> float:
    """The jitter that takes none of it: half the delay."""
    return low


def no_jitter(low: float, high: float) -> float:
    raise AssertionError("jitter is asked only for a retry")


def run(
    attempts: int,
    result: Result,
    *,
    policy: Any = "fail",
    jitter: Any = no_jitter,
    max_attempts: int = 5,
) -> Outcome:
    options = WorkerOptions(
        max_attempts=max_attempts, backoff=1.0, max_backoff=5.0, on_missing_handler=policy
    )
    return decide(held(attempts), result, options, now_ms=NOW, jitter=jitter)


# (case, attempts, result, missing-handler policy, jitter, expected (kind, due_ms, error));
# backoff 1 s, max_backoff 5 s, max_attempts 5
CASES = [
    ("success", 1, SUCCEEDED, "fail", no_jitter, ("completed", 0, None)),
    ("success on the last attempt", 5, SUCCEEDED, "fail", no_jitter, ("completed", 0, None)),
    ("first failure: backoff", 1, raised("E: x"), "fail", top, ("pending", NOW + 1_000, "E: x")),
    ("second failure: doubled", 2, raised("E: x"), "fail", top, ("pending", NOW + 2_000, "E: x")),
    ("fourth failure: capped", 4, raised("E: x"), "fail", top, ("pending", NOW + 5_000, "E: x")),
    ("jitter keeps half", 3, raised("E: x"), "fail", bottom, ("pending", NOW + 2_000, "E: x")),
    ("last attempt: failed", 5, raised("E: x"), "fail", no_jitter, ("failed", 0, "E: x")),
    ("missing, fail", 1, NO_HANDLER, "fail", no_jitter, ("failed", 0, NO_HANDLER_TEXT)),
    ("missing, retry", 1, NO_HANDLER, "retry", top, ("pending", NOW + 1_000, NO_HANDLER_TEXT)),
    ("missing, retry, last", 5, NO_HANDLER, "retry", no_jitter, ("failed", 0, NO_HANDLER_TEXT)),
    ("missing, skip", 1, NO_HANDLER, "skip", no_jitter, ("completed", 0, NO_HANDLER_TEXT)),
    ("claimed too often", 6, CLAIMED_TOO_OFTEN, "fail", no_jitter, ("failed", 0, CRASHED)),
    ("claimed 9 times", 9, CLAIMED_TOO_OFTEN, "retry", no_jitter, ("failed", 0, CRASHED)),
]


@pytest.mark.parametrize(
    ("attempts", "result", "policy", "jitter", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_decide(attempts: int, result: Result, policy: str, jitter: Any, expected: Any) -> None:
    kind, due_ms, error = expected
    if error is not None:
        error = error.format(n=attempts)
    outcome = run(attempts, result, policy=policy, jitter=jitter)
    assert outcome == Outcome(held(attempts), kind, due_ms=due_ms, error=error)
    assert outcome.count_attempt is True  # only a release gives the attempt back


def test_backoff_grows_to_its_cap_and_stays_there() -> None:
    delays = [
        retry_delay_ms(attempt, backoff=0.5, max_backoff=6.0, jitter=top) for attempt in range(1, 8)
    ]
    assert delays == [500, 1_000, 2_000, 4_000, 6_000, 6_000, 6_000]
    halves = [
        retry_delay_ms(attempt, backoff=0.5, max_backoff=6.0, jitter=bottom)
        for attempt in range(1, 8)
    ]
    assert halves == [d // 2 for d in delays]


def test_the_jitter_spreads_between_half_and_all_of_the_delay() -> None:
    asked: list[tuple[float, float]] = []

    def middle(low: float, high: float) -> float:
        asked.append((low, high))
        return (low + high) / 2

    outcome = run(3, raised("E: x"), jitter=middle)
    assert asked == [(0, 2.0)]  # 4 s delay: 2 s kept, up to 2 s more
    assert outcome.due_ms == NOW + 3_000


def test_a_single_attempt_budget_fails_at_once() -> None:
    outcome = run(1, raised("E: x"), max_attempts=1)
    assert (outcome.kind, outcome.error) == ("failed", "E: x")
