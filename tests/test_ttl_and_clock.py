"""TTL and duration validation, and the manual clock."""

from __future__ import annotations

import time

import pytest

from dynacoord import (
    MANUAL_CLOCK_START,
    ManualClock,
)
from dynacoord._validate import non_negative_seconds, ttl_to_ms

# -- validation and clock --------------------------------------------------------------------------


def test_ttl_validation():
    assert ttl_to_ms(1) == 1000
    assert ttl_to_ms(0.0015) == 2  # rounds up to whole ms
    for bad, error in [
        (0, ValueError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (10**12, ValueError),
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
    ]:
        with pytest.raises(error):
            ttl_to_ms(bad)
    assert non_negative_seconds(0, "timeout") == 0
    with pytest.raises(ValueError):
        non_negative_seconds(-0.1, "timeout")


def test_manual_clock():
    clock = ManualClock(100.0)
    clock.sleep(1.5)
    assert clock.time() == 101.5 and clock.monotonic() == 1.5
    clock.set(50)
    assert clock.time() == 50 and clock.monotonic() == 1.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_manual_clock_starts_in_the_real_future():
    # DynamoDB's TTL deletes by the real clock, so an entry a past ManualClock still sees as live
    # can vanish; decades of headroom keep test data out of its reach.
    assert ManualClock().time() == MANUAL_CLOCK_START
    assert time.time() + 10 * 365 * 24 * 3600 < MANUAL_CLOCK_START
