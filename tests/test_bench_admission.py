"""bench/admission.py (``make bench`` section 11): the semaphore's, rate limiter's, leader's
and fencing's requests and units per call, measured by AWS's rules on DynamoDB Local, beside the
peers. The figures are the ones their pages state; a call that starts sending more (a read
before every admission, a guard that costs a request of its own) fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench import SECTIONS, TINY, admission
from bench._harness import BenchEnv, RequestCounter
from bench.report import SECTION_TITLES, render
from dynacoord.testing import DynamoDBLocal, unique_name


@pytest.fixture(scope="module")
def section(dynamodb_local: DynamoDBLocal) -> dict[str, Any]:
    from dynacoord.provision import create_table

    counter = RequestCounter()
    client = counter.attach(dynamodb_local.client())
    table = unique_name("adm")
    create_table(client, table)
    # no redis-server here: the Redis peers are reported as not measured
    env = BenchEnv(scale=TINY, ddb=dynamodb_local, client=client, table=table, counter=counter)
    return admission.run(env)


def _rows(section: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["primitive"], r["operation"]): r for r in section["rows"]}


def test_the_section_is_part_of_make_bench() -> None:
    assert "admission" in SECTIONS and "admission" in SECTION_TITLES


def test_each_call_costs_what_its_page_states(section: dict[str, Any]) -> None:
    rows = _rows(section)
    first = rows["semaphore", "acquire (first, by a new object)"]
    assert (first["apis"], first["wcu"], first["rcu"]) == ({"GetItem": 1, "UpdateItem": 1}, 1, 1)
    for op in (
        "acquire (the object's last write still current)",
        "renew (permit.extend)",
        "release",
    ):
        assert (rows["semaphore", op]["apis"], rows["semaphore", op]["wcu"]) == (
            {"UpdateItem": 1},
            1,
        ), op
    full = rows["semaphore", "acquire refused (full, blocking=False, a new object)"]
    assert (full["apis"], full["wcu"]) == ({"GetItem": 1}, 0)  # a full semaphore is not written

    admitted = rows["ratelimit", "try_acquire admitted (at the full rate, per call)"]
    assert (admitted["requests"], admitted["wcu"], admitted["rcu"]) == (1, 1, 0)
    refused = rows["ratelimit", "try_acquire refused (first time for this object)"]
    assert (refused["apis"], refused["refusals"]) == ({"UpdateItem": 1}, 1)
    assert rows["ratelimit", "try_acquire refused again (seen full)"]["requests"] == 0

    for op in ("campaign (free seat)", "renew", "step_down"):
        assert (rows["leader", op]["apis"], rows["leader", op]["wcu"]) == ({"UpdateItem": 1}, 1)
    rival = rows["leader", "campaign refused (seat held), one attempt"]
    assert (rival["apis"], rival["refusals"], rival["rcu"]) == ({"UpdateItem": 1}, 1, 0)

    fenced = rows["fencing", "fenced_update (one item of yours)"]
    assert (fenced["apis"], fenced["wcu"]) == ({"UpdateItem": 1}, 1)
    stale = rows["fencing", "fenced_update refused (a stale fence)"]
    assert stale["refusals"] == 1
    plain = rows["fencing", "transaction of 1 update, no guard"]
    guarded = rows["fencing", "the same + lease.guard(tx)"]
    assert guarded["apis"] == plain["apis"] == {"TransactWriteItems": 1}
    assert guarded["wcu"] == plain["wcu"] + 2  # one ConditionCheck: a transaction item


def test_the_peers_are_measured_or_say_why_not(section: dict[str, Any]) -> None:
    errors = " ".join(section["errors"])
    assert "no redis-server" in errors  # this env has none: named, not silently left out
    by = {r["by"] for r in section["peers"]}
    dynamodb_lock = [b for b in by if b.startswith("python-dynamodb-lock")]
    assert dynamodb_lock or "python-dynamodb-lock: not installed" in errors
    for r in section["peers"]:
        if r["by"].startswith("python-dynamodb-lock") and r["operation"].startswith("acquire"):
            assert r["apis"] == {"GetItem": 1, "PutItem": 1}
    stated = {r["by"] for r in section["stated"]}
    assert "AWS Step Functions semaphore sample (stated)" in stated


def test_the_report_renders_the_section(section: dict[str, Any]) -> None:
    json.dumps(section)  # results.json takes it as it is
    report = render({"meta": {}, "sections": {"admission": section}})
    body = report.split(f"## {SECTION_TITLES['admission']}", 1)[1]
    assert (
        "| semaphore | acquire (first, by a new object) | dynacoord | 2 (GetItem 1, UpdateItem 1) | 1 |"
        in body
    )
    assert "AWS Step Functions semaphore sample (stated)" in body
    assert "Not measured: `Redis peers: no redis-server" in body
