"""A lost-answer retry of a counting write counts once, whoever dropped the stale slots.

DynamoDB keeps one slot per call in flight on a counted item (dynacoord._writers: a call leases a
slot from its process's pool, the one given back last). A write drops the slots its process saw
stale, each only while it still holds the token seen (``#rpN = :rpN``). The timeline that
condition closes, with the dropping done by *another process* than the one whose slot it is::

    W: increment in slot s (s = t1) ... then quiet for longer than a retry window
    X: increment, sees s = t1 stale (with more than PRUNE_AT slots on the item)
    W: increment, leases s again (s = t2)  -> applied, its answer lost
    X: increment, drops s if it is gone or still holds t1 -> refused (it holds t2), sent again
       without the drop
    W: (botocore) the same request again  -> refused: s == t2, so "applied": counted once

Without the condition X drops W's slot and W's retry counts a second time.

Each process here is its own slot pool, which holds its memory of the slots its writes saw
(``dynacoord._writers``), swapped in around its calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from dynacoord import ManualClock, _writers
from dynacoord._writers import PRUNE_AT
from dynacoord.backends.dynamodb._retry_window import client_window_ms


class _Process:
    """What one process keeps for counting writes: its slot pool (with the slots seen)."""

    def __init__(self) -> None:
        self.pool = _writers._Pool()

    @contextmanager
    def running(self) -> Iterator[None]:
        saved = _writers._pool[0]
        _writers._pool[0] = self.pool
        try:
            yield
        finally:
            _writers._pool[0] = saved


def _slots(backend: Any, key: str) -> dict[str, str]:
    item = backend.client.get_item(
        TableName=backend.table_name,
        Key={"pk": {"S": f"COUNTER#{backend.namespace}#{key}"}, "sk": {"S": "COUNTER"}},
        ConsistentRead=True,
    )["Item"]
    return {name: av for name, av in item.items() if name.startswith("w:")}


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_a_retry_counts_once_when_another_process_dropped_the_stale_slots(lossy: Any) -> None:
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    counters = backend.counters
    pk = f"COUNTER#{backend.namespace}#k"
    w, x = _Process(), _Process()
    with w.running():
        counters.increment("k")
    [w_slot] = _slots(backend, "k")
    for _ in range(PRUNE_AT):  # more slots than PRUNE_AT: stale ones are worth dropping
        with _Process().running():
            counters.increment("k")
    clock.advance(client_window_ms(backend.client) / 1000 + 1)  # all of them stale
    with x.running():
        counters.increment("k")  # X sees the stale slots, W's among them
    assert w_slot in {name for name, _, _ in x.pool.seen[pk]}

    def x_writes_in_the_gap() -> None:
        with x.running():
            counters.increment("k")

    lossy.lose_next(operation="UpdateItem", then=x_writes_in_the_gap)
    with w.running():
        counters.increment("k")  # W comes back in the same slot; its answer is lost
    assert lossy.lost == 1
    # W twice, PRUNE_AT others once, X twice: W's retry was recognised as applied
    assert counters.get("k") == 2 + PRUNE_AT + 2
    assert w_slot in _slots(backend, "k"), "the slot written again is kept"
