"""Counting with the client ``DynamoDBBackend.from_env()`` makes (issue 50; docs/counters.md,
"A churning fleet").

A counting write keeps one slot per call in flight, and a slot stays on the item until its
call can no longer be re-sent by the client: the client's retry window, read from its
configuration (timeouts x attempts + backoff). ``from_env()``'s client kept botocore's 60 s
connect and read timeouts with 9 adaptive attempts: a 1,240 s window, so a fleet's item held
the slots of every environment and one-shot process of the last 20 minutes (the issue's fleet:
4.0 WCU per increment). A DynamoDB request answers in milliseconds: short timeouts keep the 9
attempts and the adaptive backoff (the resilience to throttling) and shorten the window.

Each simulated process (tests/slot_pools.Process) has its own slot pool and memory; the clock
is a ManualClock; units by AWS's rules from the items' sizes (bench/_units.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from bench._units import UnitMeter, item_size
from dynacoord import ManualClock
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import unique_name
from tests.slot_pools import Process

#: the longest window that keeps one-shot processes every 2 s within ~120 slots (2 KB)
MAX_WINDOW_S = 240


def _from_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str], **kwargs: Any) -> Any:
    import boto3

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # a session of its own: boto3's default session keeps the credentials it first read
    return DynamoDBBackend.from_env(session=boto3.session.Session(), **kwargs)


def test_from_env_client_keeps_its_retries_and_has_a_short_window(monkeypatch) -> None:
    backend = _from_env(
        monkeypatch,
        {"AWS_DEFAULT_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"},
    )
    config = backend.client.meta.config
    # the resilience: 9 attempts with adaptive backoff, as before
    assert config.retries["mode"] == "adaptive"
    assert config.retries["total_max_attempts"] == 9
    # before: 60 s + 60 s per attempt, a 1,240 s window
    assert backend.table.count_window_ms <= MAX_WINDOW_S * 1000, backend.table.count_window_ms


@pytest.fixture()
def from_env_backend(
    dynamodb_local: Any, ddb_table: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[DynamoDBBackend, Callable[[], UnitMeter], ManualClock]:
    """A backend made by ``from_env()`` for DynamoDB Local, a ManualClock, and a function that
    starts a meter of its requests (metered only where measured: each metered write reads
    the item around it)."""
    _, table = ddb_table
    env = {**dynamodb_local.env(), "DYNACOORD_TABLE": table}
    env["DYNACOORD_NAMESPACE"] = unique_name("fe")
    clock = ManualClock()
    backend = _from_env(monkeypatch, env, clock=clock)
    return backend, lambda: UnitMeter(backend.client, dynamodb_local.client(), table), clock


@contextmanager
def _metered(start: Callable[[], UnitMeter]) -> Iterator[UnitMeter]:
    meter = start()
    try:
        yield meter
    finally:
        meter.close()


def _item(backend: DynamoDBBackend, key: str) -> dict[str, Any]:
    item = backend.client.get_item(
        TableName=backend.table_name,
        Key={"pk": {"S": f"COUNTER#{backend.namespace}#{key}"}, "sk": {"S": "COUNTER"}},
        ConsistentRead=True,
    ).get("Item")
    return item or {}


def test_the_issues_fleet_with_from_envs_client_costs_at_most_2_wcu(from_env_backend) -> None:
    """The issue's fleet, its environments replaced sooner to reach the state in fewer calls:
    50 environments alive, each replaced 200 s after it started (one every 4 s), 1 call/s spread
    over them. Measured over the calls from 420 s to 480 s: ~106 writers in a 223 s window.
    Before (a 1,240 s window): the slots of every environment of the last 480 s (~170, 2.6 KB:
    3 WCU; the issue's fleet at steady state 4.0 WCU)."""
    backend, meter, clock = from_env_backend
    counters = backend.counters
    alive, lifetime, calls, measured = 50, 200.0, 480, 60
    envs = [(Process(backend.table), -i * lifetime / alive) for i in range(alive)]

    def call(i: int) -> None:
        at = i % alive
        if i - envs[at][1] >= lifetime:
            envs[at] = (Process(backend.table), float(i))
        with envs[at][0].active():
            counters.increment("orders")
        clock.advance(1)

    for i in range(calls - measured):
        call(i)
    with _metered(meter) as m:
        for i in range(calls - measured, calls):
            call(i)
        wcu = m.wcu / measured
    assert counters.get("orders") == calls
    assert wcu <= 2, f"{wcu} WCU per increment, item of {item_size(_item(backend, 'orders'))} B"


def test_one_shot_processes_every_2_s_with_from_envs_client_stay_within_2_kb(
    from_env_backend,
) -> None:
    """A one-shot process (a cron job, a CLI call) every 2 s, 300 of them: each slot stays until
    its call can no longer retry (~112 in a 223 s window). Before: all 300 slots (a 1,240 s
    window), ~4.5 KB, 5 WCU; 10.3 WCU at steady state. Not 2.0: a one-shot process knows no
    stale slot before its write, so the stale ones go by a request of their own (~1 in 9
    calls, at the item's size): 2.2 WCU measured (docs/counters.md)."""
    backend, meter, clock = from_env_backend
    counters = backend.counters
    calls, measured = 300, 60

    def call() -> None:
        with Process(backend.table).active():
            counters.increment("cron")
        clock.advance(2)

    for _ in range(calls - measured):
        call()
    with _metered(meter) as m:
        for _ in range(measured):
            call()
        wcu = m.wcu / measured
    size = item_size(_item(backend, "cron"))
    assert counters.get("cron") == calls
    assert size <= 2048, size  # a slot write bills 2 WCU
    assert wcu <= 2.5, f"{wcu} WCU per increment, item of {size} B"


def test_the_cli_s_dynamodb_client_has_from_env_s_short_window(monkeypatch) -> None:
    """A CLI call is a one-shot writer: its counting slot lives for its client's window, so the
    CLI makes its DynamoDB client as from_env does (it had 1,240 s)."""
    import argparse

    import boto3

    from dynacoord._cli.common import Context
    from dynacoord.backends.dynamodb._retry_window import client_window_ms

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x")):
        monkeypatch.setenv(name, value)
    # the CLI makes its clients from boto3's default session, which keeps the credentials it
    # first read: a session of this test's own, dropped after it (later tests in this process
    # would reach DynamoDB Local as access key "x", where their tables are not)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)
    args = argparse.Namespace(region="us-east-1", endpoint_url=None, aws_endpoint_url=None)
    client = Context(args).client("dynamodb")
    assert client.meta.config.retries["total_max_attempts"] == 9
    assert client_window_ms(client) <= MAX_WINDOW_S * 1000, client_window_ms(client)
