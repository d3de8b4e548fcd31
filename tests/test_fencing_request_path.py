"""A fenced write of the application's item (``lease.fenced_update`` on DynamoDB) goes through the
session's one request path like every other request (docs/architecture.md, "One request path on
DynamoDB"): timed by the metrics listener, and gated on a global table as other conditional
writes are. Before issue 51's fix it went straight to ``table.client``: no metric, no gate.
"""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import FenceRejectedError
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.errors import GlobalTableError
from dynacoord.locks import Lease
from dynacoord.testing import DynamoDBLocal, unique_name
from tests.backends_fixtures import moto_layout_backend_factory  # noqa: F401  (the fixture)
from tests.test_global_tables import MREC, Sent, replicated
from tests.test_metrics import Recorder


def _order(backend: Any) -> dict[str, str]:
    """An item of the application's in the backend's own table (its own key names)."""
    return {"pk": f"APP#{backend.namespace}#order", "sk": "ORDER"}


def test_a_fenced_write_is_timed_by_the_metrics_listener(ddb_table: tuple[Any, str]) -> None:
    client, table = ddb_table
    recorder = Recorder()
    backend = DynamoDBBackend(
        client, table_name=table, namespace=unique_name("ns"), metrics=recorder
    )
    old = backend.locks.acquire("order", ttl=10)
    old.release()
    new = backend.locks.acquire("order", ttl=10)
    assert new is not None and old is not None and new.fence > old.fence
    recorder.points.clear()
    new.fenced_update(_order(backend), {"status": "paid"})
    with pytest.raises(FenceRejectedError):
        old.fenced_update(_order(backend), {"status": "stale"})
    operations = [p[3]["Operation"] for p in recorder.requests()]
    assert operations == ["UpdateItem", "UpdateItem"]
    assert all(p[3]["Backend"] == "dynamodb" for p in recorder.requests())
    # a refusal is an answer, not a store error (as for every conditional write)
    assert "StoreRequestErrors" not in recorder.names()


def test_an_eventually_consistent_global_table_gates_a_fenced_write(
    dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str]
) -> None:
    _, table = ddb_table
    namespace = unique_name("ns")
    # the lock taken through a client that sees a single-Region table ...
    plain = DynamoDBBackend(dynamodb_local.client(), table_name=table, namespace=namespace)
    taken = plain.locks.acquire("order", ttl=10)
    assert taken is not None
    # ... held by a backend whose client sees an eventually consistent global table
    client = dynamodb_local.client()
    replicated(client.meta.events, MREC)
    sent = Sent(client)
    gated = DynamoDBBackend(client, table_name=table, namespace=namespace)
    lease = Lease(gated.locks, _info(taken), 10_000)
    with pytest.raises(GlobalTableError, match="UpdateItem was refused before it was sent"):
        lease.fenced_update(_order(gated), {"status": "paid"})
    assert sent.names == ["DescribeTable"] and not sent.writes
    assert (
        plain.client.get_item(TableName=table, Key=_marshalled(_order(gated))).get("Item") is None
    )

    # the promise that every writer runs in one Region lets it through, as for other writes
    client = dynamodb_local.client()
    replicated(client.meta.events, MREC)
    single = DynamoDBBackend(
        client, table_name=table, namespace=namespace, global_table_writes="single-region"
    )
    Lease(single.locks, _info(taken), 10_000).fenced_update(_order(single), {"status": "paid"})
    item = plain.client.get_item(TableName=table, Key=_marshalled(_order(single)))["Item"]
    assert item["status"] == {"S": "paid"} and item["fence"] == {"N": str(taken.fence)}


def _info(lease: Lease) -> Any:
    from dynacoord.locks import LockInfo

    return LockInfo(lease.key, lease.owner, lease.fence, lease.expires_at_ms)


def _lock(namespace: str) -> Any:
    from dynacoord.locks import LockInfo

    return LockInfo("order", unique_name("owner"), 1, 2**42)


def _marshalled(key: dict[str, str]) -> dict[str, Any]:
    return {name: {"S": value} for name, value in key.items()}


def test_on_a_table_with_a_layout_the_fenced_write_is_sent_in_the_applications_names(
    moto_layout_backend_factory: Any,
) -> None:
    recorder = Recorder()
    backend = moto_layout_backend_factory(metrics=recorder)
    layout = backend.layout
    key = {layout.pk: f"APP#{backend.namespace}#order", layout.sk: "ORDER"}
    # the fenced write first: on a client new to the table it is the write the first-use check
    # holds, then sends on through the session again
    lease = Lease(backend.locks, _lock(backend.namespace), 10_000)
    # "gsi1pk" is an attribute of the application's here, not dynacoord's index key to rename
    lease.fenced_update(key, {"status": "paid", "gsi1pk": "mine"})
    assert [p[3]["Operation"] for p in recorder.requests()][-1:] == ["UpdateItem"]
    client = moto_layout_backend_factory.layout_client
    item = client.get_item(
        TableName=moto_layout_backend_factory.layout_table,
        Key=_marshalled(key),
        ConsistentRead=True,
    )["Item"]
    # as given: no prefix on the key, no attribute renamed, no marker of the session's
    assert item == {
        **_marshalled(key),
        "status": {"S": "paid"},
        "gsi1pk": {"S": "mine"},
        "fence": {"N": str(lease.fence)},
    }
