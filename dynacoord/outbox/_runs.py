"""The claimable run of each ordered group among the events a batch claim saw (shared by the
Redis and MongoDB stores)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .event import EventRecord

__all__ = ["GroupRun", "group_runs"]


@dataclass(slots=True)
class GroupRun:
    """Of one ordered group in a batch: ``members``, the consecutive places from the smallest one
    seen (``start``), in place order; ``after_gap``, the group's events seen after the first gap
    (never claimable in this batch)."""

    group: str
    start: int
    members: list[EventRecord] = field(default_factory=list)
    after_gap: list[EventRecord] = field(default_factory=list)


def group_runs(seen: Sequence[EventRecord]) -> dict[str, GroupRun]:
    """The :class:`GroupRun` of every ordered group in ``seen`` (unordered events are left out;
    an event seen twice counts once)."""
    by_group: dict[str, dict[str, EventRecord]] = {}
    for record in seen:
        if record.seq is not None and record.event.group is not None:
            by_group.setdefault(record.event.group, {}).setdefault(record.id, record)
    runs: dict[str, GroupRun] = {}
    for group, records in by_group.items():
        ordered = sorted(records.values(), key=lambda r: r.seq or 0)
        run = GroupRun(group, ordered[0].seq or 0, [ordered[0]])
        for record in ordered[1:]:
            if not run.after_gap and record.seq == (run.members[-1].seq or 0) + 1:
                run.members.append(record)
            else:
                run.after_gap.append(record)
        runs[group] = run
    return runs
