"""The rules of an ordered group's gate, in one place for the stores that keep one as an item
(DynamoDB, MongoDB; the Redis script carries the same rules in Lua, held to these cases by
``tests/test_outbox_gates.py``).

A group's gate holds ``next_seq``, the first place not yet finished. Places are delivered in
order: a claim of place k checks ``next_seq >= k`` (everything before it is finished). When a
batch's outcomes are stored, the gate moves:

* past the last **finished** place (completed, or failed for good: a failed event lets its group
  go on, as documented), never back (a gate moved further by someone else stays);
* and when the place it then points to went back to pending **with an attempt counted** (a
  handler failed and will be retried), ``retry_due_ms`` says when the group may move again: the
  places after it wait, postponed, rather than being claimed and given back poll after poll.

A place given back unhandled (``count_attempt=False``) moves nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .store import Outcome

__all__ = [
    "RACE_BACKOFF_FIRST",
    "RACE_BACKOFF_MAX",
    "RACE_ROUNDS",
    "GateMove",
    "by_group",
    "gate_move",
]

#: How often an ordered publish (or ``retry(group=...)``) reads its groups' gates again when racing
#: publishers moved them, and the pause between rounds (seconds; full jitter, doubling up to the
#: cap): without it, racing publishers of one group read and write in lockstep and the same ones
#: lose every round (8 rounds without a pause: 16 of 120 publishes of 8 threads gave up).
RACE_ROUNDS = 40
RACE_BACKOFF_FIRST = 0.008
RACE_BACKOFF_MAX = 0.25


@dataclass(frozen=True, slots=True)
class GateMove:
    """What one group's stored outcomes do to its gate."""

    #: ``next_seq`` moves up to this, never back (None: no place finished)
    after: int | None
    #: the place that went back to pending with an attempt counted (None: none) ...
    retry_seq: int | None
    #: ... and when the group may move again, if the gate then points at it
    retry_due_ms: int | None

    @property
    def retry_at_head(self) -> bool:
        """Whether the retried place is the one the moved gate points at (so the move sets
        ``retry_due_ms`` with it); without a move, a retry is checked against the gate as it
        is."""
        return self.retry_seq is not None and self.retry_seq == self.after


def by_group(outcomes: Iterable[Outcome]) -> dict[str, list[Outcome]]:
    """The outcomes of ordered events, by group."""
    groups: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        group = outcome.record.event.group
        if outcome.record.seq is not None and group is not None:
            groups.setdefault(group, []).append(outcome)
    return groups


def gate_move(outcomes: Sequence[Outcome]) -> GateMove | None:
    """The gate move of one group's outcomes of one batch (None: nothing moves)."""
    members = sorted(outcomes, key=lambda o: o.record.seq or 0)
    finished = [o.record.seq or 0 for o in members if o.kind != "pending"]
    retry = next((o for o in members if o.kind == "pending" and o.count_attempt), None)
    after = max(finished) + 1 if finished else None
    if after is None and retry is None:
        return None
    if retry is None:
        return GateMove(after, None, None)
    return GateMove(after, retry.record.seq or 0, retry.due_ms)
