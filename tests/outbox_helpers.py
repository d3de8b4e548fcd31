"""What the outbox tests share: running a worker until nothing is left for it."""

from __future__ import annotations

from typing import Any

from dynacoord import ManualClock


def drain(
    worker: Any, *, clock: ManualClock | None = None, step: float = 2.0, rounds: int = 1000
) -> int:
    """Run ``worker.run_once()`` until a round handles nothing; return the events handled.

    With ``clock``, the clock moves ``step`` seconds after each round that handled something, so
    an event put back with a short backoff (or an ordered group's next event) comes due. An
    outbox that still hands out events after ``rounds`` rounds is an AssertionError, not a hang.
    """
    total = 0
    for _ in range(rounds):
        handled = worker.run_once()
        if not handled:
            return total
        total += handled
        if clock is not None:
            clock.advance(step)
    raise AssertionError(f"the outbox did not drain in {rounds} rounds ({total} events handled)")
