"""A join whose item expired and was restarted as a counter is not joined by a process that still
knows the old join (found by ``make stress``: the counters model on moto, 5x).

The process learnt the join's generation when it joined; the join's expiry was then shortened
(``extend_ttl``), so the join ended before the process thinks it did. An increment restarted the
key as a counter (keeping no member) and ``extend_ttl`` gave the counter an expiry. The next
``join`` of the process must be refused (``CounterTypeError``), as for any counter; on DynamoDB
the carry to the join item checked the generation (which the counter kept) and not the kind, so
it counted the arrival on the counter: ``JoinResult(count=2)``.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.errors import CounterTypeError


def test_a_join_restarted_as_a_counter_is_not_joined_again(make_backend: Any) -> None:
    clock = ManualClock()
    counters = make_backend(clock=clock).counters
    counters.join("k", "m1", expected=3, ttl=4.0)
    assert counters.extend_ttl("k", 0.5)  # ends sooner than the joining process knows
    clock.advance(1.0)
    assert counters.increment("k") == 1  # the expired join restarted as a counter
    assert counters.extend_ttl("k", 10.0)
    with pytest.raises(CounterTypeError):
        counters.join("k", "m2", expected=3, ttl=4.0)
    assert counters.get("k") == 1
