"""What a worker stores for an event it holds, given what came of it: a pure function, so that
the delivery policy (backoff, the last attempt, the missing-handler policy, the crash limit) is
read and tested in one place, apart from the worker's I/O, clock, logging and hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from .event import EventRecord
from .options import MissingHandlerPolicy
from .store import Outcome

__all__ = [
    "CLAIMED_TOO_OFTEN",
    "NO_HANDLER",
    "SUCCEEDED",
    "Jitter",
    "MissingHandlerPolicy",
    "Result",
    "ResultKind",
    "RetryPolicy",
    "decide",
    "no_handler_error",
    "raised",
    "retry_delay_ms",
]


class RetryPolicy(Protocol):
    """The options :func:`decide` reads (a :class:`~.options.WorkerOptions` has them)."""

    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff(self) -> float: ...
    @property
    def max_backoff(self) -> float: ...
    @property
    def on_missing_handler(self) -> MissingHandlerPolicy: ...
    @property
    def lease_ms(self) -> int: ...


#: what came of an event the worker held: its handler returned, raised, there was none for its
#: type, or it was not run because the event had been claimed more than ``max_attempts`` times
ResultKind = Literal["succeeded", "raised", "no_handler", "claimed_too_often"]
#: ``jitter(low, high)``: a number in [low, high] (``random.uniform``)
Jitter = Callable[[float, float], float]


@dataclass(frozen=True, slots=True)
class Result:
    """What came of one held event; ``error`` is the handler's error text for ``"raised"``."""

    kind: ResultKind
    error: str | None = None


SUCCEEDED = Result("succeeded")
NO_HANDLER = Result("no_handler")
CLAIMED_TOO_OFTEN = Result("claimed_too_often")


def raised(error: str) -> Result:
    return Result("raised", error)


def decide(
    record: EventRecord,
    result: Result,
    policy: RetryPolicy,
    *,
    now_ms: int,
    jitter: Jitter,
) -> Outcome:
    """The outcome to store for ``record`` (as claimed, ``record.attempts`` counting this
    attempt) under ``policy``. A failure is retried after
    ``min(max_backoff, backoff * 2**(attempts-1))`` seconds with equal jitter, or is final on
    the last attempt. ``jitter`` is asked only for a retry."""
    if result.kind == "succeeded":
        return Outcome(record, "completed")
    if result.kind == "claimed_too_often":
        # Every earlier claim ended without an outcome: the worker was killed, ran out of
        # Lambda time or memory, or overran its lease. Each expired lease counted an attempt;
        # without this an event that kills its worker would be redelivered forever.
        error = (
            f"claimed {record.attempts} times; the last attempt ended without an outcome "
            "(worker crashed or overran its lease)"
        )
        return _failure(record, error, policy, now_ms, jitter)
    if result.kind == "no_handler":
        if policy.on_missing_handler == "leave":
            # For a worker that has its handler: given back unhandled (no attempt counted),
            # due again after one lease, so that this worker's next polls do not take it again
            # at once (two writes a lease while only workers without its handler poll).
            return Outcome(record, "pending", due_ms=now_ms + policy.lease_ms, count_attempt=False)
        error = no_handler_error(record)
        if policy.on_missing_handler == "skip":
            return Outcome(record, "completed", error=error)  # completed, not delivered
        if policy.on_missing_handler == "retry":
            return _failure(record, error, policy, now_ms, jitter)
        return Outcome(record, "failed", error=error)
    assert result.error is not None, "a raised result carries the handler's error"
    return _failure(record, result.error, policy, now_ms, jitter)


def no_handler_error(record: EventRecord) -> str:
    return f"no handler for event type {record.type!r}"


def retry_delay_ms(attempt: int, *, backoff: float, max_backoff: float, jitter: Jitter) -> int:
    """The wait before the retry after failed attempt ``attempt`` (1 for the first)."""
    delay = min(max_backoff, backoff * 2 ** max(0, attempt - 1))
    # Equal jitter: at least half the delay (backoff is kept), the rest spread out.
    jittered = delay / 2 + jitter(0, delay / 2)
    return int(jittered * 1000)


def _failure(
    record: EventRecord, error: str, policy: RetryPolicy, now_ms: int, jitter: Jitter
) -> Outcome:
    if record.attempts >= policy.max_attempts:
        return Outcome(record, "failed", error=error)
    delay = retry_delay_ms(
        record.attempts, backoff=policy.backoff, max_backoff=policy.max_backoff, jitter=jitter
    )
    return Outcome(record, "pending", due_ms=now_ms + delay, error=error)
