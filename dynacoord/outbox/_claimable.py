"""The claimable stretch of each ordered group among the events a batch claim saw (shared by the
three stores)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .event import EventRecord

__all__ = ["ClaimableStretch", "claimable_stretches"]


@dataclass(slots=True)
class ClaimableStretch:
    """Of one ordered group in a batch: ``members``, the consecutive places from the smallest one
    seen (``start``), in place order; ``after_gap``, the group's events seen after the first gap
    (never claimable in this batch)."""

    group: str
    start: int
    members: list[EventRecord] = field(default_factory=list)
    after_gap: list[EventRecord] = field(default_factory=list)


def claimable_stretches(seen: Sequence[EventRecord]) -> dict[str, ClaimableStretch]:
    """The :class:`ClaimableStretch` of every ordered group in ``seen`` (unordered events are left
    out; an event seen twice counts once)."""
    by_group: dict[str, dict[str, EventRecord]] = {}
    for record in seen:
        if record.seq is not None and record.event.group is not None:
            by_group.setdefault(record.event.group, {}).setdefault(record.id, record)
    stretches: dict[str, ClaimableStretch] = {}
    for group, records in by_group.items():
        ordered = sorted(records.values(), key=lambda r: r.seq or 0)
        stretch = ClaimableStretch(group, ordered[0].seq or 0, [ordered[0]])
        for record in ordered[1:]:
            if not stretch.after_gap and record.seq == (stretch.members[-1].seq or 0) + 1:
                stretch.members.append(record)
            else:
                stretch.after_gap.append(record)
        stretches[group] = stretch
    return stretches
