"""The rounds of a race for an ordered group's gate: an ordered publish (DynamoDB) or a
``retry(group=...)`` (DynamoDB, MongoDB) reads the gate, writes conditional on what it read, and
reads again when a racing publisher moved it meanwhile (pure but for the pause)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

from ._gates import RACE_BACKOFF_FIRST, RACE_BACKOFF_MAX, RACE_ROUNDS

__all__ = ["race_rounds"]


def race_rounds(sleep: Callable[[float], None]) -> Iterator[int]:
    """The numbers of ``RACE_ROUNDS`` rounds, ``sleep`` called before each after the first: a
    full-jitter pause doubling from ``RACE_BACKOFF_FIRST`` up to ``RACE_BACKOFF_MAX``, which keeps
    the losers of one round apart before they read again. A caller that wins returns from its
    loop; one that runs out of rounds raises its own error."""
    delay = RACE_BACKOFF_FIRST
    for round_ in range(RACE_ROUNDS):
        if round_:
            sleep(random.uniform(0, delay))
            delay = min(RACE_BACKOFF_MAX, delay * 2)
        yield round_
