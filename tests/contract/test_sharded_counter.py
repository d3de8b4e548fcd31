"""Sharded counters (issue 29): N counter items, increments spread, reads summed; exact under
lost responses like a plain counter (every backend)."""

from __future__ import annotations

import threading

import pytest

from dynacoord.errors import CounterTypeError, InvalidKeyError
from tests.conftest import needs_atomic_store


def test_increments_spread_over_the_shards_and_the_value_sums_them(make_backend):
    counters = make_backend().counters
    hot = counters.sharded("hits", shards=4)
    for _ in range(200):
        hot.increment()
    hot.increment(-50)
    assert hot.value() == 150
    per_shard = [counters.get(f"hits#shard{i}") or 0 for i in range(4)]
    assert sum(per_shard) == 150
    assert sum(1 for n in per_shard if n) >= 2  # spread, not one hot item


def test_concurrent_increments_are_all_counted(make_backend):
    needs_atomic_store(make_backend)
    counters = make_backend().counters
    hot = counters.sharded("c", shards=3)

    def work() -> None:
        for _ in range(25):
            hot.increment()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert hot.value() == 100


def test_delete_removes_every_shard(make_backend):
    counters = make_backend().counters
    hot = counters.sharded("d", shards=2)
    for _ in range(10):
        hot.increment()
    assert hot.delete() is True
    assert hot.value() == 0
    assert hot.delete() is False


def test_bad_shards_and_kinds(make_backend):
    counters = make_backend().counters
    with pytest.raises(ValueError):
        counters.sharded("x", shards=0)
    with pytest.raises(ValueError):
        counters.sharded("x", shards=101)
    with pytest.raises(InvalidKeyError):
        counters.sharded("", shards=2)
    counters.set_if_absent("f#shard0", "flag")
    flagged = counters.sharded("f", shards=1)
    with pytest.raises(CounterTypeError):
        flagged.increment()


def test_a_lost_response_counts_once(lossy):
    counters = lossy.backend().counters
    hot = counters.sharded("n", shards=3)
    for _ in range(5):
        hot.increment()
    lossy.lose_next()
    hot.increment()
    assert lossy.lost == 1
    assert hot.value() == 6
