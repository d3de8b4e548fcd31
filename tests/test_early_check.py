"""When the first-use check is sent (dynacoord/backends/dynamodb/_verify.py). ``verify="early"``:
when the backend is made, on a thread of its own, and the first write waits for its answer
instead of sending its own; it never raises: what it could not find, the first write checks again
and raises there. ``verify="first-write"``: with the first write (no thread). The default: with
the first write, or early in a Lambda environment initialised ahead of its requests."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._verify import TableConfigurationError, wait_for_ttl_checks
from dynacoord.errors import BackendError, ConfigurationError
from dynacoord.provision import create_table, table_definition
from dynacoord.testing import DUMMY_CREDENTIALS
from tests.dynamodb_calls import operation_names, other_client


@pytest.fixture()
def client() -> Iterator[Any]:
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", **DUMMY_CREDENTIALS)


def _checks(table: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"dynacoord-check-{table}"]


def _early_check_done(backend: DynamoDBBackend) -> None:
    assert backend.table.early_check_done.wait(10)


def test_the_check_is_sent_when_the_backend_is_made_and_the_first_write_sends_none(
    client: Any,
) -> None:
    create_table(other_client(), "early")
    calls = operation_names(client)
    backend = DynamoDBBackend(client, table_name="early", verify="early")
    _early_check_done(backend)
    assert calls == ["DescribeTable"]
    backend.cache().set("a", 1)
    backend.cache().set("b", 2)
    # the first write started no thread: the early check's own reads the TTL, a while later
    assert [t for t in threading.enumerate() if t.name.startswith("dynacoord-ttl-check")] == []
    assert calls == ["DescribeTable", "PutItem", "PutItem"]
    wait_for_ttl_checks()  # now, instead of a second from the check
    assert calls.count("DescribeTimeToLive") == 1
    calls.remove("DescribeTimeToLive")
    assert calls == ["DescribeTable", "PutItem", "PutItem"]
    assert backend.table.guards == ()  # later requests go straight to the table


def test_the_first_write_waits_for_a_check_in_flight(client: Any) -> None:
    create_table(other_client(), "inflight")
    order: list[str] = []
    sent, release = threading.Event(), threading.Event()

    def describe(**_: Any) -> None:
        order.append("DescribeTable sent")
        sent.set()
        release.wait(10)

    client.meta.events.register("before-call.dynamodb.DescribeTable", describe)
    client.meta.events.register(
        "after-call.dynamodb.DescribeTable", lambda **_: order.append("DescribeTable answered")
    )
    client.meta.events.register(
        "before-call.dynamodb.PutItem", lambda **_: order.append("PutItem sent")
    )
    backend = DynamoDBBackend(client, table_name="inflight", verify="early")
    assert sent.wait(10)
    cache = backend.cache()  # made here: its modules' first import is not the writer's to wait
    writer = threading.Thread(target=lambda: cache.set("k", 1))
    writer.start()
    time.sleep(0.2)
    assert order == ["DescribeTable sent"]  # the write waits for the check's answer
    release.set()
    writer.join(10)
    assert order == ["DescribeTable sent", "DescribeTable answered", "PutItem sent"]
    assert backend.cache().get("k") == 1


def test_a_table_made_after_the_backend_is_checked_again_by_the_first_write(
    client: Any,
) -> None:
    calls = operation_names(client)
    backend = DynamoDBBackend(client, table_name="later", verify="early")  # no such table yet: found nothing
    _early_check_done(backend)
    create_table(other_client(), "later")
    backend.cache().set("a", 1)
    wait_for_ttl_checks()
    calls.remove("DescribeTimeToLive")  # on a thread of its own, after the first write
    assert calls == ["DescribeTable", "DescribeTable", "PutItem"]
    assert backend.cache().get("a") == 1


def test_a_wrong_table_found_early_is_refused_at_the_first_write_with_nothing_written(
    client: Any,
) -> None:
    client.create_table(
        TableName="pkonly",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    backend = DynamoDBBackend(client, table_name="pkonly", verify="early")  # the constructor raises nothing
    _early_check_done(backend)
    with pytest.raises(TableConfigurationError, match="pkonly"):
        backend.cache().set("a", 1)
    assert client.scan(TableName="pkonly")["Count"] == 0


def test_an_early_check_refused_raises_nothing_and_the_first_write_names_it(
    client: Any,
) -> None:
    from botocore.exceptions import ClientError

    create_table(other_client(), "denied")
    refused: list[str] = []

    def refuse(**_: Any) -> None:
        refused.append(threading.current_thread().name)
        raise ClientError(
            {"Error": {"Code": "AccessDeniedException", "Message": "not authorized"}},
            "DescribeTable",
        )

    client.meta.events.register("before-call.dynamodb.DescribeTable", refuse)
    backend = DynamoDBBackend(client, table_name="denied", verify="early")
    _early_check_done(backend)
    with pytest.raises(BackendError, match="cannot describe DynamoDB table 'denied'"):
        backend.cache().set("a", 1)
    assert refused == ["dynacoord-check-denied", threading.current_thread().name]


def test_first_write_mode_sends_nothing_until_the_first_write(client: Any) -> None:
    create_table(other_client(), "lazy")
    calls = operation_names(client)
    backend = DynamoDBBackend(client, table_name="lazy", verify="first-write")
    assert _checks("lazy") == []
    time.sleep(0.1)
    assert calls == []
    backend.cache().set("a", 1)
    wait_for_ttl_checks()
    calls.remove("DescribeTimeToLive")
    assert calls == ["DescribeTable", "PutItem"]


def test_a_checked_table_starts_no_early_check(client: Any) -> None:
    create_table(client, "known")  # made through this client: known right
    calls = operation_names(client)
    DynamoDBBackend(client, table_name="known").cache().set("a", 1)
    assert _checks("known") == []
    assert calls == ["PutItem"]


@pytest.mark.parametrize("value", ["yes", "Early", "first_write", 1, None])
def test_verify_is_true_early_first_write_or_false(client: Any, value: Any) -> None:
    with pytest.raises(ConfigurationError, match="'early'.*'first-write'"):
        DynamoDBBackend(client, table_name="any-table", verify=value)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_during_an_early_check_is_not_stuck_behind_it(client: Any) -> None:
    """A process that makes its backend and then forks (a pre-forking server) may fork while
    the early check holds its lock: the child, where no thread will ever let that copy go, gets
    a lock of its own."""
    create_table(other_client(), "forked")
    sent, release = threading.Event(), threading.Event()

    def describe(**_: Any) -> None:
        sent.set()
        release.wait(10)

    client.meta.events.register("before-call.dynamodb.DescribeTable", describe)
    backend = DynamoDBBackend(client, table_name="forked", verify="early")
    assert sent.wait(10)  # the early check holds the lock now
    pid = os.fork()
    if pid == 0:  # the child: only this thread; the lock's copy was held when it forked
        got = backend.table.state.check_lock.acquire(timeout=5)
        os._exit(0 if got else 1)
    release.set()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_check_still_guards_every_write_when_verify_is_first_write(client: Any) -> None:
    definition = table_definition("noindex")
    del definition["GlobalSecondaryIndexes"]
    definition["AttributeDefinitions"] = [
        a for a in definition["AttributeDefinitions"] if a["AttributeName"] in ("pk", "sk")
    ]
    client.create_table(**definition)
    backend = DynamoDBBackend(client, table_name="noindex", verify="first-write")
    with pytest.raises(TableConfigurationError, match="gsi1"):
        backend.cache().set("a", 1)
    assert client.scan(TableName="noindex")["Count"] == 0


def test_the_ttl_is_read_a_while_after_the_first_write_not_during_it(client: Any) -> None:
    """The TTL check's botocore work would share the interpreter with the operations right
    after the first write (a cold start's first invocation); it waits a second for them."""
    create_table(other_client(), "ttl-later")
    calls = operation_names(client)
    backend = DynamoDBBackend(client, table_name="ttl-later", verify="first-write")
    backend.cache().set("a", 1)
    time.sleep(0.3)
    assert calls == ["DescribeTable", "PutItem"]
    wait_for_ttl_checks()  # sends it now (a process that exits sooner does so at exit)
    assert calls == ["DescribeTable", "PutItem", "DescribeTimeToLive"]


@pytest.mark.parametrize(
    ("verify", "thread", "calls_made"),
    [
        # the check the first write made: a thread that write starts reads the TTL
        ("first-write", "dynacoord-ttl-check-", ["DescribeTable", "PutItem", "DescribeTimeToLive"]),
        # the early check: its own thread reads it, first write or not
        ("early", "dynacoord-check-", ["DescribeTable", "DescribeTimeToLive"]),
    ],
)
def test_the_ttl_is_read_once_its_delay_is_over(
    client: Any, monkeypatch: pytest.MonkeyPatch, verify: Any, thread: str, calls_made: list[str]
) -> None:
    from dynacoord.backends.dynamodb import _verify

    monkeypatch.setattr(_verify, "TTL_CHECK_DELAY_S", 0.05)
    create_table(other_client(), "ttl-delay")
    calls = operation_names(client)
    backend = DynamoDBBackend(client, table_name="ttl-delay", verify=verify)
    if verify == "first-write":
        backend.cache().set("a", 1)
    [check] = [t for t in threading.enumerate() if t.name == thread + "ttl-delay"]
    check.join(10)  # no one asked for it: the delay ran out
    assert not check.is_alive()
    assert calls == calls_made


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_with_a_ttl_check_pending_exits_without_waiting_for_it(
    client: Any,
) -> None:
    """A pre-forking server makes its backend, then forks: the parent's thread reads the TTL;
    the child, which has no such thread, must not wait for it at exit."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        """
        import os, sys, time
        import boto3
        from moto import mock_aws
        from dynacoord.backends.dynamodb import DynamoDBBackend
        from dynacoord.provision import create_table
        from dynacoord.testing import DUMMY_CREDENTIALS

        with mock_aws():
            client = boto3.client("dynamodb", **DUMMY_CREDENTIALS)
            create_table(boto3.client("dynamodb", **DUMMY_CREDENTIALS), "forked-ttl")
            backend = DynamoDBBackend(client, table_name="forked-ttl", verify="early")
            assert backend.table.early_check_done.wait(10)  # its TTL check now waits a second
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # atexit runs here, in the child
            started = time.monotonic()
            os.waitpid(pid, 0)
            print(round(time.monotonic() - started, 2))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert float(done.stdout.strip().splitlines()[-1]) < 5, done.stdout


def test_waiting_for_ttl_checks_is_bounded_in_all(client: Any) -> None:
    """At exit the wait is bounded once, not once per check: an unreachable endpoint holds up
    no exit for long, however many tables a process used."""
    from dynacoord._table_schema import DEFAULT_LAYOUT
    from dynacoord.backends.dynamodb import _verify

    stuck = [_verify._ttl_check(client, f"stuck-{i}", DEFAULT_LAYOUT) for i in (1, 2, 3)]
    try:
        started = time.monotonic()
        wait_for_ttl_checks(0.3)  # nothing runs them: each would wait its whole timeout
        assert time.monotonic() - started < 0.6
    finally:
        for check in stuck:
            check.done.set()


@pytest.mark.parametrize(
    ("initialization", "early"),
    [(None, False), ("on-demand", False), ("snap-start", False), ("provisioned-concurrency", True)],
)
def test_by_default_the_check_is_sent_early_only_where_init_runs_ahead_of_requests(
    client: Any, monkeypatch: pytest.MonkeyPatch, initialization: str | None, early: bool
) -> None:
    if initialization is None:
        monkeypatch.delenv("AWS_LAMBDA_INITIALIZATION_TYPE", raising=False)
    else:
        monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", initialization)
    table = f"default-{initialization or 'script'}"
    create_table(other_client(), table)
    calls = operation_names(client)
    backend = DynamoDBBackend(client, table_name=table)
    _early_check_done(backend)  # set at once when no check is sent early
    assert calls == (["DescribeTable"] if early else [])
    backend.cache().set("a", 1)
    assert [c for c in calls if c != "DescribeTimeToLive"] == ["DescribeTable", "PutItem"]
