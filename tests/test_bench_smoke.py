"""Smoke tests of the benchmark harness (``bench/``): counting is right, every section renders.

No timing is asserted anywhere: benchmarks measure, tests check behaviour.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import TINY, run_all
from bench._harness import (
    RedisCommandCounter,
    RedisServer,
    RequestCounter,
    interleaved,
    paired_ratio,
    paired_ratio_ci,
    stats,
)
from bench.coldstart import parse_importtime
from bench.overhead import TARGET
from bench.report import SECTION_TITLES, render
from dynacoord.testing import DynamoDBLocal, free_port, unique_name


def test_request_counter_counts_each_request_by_operation(dynamodb_local: DynamoDBLocal) -> None:
    from dynacoord.provision import create_table

    client = dynamodb_local.client()
    table = unique_name("cnt")
    create_table(client, table)
    counter = RequestCounter()
    counter.attach(client)
    key = {"pk": {"S": "a"}, "sk": {"S": "b"}}
    with counter.measure() as ops:
        client.put_item(TableName=table, Item={**key, "v": {"N": "1"}})
        client.get_item(TableName=table, Key=key, ConsistentRead=True)
        client.get_item(TableName=table, Key=key)
        with pytest.raises(client.exceptions.ConditionalCheckFailedException):
            client.put_item(
                TableName=table, Item=key, ConditionExpression="attribute_not_exists(pk)"
            )
    assert dict(ops) == {"PutItem": 2, "GetItem": 2}
    assert counter.total == 4
    # a second client is not counted until attached; detach stops counting
    other = dynamodb_local.client()
    other.get_item(TableName=table, Key=key)
    assert counter.total == 4
    counter.detach()
    client.get_item(TableName=table, Key=key)
    assert counter.total == 4


def test_request_counter_counts_retries_on_the_wire() -> None:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import EndpointConnectionError

    # nothing listens on this port: botocore sends, fails to connect, retries once
    client = boto3.client(
        "dynamodb",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=Config(retries={"total_max_attempts": 2, "mode": "standard"}, connect_timeout=1),
    )
    counter = RequestCounter()
    counter.attach(client)
    with pytest.raises(EndpointConnectionError):
        client.list_tables()
    assert counter.total == 2
    assert counter.by_operation == {"ListTables": 2}


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _require_redis_server() -> None:
    """Skip without ``redis-server``; under ``CI=true`` its absence is a failure instead."""
    if shutil.which("redis-server") is None:
        reason = "redis-server not installed"
        if _in_ci():
            pytest.fail(f"{reason} (CI=true: a missing server is a failure)", pytrace=False)
        pytest.skip(reason)


def test_redis_counter_counts_round_trips() -> None:
    _require_redis_server()
    server = RedisServer().start()
    try:
        counter = RedisCommandCounter()
        client = counter.attach(server_client(server))
        client.ping()  # a new connection's handshake (HELLO, CLIENT SETINFO) is not the ops'
        with counter.measure() as n:
            client.set("a", "1")
            client.get("a")
            pipe = client.pipeline()
            pipe.incr("b")
            pipe.incr("b")
            pipe.execute()
        assert n[0] == 3
        client.close()
    finally:
        server.stop()


def server_client(server: RedisServer) -> Any:
    import redis

    return redis.Redis.from_url(server.url)


def test_interleaved_alternates_and_keeps_indexes() -> None:
    calls: list[tuple[str, int]] = []
    a, b = interleaved(
        lambda i: calls.append(("a", i)), lambda i: calls.append(("b", i)), n=4, warmup=1
    )
    assert len(a) == len(b) == 4
    assert calls == [
        ("a", 0), ("b", 0),  # warm-up
        ("b", 1), ("a", 1),
        ("a", 2), ("b", 2),
        ("b", 3), ("a", 3),
        ("a", 4), ("b", 4),
    ]  # fmt: skip
    s = stats([0.001, 0.002, 0.003, 0.004])
    assert s.n == 4
    assert s.median_ms == pytest.approx(2.5)
    assert s.min_ms == pytest.approx(1.0)


def test_paired_ratio_and_its_interval() -> None:
    b = [0.001 * (1 + i % 7) for i in range(50)]
    a = [2 * x for x in b]
    assert paired_ratio(a, b) == 2.0
    assert paired_ratio_ci(a, b) == (2.0, 2.0)
    noisy = [x * (1.5 if i % 2 else 2.5) for i, x in enumerate(b)]
    lo, hi = paired_ratio_ci(noisy, b)
    assert 1.5 <= lo <= paired_ratio(noisy, b) <= hi <= 2.5


def test_parse_importtime_adds_top_level_entries_of_the_package() -> None:
    stderr = "\n".join(
        [
            "import time: self [us] | cumulative | imported package",
            "import time:       100 |        100 |   json.decoder",
            "import time:       200 |        300 | json",
            "import time:        50 |         50 |     pkg.deep",
            "import time:       400 |        450 |   pkg.child",
            "import time:      1000 |       1450 | pkg",
            "import time:       700 |        700 | pkg.lazy",
            "import time:       900 |        900 | other",
        ]
    )
    ms, heaviest = parse_importtime(stderr, "pkg")
    assert ms == pytest.approx(2.15)
    assert heaviest == ["pkg.child"]


def test_report_marks_every_missing_section() -> None:
    text = render({"meta": {}, "sections": {"outbox": {"status": "error", "error": "boom"}}})
    for title in SECTION_TITLES.values():
        assert f"## {title}" in text
    assert "`boom`" in text
    assert text.count("Not measured in this run") == len(SECTION_TITLES)


def _overhead_row(operation: str, median: float, paired: float) -> dict[str, Any]:
    side = {"n": 300, "median_ms": 2.0, "p95_ms": 3.0, "mean_ms": 2.1, "min_ms": 1.5}
    return {
        "primitive": "p",
        "operation": operation,
        "raw_api": "GetItem",
        "dynacoord": dict(side, median_ms=2.0 * median),
        "raw": side,
        "ratio_median": median,
        "ratio_p95": 1.0,
        "ratio_paired": paired,
        "ratio_paired_ci95": (paired - 0.01, paired + 0.01),
        "extra_ms_median": round(2.0 * median - 2.0, 4),
        "within_target": median <= TARGET,
    }


def test_overhead_report_judges_the_ratio_of_medians_and_checks_coverage() -> None:
    overhead = {
        "status": "ok",
        "target": TARGET,
        "samples": 300,
        "warmup": 40,
        # over the target by the ratio of medians, under it by the paired ratio: over
        "rows": [_overhead_row("slow", 1.107, 1.061), _overhead_row("fast", 1.02, 1.2)],
        "exclusion_rule": "single-request operations only",
        "excluded": {"p skipped": "no raw shape"},
    }
    requests = {
        "status": "ok",
        "rows": [
            {
                "primitive": "p",
                "operation": op,
                "requests": n,
                "varies": False,
                "apis": {"GetItem": n},
                "minimum": n,
                "above_minimum": False,
                "why": "",
            }
            for op, n in (("slow", 1), ("fast", 1), ("skipped", 1), ("missing", 1), ("many", 2))
        ],
    }
    text = render({"meta": {}, "sections": {"requests": requests, "overhead": overhead}})
    assert "Could not" not in text
    assert f"1 of 2 within {TARGET:.2f} (ratio of medians" in text  # the summary
    assert f"**Within the {TARGET:.2f} target (ratio of medians): 1 of 2.**" in text
    assert "**1.107**" in text and "**1.020**" not in text
    over = (1.107 - TARGET) * 100
    assert f"p slow: ratio 1.107, {over:.1f} points over the {TARGET:.2f} target" in text
    assert "p fast" not in text.split("Above it:")[1].split("**Coverage.**")[0]
    assert "Section 1 counts 4 operations at one request; 2 of them are paired" in text
    assert "* p skipped: no raw shape" in text
    assert "* p missing: no pair" in text
    assert "p many" not in text.split("**Coverage.**")[1].split("###")[0]


def test_tiny_run_writes_every_section(dynamodb_local: DynamoDBLocal, tmp_path: Path) -> None:
    # the run it replaces (outside git: the file as it is) is shown beside it
    committed = Path(__file__).parents[1] / "bench" / "results" / "results.json"
    (tmp_path / "results.json").write_text(committed.read_text())
    before = json.loads(committed.read_text())["meta"]["generated_at"]
    results = run_all(TINY, out_dir=tmp_path, ddb=dynamodb_local, command="test")
    report = (tmp_path / "REPORT.md").read_text()
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["previous"]["generated_at"] == before
    assert f"Beside the report this one replaced (run of {before})" in report
    assert "| overhead: rows within the target; median ratio; highest |" in report
    assert set(data["sections"]) == set(SECTION_TITLES)
    for title in SECTION_TITLES.values():
        assert f"## {title}" in report
    assert "## Summary" in report
    assert "| requests per operation |" in report
    assert data["meta"]["versions"]["DynamoDB Local"]
    # the sections that need only locks always measure something
    for key in ("requests", "overhead", "contention", "coldstart"):
        assert results["sections"][key]["status"] == "ok", results["sections"][key]
    rows = {r["operation"]: r for r in results["sections"]["requests"]["rows"]}
    assert rows["acquire (free key)"]["requests"] == 1
    assert rows["acquire (free key)"]["apis"] == {"UpdateItem": 1}
    assert rows["hold() enter + exit (no heartbeat due)"]["requests"] == 2
    requests = results["sections"]["requests"]
    if requests["redis_error"] is None:  # the same operations, counted in Redis round trips
        redis_rows = {r["operation"]: r for r in requests["redis_rows"]}
        assert redis_rows["acquire (free key)"]["requests"] == 1
    if requests["redis_cluster_error"] is None:  # and on a 3-primary Redis Cluster
        cluster_rows = {r["operation"]: r for r in requests["redis_cluster_rows"]}
        assert cluster_rows["acquire (free key)"]["requests"] == 1
        assert "Redis Cluster round trips" in report
    if _in_ci():
        assert requests["redis_error"] is None, requests["redis_error"]
        assert requests["redis_cluster_error"] is None, requests["redis_cluster_error"]
    overhead = results["sections"]["overhead"]
    # every single-request operation of section 1 has an overhead pair of the same name (or an
    # explicit exclusion), and the target is judged on the ratio of medians (issue 8 section 2)
    single = {
        f"{r['primitive']} {r['operation']}" for r in requests["rows"] if r.get("requests") == 1
    }
    paired = {f"{r['primitive']} {r['operation']}" for r in overhead["rows"] if "ratio_median" in r}
    assert single - paired <= set(overhead["excluded"]), single - paired
    for r in overhead["rows"]:
        assert "error" not in r, r
        assert r["within_target"] == (r["ratio_median"] <= overhead["target"])
    contention = results["sections"]["contention"]
    assert contention["mutual_exclusion_violations"] == 0
    assert contention["acquisitions"] == sum(contention["per_thread"]) > 0


def _shape(params: dict[str, Any]) -> dict[str, Any]:
    """A request without its key, table and values: the expressions, names, value placeholders
    (with their types) and return options."""
    shape = {k: v for k, v in params.items() if k not in ("Key", "TableName")}
    values = shape.pop("ExpressionAttributeValues", {})
    shape["values"] = sorted((name, next(iter(value))) for name, value in values.items())
    return shape


def test_the_raw_lock_requests_are_the_ones_dynacoord_sends(dynamodb_local: DynamoDBLocal) -> None:
    # The lock rows' raw sides are written by hand (the other primitives replay the captured
    # request): they must stay the same requests, or the overhead row compares unlike work.
    from bench._harness import bench_env
    from bench.overhead import _lock_pairs

    with bench_env(TINY, dynamodb_local) as env:
        pairs = _lock_pairs(env, 2)
        seen: list[tuple[str, dict[str, Any]]] = []

        def capture(params: dict[str, Any], model: Any, **_: Any) -> None:
            seen.append((model.name, dict(params)))

        env.client.meta.events.register("before-parameter-build.dynamodb", capture)
        for pair in pairs:
            seen.clear()
            pair.dynacoord(0)
            ours = [(name, _shape(params)) for name, params in seen]
            seen.clear()
            pair.raw(0)
            raw = [(name, _shape(params)) for name, params in seen]
            assert ours == raw, pair.operation
