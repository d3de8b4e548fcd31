"""DynamoDB global tables: what the first-use check reads from DescribeTable's ``Replicas`` and
``MultiRegionConsistency``, and what each primitive may then write.

DynamoDB Local has no global tables, so the table's real DescribeTable answer (from DynamoDB
Local) gets the replication fields AWS documents for a global table added by an
``after-call`` hook (:func:`replicated`); every other request goes to DynamoDB Local as it is.
Each refusal is proven before any write: the requests sent are recorded, and the table holds
no item of the test's namespace afterwards.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dynacoord import Event
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.backends.dynamodb._global_tables import GlobalTable, global_table_of
from dynacoord.backends.dynamodb._verify import wait_for_ttl_checks
from dynacoord.errors import ConfigurationError, GlobalTableError
from dynacoord.testing import DynamoDBLocal, unique_name
from tests.cli_helpers import cli_tables  # noqa: F401  (the fixture, by name)
from tests.outbox_helpers import drain

#: the fields DescribeTable adds for an eventually consistent (MREC) global table, seen from
#: us-east-1 (the Region of DynamoDB Local's clients here)
MREC = {
    "GlobalTableVersion": "2019.11.21",
    "Replicas": [
        {"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"},
        {"RegionName": "eu-west-1", "ReplicaStatus": "ACTIVE"},
    ],
}
#: the same for a strongly consistent (MRSC) one with two replicas and a witness
MRSC = {
    "GlobalTableVersion": "2019.11.21",
    "MultiRegionConsistency": "STRONG",
    "Replicas": [
        {"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"},
        {"RegionName": "us-east-2", "ReplicaStatus": "ACTIVE"},
    ],
    "GlobalTableWitnesses": [{"RegionName": "us-west-2", "WitnessStatus": "ACTIVE"}],
}

#: the operations that change the table
WRITES = frozenset(
    {
        "PutItem",
        "UpdateItem",
        "DeleteItem",
        "BatchWriteItem",
        "TransactWriteItems",
        "ExecuteStatement",
        "BatchExecuteStatement",
        "ExecuteTransaction",
    }
)


@pytest.fixture(scope="module")
def table(dynamodb_local: DynamoDBLocal) -> str:
    from dynacoord.provision import create_table

    name = unique_name("global")
    create_table(dynamodb_local.client(), name)
    return name


class Sent:
    """The operations a client sent, by name."""

    def __init__(self, client: Any) -> None:
        self.names: list[str] = []
        client.meta.events.register(
            "before-call.dynamodb.*", lambda model, **_: self.names.append(model.name)
        )

    @property
    def writes(self) -> list[str]:
        return [n for n in self.names if n in WRITES]


def replicated(events: Any, fields: dict[str, Any]) -> None:
    """Make the DescribeTable answers of the clients of ``events`` (a client's
    ``meta.events``, or a session's) those of a global table with ``fields``."""

    def add(parsed: dict[str, Any], **_: Any) -> None:
        if "Table" in parsed:
            parsed["Table"].update(fields)

    events.register("after-call.dynamodb.DescribeTable", add)


def stored(dynamodb_local: DynamoDBLocal, table: str, namespace: str) -> list[str]:
    """The pks of the items of ``namespace`` in ``table`` (read through a plain client)."""
    client = dynamodb_local.client()
    pages = client.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return [
        item["pk"]["S"]
        for page in pages
        for item in page["Items"]
        if f"#{namespace}#" in item["pk"]["S"]
    ]


@pytest.fixture()
def fresh(dynamodb_local: DynamoDBLocal, table: str) -> Callable[..., tuple[Any, Sent, str]]:
    """A backend factory on a client of its own (so its first write runs the check)."""

    def make(fields: dict[str, Any] | None, **options: Any) -> tuple[Any, Sent, str]:
        client = dynamodb_local.client()
        if fields is not None:
            replicated(client.meta.events, fields)
        sent = Sent(client)
        namespace = unique_name("ns")
        backend = DynamoDBBackend(client, table_name=table, namespace=namespace, **options)
        return backend, sent, namespace

    return make


#: one write of each primitive that needs exclusivity (the first write it sends)
EXCLUSIVE: dict[str, Callable[[DynamoDBBackend], Any]] = {
    "lock acquire": lambda b: b.locks.acquire("job", ttl=10),
    "idempotency claim": lambda b: b.idempotency.try_claim("order-1"),
    "outbox publish": lambda b: b.outbox.publish(Event("order.created", {"id": 1})),
    "counter increment": lambda b: b.counters.increment("hits"),
    "counter set_if_absent": lambda b: b.counters.set_if_absent("flag", "on"),
    "join arrive": lambda b: b.counters.join("fan-in", "a", expected=2),
    "breaker failure": lambda b: b.breaker("api").record_failure(),
    "run start": lambda b: b.runs.start("run-1"),
    "checkpoint save": lambda b: b.checkpoints.save("task", {"step": 1}),
    "cache add": lambda b: b.cache().add("k", 1),
    "cache incr": lambda b: b.cache().incr("n"),
    "cache get_or_set": lambda b: b.cache().get_or_set("fill", lambda: 1),
    "transaction": lambda b: _transaction(b),
}


def _transaction(backend: DynamoDBBackend) -> None:
    with backend.transaction() as tx:
        tx.publish(Event("order.created", {"id": 2}))


def test_a_normal_table_is_not_gated(fresh: Any) -> None:
    """No replica: one DescribeTable before the first write, and no gate on the table after it
    (its request path has no guard left: no cost per request)."""
    backend, sent, _ = fresh(None)
    backend.locks.acquire("job", ttl=10)
    backend.counters.increment("hits")
    assert sent.names.count("DescribeTable") == 1
    assert backend.table.guards == ()


def test_a_table_whose_only_replica_is_its_own_region_is_not_global() -> None:
    """DescribeTable may list the client's own Region among the replicas."""
    only_here = {"Replicas": [{"RegionName": "us-east-1", "ReplicaStatus": "ACTIVE"}]}
    assert global_table_of(only_here, "us-east-1") is None
    assert global_table_of({}, "us-east-1") is None
    assert global_table_of(MREC, "us-east-1") == GlobalTable("EVENTUAL", ("eu-west-1", "us-east-1"))
    assert global_table_of(MRSC, "us-east-1") == GlobalTable(
        "STRONG", ("us-east-1", "us-east-2"), ("us-west-2",)
    )
    # a consistency mode this code does not know is taken as the one that holds in one Region
    assert global_table_of({**MREC, "MultiRegionConsistency": "NEW"}).consistency == "EVENTUAL"  # type: ignore[union-attr]


@pytest.mark.parametrize("write", sorted(EXCLUSIVE))
def test_an_eventually_consistent_global_table_refuses_each_exclusive_write_before_sending(
    fresh: Any, dynamodb_local: DynamoDBLocal, table: str, write: str
) -> None:
    backend, sent, namespace = fresh(MREC)
    with pytest.raises(GlobalTableError) as info:
        EXCLUSIVE[write](backend)
    assert sent.writes == []
    assert stored(dynamodb_local, table, namespace) == []
    error = info.value
    assert (error.table_name, error.consistency) == (table, "EVENTUAL")
    assert error.regions == ("eu-west-1", "us-east-1")
    assert isinstance(error, ConfigurationError)
    message = str(error)
    assert "global_table_writes='single-region'" in message
    assert "DYNACOORD_GLOBAL_TABLE_WRITES=single-region" in message
    assert "MRSC" in message and "it wrote nothing" in message


def test_the_refusal_names_what_the_write_would_lose(fresh: Any) -> None:
    backend, _, _ = fresh(MREC)
    with pytest.raises(GlobalTableError, match=r"a lock \(two Regions could hold it at once\)"):
        backend.locks.acquire("job", ttl=10)
    with pytest.raises(GlobalTableError, match="an idempotency claim") as info:
        backend.idempotency.try_claim("order-1")
    assert info.value.operation == "PutItem"


def test_the_refusal_holds_for_every_later_write_and_for_other_backends_of_the_client(
    fresh: Any, dynamodb_local: DynamoDBLocal, table: str
) -> None:
    backend, sent, namespace = fresh(MREC)
    for _ in range(2):
        with pytest.raises(GlobalTableError):
            backend.locks.acquire("job", ttl=10)
    # a second backend of the same client: no second DescribeTable, the same refusal
    other = DynamoDBBackend(backend.client, table_name=table, namespace=namespace)
    with pytest.raises(GlobalTableError):
        other.counters.increment("hits")
    assert sent.names.count("DescribeTable") == 1
    assert sent.writes == []
    assert stored(dynamodb_local, table, namespace) == []


def test_last_writer_wins_writes_and_reads_go_on_an_eventually_consistent_global_table(
    fresh: Any, dynamodb_local: DynamoDBLocal, table: str
) -> None:
    """A cache's set, get, delete, set_many and clear are last-writer-wins by nature."""
    backend, _, namespace = fresh(MREC)
    cache = backend.cache()
    cache.set("a", 1)
    cache.set_many({"b": 2, "c": 3})
    assert cache.get("a") == 1
    assert backend.locks.get("job") is None  # a read of an exclusive primitive
    assert sorted(stored(dynamodb_local, table, namespace)) == sorted(
        f"CACHE#{namespace}#{k}" for k in "abc"
    )
    assert cache.delete("a") is True
    cache.clear()
    assert stored(dynamodb_local, table, namespace) == []


@pytest.mark.parametrize("write", sorted(EXCLUSIVE))
def test_single_region_lets_every_exclusive_write_through(
    fresh: Any, dynamodb_local: DynamoDBLocal, table: str, write: str
) -> None:
    backend, sent, namespace = fresh(MREC, global_table_writes="single-region")
    EXCLUSIVE[write](backend)
    assert sent.writes
    assert stored(dynamodb_local, table, namespace)
    assert backend.table.guards == ()  # no gate left: a normal table's cost


def test_the_promise_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, dynamodb_local: DynamoDBLocal, table: str
) -> None:
    monkeypatch.setenv("DYNACOORD_GLOBAL_TABLE_WRITES", "single-region")
    client = dynamodb_local.client()
    replicated(client.meta.events, MREC)
    backend = DynamoDBBackend.from_env(client=client, table_name=table)
    assert backend.global_table_writes == "single-region"
    backend.locks.acquire(unique_name("job"), ttl=10)
    monkeypatch.setenv("DYNACOORD_GLOBAL_TABLE_WRITES", "yes")
    with pytest.raises(ConfigurationError, match="DYNACOORD_GLOBAL_TABLE_WRITES: .*'yes'"):
        DynamoDBBackend.from_env(client=client, table_name=table)


def test_an_unknown_promise_is_refused_at_construction(dynamodb_local: DynamoDBLocal) -> None:
    with pytest.raises(ConfigurationError, match="'single-region'.*got 'single_region'"):
        DynamoDBBackend(dynamodb_local.client(), global_table_writes="single_region")  # type: ignore[arg-type]


#: the writes that work on a strongly consistent global table (every exclusive one but the
#: transaction)
ON_MRSC = sorted(set(EXCLUSIVE) - {"transaction"})


@pytest.mark.parametrize("write", ON_MRSC)
def test_a_strongly_consistent_global_table_takes_every_single_item_write(
    fresh: Any, dynamodb_local: DynamoDBLocal, table: str, write: str
) -> None:
    backend, sent, namespace = fresh(MRSC)
    EXCLUSIVE[write](backend)
    assert stored(dynamodb_local, table, namespace)
    assert "TransactWriteItems" not in sent.names


@pytest.mark.parametrize(
    "write",
    [
        _transaction,
        lambda b: b.outbox.publish([Event("a.b", 1), Event("a.b", 2)]),
        lambda b: b.outbox.publish(Event("a.b", 1, group="g", ordered=True)),
    ],
    ids=["transaction", "several events", "ordered group"],
)
def test_a_strongly_consistent_global_table_refuses_what_needs_a_transaction(
    fresh: Any, write: Callable[..., Any]
) -> None:
    backend, sent, _ = fresh(MRSC)
    with pytest.raises(GlobalTableError, match="MRSC tables run no transaction") as info:
        write(backend)
    assert (info.value.consistency, info.value.operation) == ("STRONG", "TransactWriteItems")
    # (the outbox may first record its shard count, a single-item write MRSC takes)
    assert "TransactWriteItems" not in sent.names
    assert backend.outbox.pending() == []


def test_single_region_does_not_make_an_mrsc_table_run_transactions(fresh: Any) -> None:
    backend, _, _ = fresh(MRSC, global_table_writes="single-region")
    with pytest.raises(GlobalTableError, match="MRSC"):
        _transaction(backend)


def test_the_ttl_warning_on_an_mrsc_table_says_what_follows_instead_of_turning_it_on(
    fresh: Any, caplog: pytest.LogCaptureFixture
) -> None:
    backend, _, _ = fresh(MRSC)

    def disabled(parsed: dict[str, Any], **_: Any) -> None:
        parsed["TimeToLiveDescription"] = {"TimeToLiveStatus": "DISABLED"}

    backend.client.meta.events.register("after-call.dynamodb.DescribeTimeToLive", disabled)
    with caplog.at_level(logging.WARNING, logger="dynacoord.backends.dynamodb._verify"):
        backend.locks.acquire("job", ttl=10)
        wait_for_ttl_checks(10)
    (record,) = [r for r in caplog.records if "TTL" in r.getMessage()]
    assert "TTL is not supported on a strongly consistent global table (MRSC)" in (
        record.getMessage()
    )
    assert "ensure_table" not in record.getMessage()


def test_a_layout_table_is_gated_the_same(
    dynamodb_local: DynamoDBLocal,
) -> None:
    """With a TableLayout the gate reads dynacoord's own request, before the layout's names."""
    from dynacoord import TableLayout
    from dynacoord.provision import create_table

    layout = TableLayout(pk="PK", sk="SK", index="GSI1", index_pk="GSI1PK", index_sk="GSI1SK")
    name = unique_name("global-layout")
    create_table(dynamodb_local.client(), name, layout=layout)
    client = dynamodb_local.client()
    replicated(client.meta.events, MREC)
    sent = Sent(client)
    backend = DynamoDBBackend(client, table_name=name, layout=layout)
    with pytest.raises(GlobalTableError, match="a lock"):
        backend.locks.acquire("job", ttl=10)
    assert sent.writes == []


@pytest.fixture(autouse=True)
def _no_leftover_ttl_checks() -> Iterator[None]:
    yield
    wait_for_ttl_checks(10)


@pytest.mark.parametrize("batch_claim", [True, False], ids=["batch claims", "one per request"])
@pytest.mark.parametrize(
    ("fields", "options"),
    [(MRSC, {}), (MREC, {"global_table_writes": "single-region"})],
    ids=["MRSC", "MREC single-region"],
)
def test_a_worker_delivers_each_event_once(
    fresh: Any, fields: dict[str, Any], options: dict[str, Any], batch_claim: bool
) -> None:
    """Publish one event per call, deliver with a worker: no transaction on the way."""
    backend, sent, _ = fresh(fields, **options)
    for n in range(3):
        backend.outbox.publish(Event("order.created", {"n": n}))
    delivered: list[int] = []
    worker = backend.outbox.worker(
        lambda event: delivered.append(event.payload["n"]), batch_claim=batch_claim
    )
    drain(worker)
    assert sorted(delivered) == [0, 1, 2]
    assert backend.outbox.pending() == []
    assert "TransactWriteItems" not in sent.names


@pytest.mark.parametrize(
    ("fields", "mode"),
    [(None, None), (MREC, "EVENTUAL"), (MRSC, "STRONG")],
    ids=["single-Region", "MREC", "MRSC"],
)
def test_table_verify_reports_a_global_tables_mode(
    cli_tables: Any,
    capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any] | None,
    mode: str | None,
) -> None:
    """``dynacoord table verify`` (on moto) says what kind of table it is and what works."""
    import json

    import boto3

    from tests.cli_helpers import run_cli

    if fields is not None:
        # the CLI builds its client from boto3's default session, which hands it its hooks
        boto3.setup_default_session()
        assert boto3.DEFAULT_SESSION is not None
        replicated(boto3.DEFAULT_SESSION.events, fields)
    try:
        code, out, err = run_cli(capsys, "--json", "table", "verify")
    finally:
        boto3.DEFAULT_SESSION = None
    assert code == 0
    answer = json.loads(out)
    if mode is None:
        assert "global_table" not in answer
        assert "global table" not in err
        return
    assert answer["global_table"]["consistency"] == mode
    assert "us-east-1" in answer["global_table"]["regions"]
    expected = "single-region" if mode == "EVENTUAL" else "transaction is refused"
    assert expected in err and "docs/global-tables.md" in err
