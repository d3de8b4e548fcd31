"""A lost-answer retry of a counting write counts once, whoever dropped the stale writer slots.

DynamoDB keeps one slot per writer on a counted item (dynacoord._writers); a write drops the
slots another write of its process saw stale, each only while it still holds the token seen
(``#rpN = :rpN``). The timeline that condition closes, with the pruning done by a *different*
writer (in another process) than the one that came back::

    W: increment (slot[W] = t1) ... quiet for more than a window
    X: increment, sees slot[W] = t1 stale (with more than PRUNE_AT slots on the item)
    W: increment (slot[W] = t2)  -> applied, its answer lost
    X: increment, drops slot[W] if it still holds t1 -> refused (it holds t2), sent again
       without the drop
    W: (botocore) the same request again  -> refused: slot[W] == t2, so "applied": counted once

Without the condition X drops W's slot and W's retry counts a second time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord._writers import PRUNE_AT, WINDOW_MS
from dynacoord.backends.dynamodb import _table


def _slots(backend: Any, key: str) -> dict[str, str]:
    item = backend.client.get_item(
        TableName=backend.table_name,
        Key={"pk": {"S": f"COUNTER#{backend.namespace}#{key}"}, "sk": {"S": "COUNTER"}},
        ConsistentRead=True,
    )["Item"]
    return {name: av["N"] for name, av in item.items() if name.startswith("w:")}


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_a_retry_counts_once_when_another_writer_dropped_the_stale_slots(lossy: Any) -> None:
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    counters = backend.counters
    pk = f"COUNTER#{backend.namespace}#k"
    # One thread is one writer: W and X each keep theirs for the whole test.
    with ThreadPoolExecutor(1) as w, ThreadPoolExecutor(1) as x:
        w.submit(counters.increment, "k").result()
        [w_slot] = _slots(backend, "k")
        for _ in range(PRUNE_AT):  # more slots than PRUNE_AT: stale ones are worth dropping
            other = threading.Thread(target=counters.increment, args=("k",))
            other.start()
            other.join()
        clock.advance(WINDOW_MS / 1000 + 1)
        x.submit(counters.increment, "k").result()  # X sees the stale slots, W's among them
        # What X saw is X's process's memory; W is another process and has seen nothing.
        seen_by_x = _table._stale.pop(pk)
        assert w_slot in {name for name, _ in seen_by_x}

        def x_writes_in_the_gap() -> None:
            _table._stale[pk] = seen_by_x
            x.submit(counters.increment, "k").result()

        lossy.lose_next(operation="UpdateItem", then=x_writes_in_the_gap)
        w.submit(counters.increment, "k").result()  # W comes back; its answer is lost
    assert lossy.lost == 1
    # W twice, PRUNE_AT others once, X twice: W's retry was recognised as applied
    assert counters.get("k") == 2 + PRUNE_AT + 2
    assert w_slot in _slots(backend, "k"), "the writer that came back keeps its slot"
