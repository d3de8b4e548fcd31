"""Counting writes cost what concurrency sets, and recognise a retry for as long as the client
may send it (DESIGN.md section 1; docs/counters.md, "A slot per call in flight").

* A slot is leased for one call: a thread-per-request server (a new thread for each increment)
  leaves one slot on the item, not one per thread ever created. Units by AWS's rules, from the
  item's size: 1 WCU per started KB of the larger of the item before and after a write.
* The window is the client's own: a retry that comes after botocore's default read timeout
  (60 s, the previous design's whole window), with more than 8 other writers in the gap whose
  writes drop stale slots, still finds its slot.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from bench._units import item_size, write_units
from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import unique_name
from tests.slot_pools import Process

RATE = 100  # increments per second


def _size(client: Any, table: str, pk: str, sk: str) -> int:
    item = client.get_item(
        TableName=table, Key={"pk": {"S": pk}, "sk": {"S": sk}}, ConsistentRead=True
    ).get("Item")
    return item_size(item) if item else 0


def _thread_per_request(op: Any, clock: ManualClock, calls: int, sample: Any) -> int:
    """``calls`` calls of ``op``, each in a new thread, the clock advancing 1/RATE s per call;
    the largest item size ``sample()`` saw (every 200 calls and at the end)."""
    worst = 0
    for i in range(calls):
        thread = threading.Thread(target=op)
        thread.start()
        thread.join()
        clock.advance(1 / RATE)
        if i % 200 == 199 or i == calls - 1:
            worst = max(worst, sample())
    return worst


def test_a_thread_per_request_at_100_per_s_for_a_minute_keeps_an_increment_within_2_wcu(
    ddb_table,
) -> None:
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("tpr"), clock=clock)
    counters = backend.counters
    pk = f"COUNTER#{backend.namespace}#hot"
    worst = _thread_per_request(
        lambda: counters.increment("hot"),
        clock,
        60 * RATE,
        lambda: _size(client, table, pk, "COUNTER"),
    )
    assert counters.get("hot") == 60 * RATE
    # before: one slot per thread, 6,000 slots (~140 KB, ~140 WCU per increment)
    assert write_units(worst, worst) <= 2, f"item of {worst} bytes"


def test_a_thread_per_request_keeps_cache_incr_within_2_wcu(ddb_table) -> None:
    client, table = ddb_table
    clock = ManualClock()
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("tpr"), clock=clock)
    cache = backend.cache()
    pk = f"CACHE#{backend.namespace}#hot"
    worst = _thread_per_request(
        lambda: cache.incr("hot"), clock, 10 * RATE, lambda: _size(client, table, pk, "CACHE")
    )
    assert cache.get("hot") == 10 * RATE
    assert write_units(worst, worst) <= 2, f"item of {worst} bytes"


# -- the window is the client's own --------------------------------------------------------------

#: botocore's default read timeout, and one second more: the previous design's whole window
GAP_S = 61
#: other processes writing the item in the gap: more than PRUNE_AT, so stale slots are dropped
OTHERS = 12


def test_an_increment_retried_after_a_default_read_timeout_counts_once(lossy) -> None:
    clock = ManualClock()
    counters = lossy.backend(clock=clock).counters

    def gap() -> None:
        clock.advance(GAP_S)
        for _ in range(OTHERS):
            Process().run(counters.increment, "n")

    lossy.lose_next(then=gap)
    counters.increment("n")
    assert lossy.lost == 1
    # before: the slot was older than 60 s, so the others' writes dropped it: 14 stored
    assert counters.get("n") == 1 + OTHERS


def test_a_breaker_failure_retried_after_a_default_read_timeout_counts_once(lossy) -> None:
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    breaker = backend.breaker("svc", failure_threshold=10**6, reset_timeout=60)

    def gap() -> None:
        clock.advance(GAP_S)
        for _ in range(OTHERS):
            Process().run(breaker.record_failure)

    lossy.lose_next(then=gap)
    breaker.record_failure()
    assert lossy.lost == 1
    assert breaker.status().failures == 1 + OTHERS


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)
def test_a_slot_is_kept_while_its_clients_window_is_open(lossy) -> None:
    """At the edge: a retry one second inside the window of the client's configuration."""
    clock = ManualClock()
    backend = lossy.backend(clock=clock)
    counters = backend.counters
    window_s = backend.table.count_window_ms / 1000

    def gap() -> None:
        clock.advance(window_s - 1)
        for _ in range(OTHERS):
            Process().run(counters.increment, "n")

    lossy.lose_next(then=gap)
    counters.increment("n")
    assert lossy.lost == 1
    assert counters.get("n") == 1 + OTHERS


# -- a delete or a replacement between an applied write and its retry ------------------------------
#
# docs/guarantees.md states each backend's answer: Redis keeps the slots in a hash beside the
# item, which outlives a delete or a set, so the retry is recognised; DynamoDB and MongoDB
# delete a counter in place, keeping its slots, but a cache.set replaces the item, and the retry
# applies again to what it left.

_RECOGNISED_ACROSS_A_DELETE = ("redis", "redis_cluster", "dynamodb", "mongo")
_RECOGNISED_ACROSS_A_SET = ("redis", "redis_cluster")


def test_an_increment_retried_across_a_delete_answers_as_stated(lossy) -> None:
    counters = lossy.backend().counters
    counters.increment("n", 5)
    lossy.lose_next(then=lambda: counters.delete("n"))
    # before: AssertionError on Redis (an applied retry, no item); 1 on DynamoDB and MongoDB
    value = counters.increment("n")
    assert lossy.lost == 1
    if lossy.kind in _RECOGNISED_ACROSS_A_DELETE:
        assert (value, counters.get("n")) == (0, None)  # counted once, before the delete
    else:
        assert (value, counters.get("n")) == (1, 1)  # applied again after the delete


def test_cache_incr_retried_across_a_set_answers_as_stated(lossy) -> None:
    cache = lossy.backend().cache()
    cache.set("k", 5)
    lossy.lose_next(then=lambda: cache.set("k", 100))
    value = cache.incr("k")
    assert lossy.lost == 1
    expected = 100 if lossy.kind in _RECOGNISED_ACROSS_A_SET else 101
    assert (value, cache.get("k")) == (expected, expected)
