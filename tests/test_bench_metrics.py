"""``make bench`` section 8 (what metrics cost) runs and its report states the no-op cost.

The full section runs only in ``make bench``; here it runs with a handful of samples on the
session's DynamoDB Local table, and its rendering is checked on what it returned."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench import SECTIONS, TINY
from bench import metrics as metrics_section
from bench.report import SECTION_TITLES, render
from dynacoord import DynamoDBBackend

pytestmark = pytest.mark.integration


class _Env:
    """The part of bench's environment the metrics section uses, on the session's table."""

    def __init__(self, client: Any, table: str) -> None:
        self.scale = dataclasses.replace(TINY, samples=6, warmup=2)
        self._client = client
        self._table = table

    def new_client(self, *, counted: bool = True, **_: Any) -> Any:
        return self._client

    def backend(self, *, namespace: str, client: Any, **kwargs: Any) -> DynamoDBBackend:
        return DynamoDBBackend(client, table_name=self._table, namespace=namespace, **kwargs)


def test_the_metrics_section_is_part_of_make_bench() -> None:
    assert "metrics" in SECTIONS and "metrics" in SECTION_TITLES


def test_the_metrics_section_measures_the_no_op_and_each_listener(
    ddb_table: tuple[Any, str],
) -> None:
    section = metrics_section.run(_Env(*ddb_table))  # type: ignore[arg-type]
    assert section["status"] == "ok"
    assert 0 <= section["noop_report_ns"] < 10_000 and 0 <= section["enabled_check_ns"] < 10_000
    assert 0 <= section["noop_share_of_lock_cycle"] < 0.01
    listeners = {(r["operation"], r["listener"]) for r in section["rows"]}
    assert listeners == {
        (operation, listener)
        for operation in ("lock acquire+release", "cache get")
        for listener in ("Metrics() listener", "EMFMetrics", "Metrics(), consumed_capacity")
    } | {("outbox publish + delivery", "tracing on vs off (in a span)")}
    assert all(r["ratio"] > 0 and r["ci_low"] <= r["ci_high"] for r in section["rows"])

    report = render({"meta": {}, "sections": {"metrics": section}})
    assert f"## {SECTION_TITLES['metrics']}" in report
    assert f"One no-op report costs {section['noop_report_ns']} ns" in report
    assert "nothing measurable" in report and "EMFMetrics" in report
