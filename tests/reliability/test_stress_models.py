"""The long version of the model-based tests (``make stress``): every state machine of
``test_model_*.py`` on every contract backend with five times the examples and twice the steps
(the semaphore's on the backends of its own model; the delivery and relay models have their own,
at DELIVERY_STRESS_SCALE)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from tests.reliability.conftest import STRESS_SCALE, run_model

MACHINES = [
    "breaker",
    "breaker_rate",
    "cache",
    "checkpoints",
    "counters",
    "idempotency",
    "locks",
    "outbox",
    "runs",
]


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("primitive", MACHINES)
def test_stress_model(primitive: str, make_backend: Any) -> None:
    module = importlib.import_module(f"tests.reliability.test_model_{primitive}")
    run_model(module.make_machine(make_backend), make_backend, scale=STRESS_SCALE)


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("lossy", ["dynamodb", "redis", "mongo"], indirect=True)
def test_stress_semaphore_model(lossy: Any) -> None:
    """The semaphore's model (built on the ``lossy`` fixture, not ``make_backend``) scaled the
    same way."""
    from tests.reliability.test_model_semaphore import make_machine

    run_model(make_machine(lossy), lossy, scale=STRESS_SCALE)
