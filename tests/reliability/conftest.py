"""Shared helpers of the reliability suite (model-based tests, stress, faults, hostile input, skew).

Hypothesis settings: every test here builds its settings with :func:`hsettings`, which is
derandomized under ``CI=true`` (the same examples every run, no example database) and random
otherwise, always without deadlines (DynamoDB Local answers in milliseconds but boto3's CPU cost
varies on busy machines).
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

CI = os.environ.get("CI", "").lower() == "true"


def hsettings(**kwargs: Any) -> settings:
    """Hypothesis settings for this suite: no deadline, derandomized in CI."""
    kwargs.setdefault("deadline", None)
    kwargs.setdefault("derandomize", CI)
    kwargs.setdefault(
        "suppress_health_check",
        [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    )
    if kwargs["derandomize"]:
        kwargs.setdefault("database", None)
    return settings(**kwargs)


def scan_all(
    client: Any, table: str, ignore_prefix: str | None = None, *, namespace: str | None = None
) -> list[dict[str, Any]]:
    """Every item of ``table`` (all pages), sorted, for before/after comparisons; items whose
    ``pk`` starts with ``ignore_prefix`` are left out, and with ``namespace`` only that
    namespace's items are kept (the session table holds other tests' items, which DynamoDB
    Local's TTL sweeper may delete in the middle of a slow test)."""
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"TableName": table, "ConsistentRead": True}
    while True:
        page = client.scan(**kwargs)
        items.extend(page.get("Items", []))
        last = page.get("LastEvaluatedKey")
        if not last:
            break
        kwargs["ExclusiveStartKey"] = last
    if ignore_prefix is not None:
        items = [item for item in items if not item["pk"]["S"].startswith(ignore_prefix)]
    if namespace is not None:
        items = [item for item in items if item["pk"]["S"].split("#")[1:2] == [namespace]]
    # An outbox namespace's shard record is configuration, written once before its first
    # publish (so workers poll every shard a publisher uses), not data a failed write leaves.
    items = [item for item in items if item["sk"]["S"] != "SHARDS"]
    return sorted(items, key=lambda item: (item["pk"]["S"], item["sk"]["S"]))


#: (max_examples, stateful_step_count) of the model-based tests per backend kind: many on the
#: in-process backends, fewer on the real servers.
MODEL_BUDGET: dict[str, tuple[int, int]] = {
    "moto": (12, 20),
    "dynamodb": (8, 15),
    "redis": (15, 20),
    "mongo": (15, 20),
}


#: ``make stress`` multiplies the example budget by this (tests/reliability/test_stress_models.py)
STRESS_SCALE = 5

#: the delivery and relay fault models run this many times their examples in ``make stress``
DELIVERY_STRESS_SCALE = 20


def run_model(machine: Any, make_backend: Any, *, scale: int = 1) -> None:
    """Run a ``RuleBasedStateMachine`` class with the budget of ``make_backend``'s kind (times
    ``scale`` examples, twice the steps when scaled)."""
    from hypothesis.stateful import run_state_machine_as_test

    examples, steps = MODEL_BUDGET.get(getattr(make_backend, "kind", ""), (8, 15))
    if scale > 1:
        examples, steps = examples * scale, steps * 2
    run_state_machine_as_test(
        machine, settings=hsettings(max_examples=examples, stateful_step_count=steps)
    )


def pytest_collection_modifyitems(items: list[Any]) -> None:
    """Model-based tests get a longer timeout: a green run takes seconds, but when one finds a
    failure hypothesis shrinks it for minutes, and the shrunk example is the useful report (the
    default 300 s timeout would cut it off and leave only a 'flaky' error)."""
    import pytest

    for item in items:
        if item.path.name.startswith("test_model_"):
            item.add_marker(pytest.mark.timeout(1200))
