"""FailureRate.success_flush_interval: how long successes that change no decision wait."""

from __future__ import annotations

import pytest

from dynacoord import FailureRate
from dynacoord.errors import InvalidValueError


def test_the_default_is_half_the_window_or_flush_interval_if_longer() -> None:
    assert FailureRate().success_interval == 30.0
    assert FailureRate(window=10.0).success_interval == 5.0
    assert FailureRate(flush_interval=40.0).success_interval == 40.0
    assert FailureRate(success_flush_interval=12).success_interval == 12.0


@pytest.mark.parametrize("value", [0.5, 60.0, 90, -1])
def test_outside_flush_interval_to_the_window_is_refused(value: float) -> None:
    with pytest.raises(InvalidValueError, match="success_flush_interval"):
        FailureRate(flush_interval=1.0, success_flush_interval=value)


def test_a_value_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(TypeError):
        FailureRate(success_flush_interval="10")  # type: ignore[arg-type]


def test_near_a_decision() -> None:
    policy = FailureRate(threshold=0.5, minimum_calls=20)
    assert policy.near(10, 3)  # half the calls, a quarter failing
    assert not policy.near(9, 9)  # too few calls to matter yet
    assert not policy.near(100, 24)
