"""Redis Cluster specifics (issue 20). The contract suites run on the cluster as the
``redis_cluster`` kind; these cases check what only a cluster shows: the backend notices the
cluster by itself, every script's keys share a slot while a namespace spreads over the nodes, and
listing still answers when a node redirects."""

from __future__ import annotations

from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.runs import RunStatus

pytestmark = pytest.mark.redis


def _node(client: Any, key: str) -> str:
    return str(client.get_node_from_key(key).name)


def _keys(client: Any, pattern: str) -> list[str]:
    """Every key matching ``pattern`` on every primary (KEYS: fine on a test cluster)."""
    found: list[str] = []
    for node in client.get_primaries():
        found.extend(k.decode() for k in node.redis_connection.keys(pattern))
    return found


def test_the_backend_notices_a_cluster_client_without_an_option(
    redis_cluster_backend_factory, redis_backend_factory
):
    assert redis_cluster_backend_factory().cluster is True
    assert redis_backend_factory().cluster is False
    assert "cluster=True" in repr(redis_cluster_backend_factory())


def test_each_item_shares_its_slot_with_its_indexes_and_a_namespace_spreads(
    redis_cluster_client, redis_cluster_backend_factory
):
    from dynacoord.backends.redis._conn import SHARDS

    client = redis_cluster_client
    backend = redis_cluster_backend_factory(clock=ManualClock(1_700_000_000.0))
    ns = backend.namespace
    cache = backend.cache()
    keys = [f"user:{i}" for i in range(40)]
    cache.set_many({k: i for i, k in enumerate(keys)})
    for i in range(40):
        backend.runs.start(f"run-{i}")
    backend.runs.complete("run-0", result=1)

    cache_items = _keys(client, f"{{CACHE#{ns}#*}}|CACHE#*")
    assert len(cache_items) == 40
    for item in cache_items:
        tag = item[1 : item.index("}")]
        assert client.keyslot(item) == client.keyslot(f"{{{tag}}}|idx")
    run_items = _keys(client, f"{{RUN#{ns}#*}}|RUN#*")
    assert len(run_items) == 40
    for item in run_items:
        tag = item[1 : item.index("}")]
        for status in ("running", "completed"):
            index = f"{{{tag}}}|idx|RUN#{ns}#{status}"
            assert client.keyslot(item) == client.keyslot(index)
    # 8 shard tags per namespace and kind: on 3 primaries they land on more than one node.
    tags = {item[: item.index("}") + 1] for item in cache_items + run_items}
    assert len(tags) == 2 * SHARDS
    assert len({_node(client, tag) for tag in tags}) > 1
    # and listing reads every shard
    assert cache.keys("user:*") == sorted(keys)
    assert len(list(backend.runs.list("running"))) == 39
    assert [r.run_id for r in backend.runs.list("completed")] == ["run-0"]


def test_listing_follows_a_node_that_redirects(
    redis_cluster_client, redis_cluster_backend_factory, monkeypatch
):
    backend = redis_cluster_backend_factory(clock=ManualClock(1_700_000_000.0))
    clock = backend.clock
    for i in range(12):
        backend.runs.start(f"r{i}")
        clock.advance(0.001)
    expected = [f"r{i}" for i in range(12)]
    assert [r.run_id for r in backend.runs.list("running")] == expected

    # As while slots move: every per-node pipeline goes to a node that does not serve the slot,
    # which answers MOVED; those calls are sent again through the cluster client.
    client = redis_cluster_client
    nodes = client.get_primaries()
    real = client.get_node_from_key

    def wrong_node(key: str, replica: bool = False) -> Any:
        right = real(key)
        return next(n for n in nodes if n.name != right.name)

    monkeypatch.setattr(client, "get_node_from_key", wrong_node)
    assert [r.run_id for r in backend.runs.list("running")] == expected
    page = list(backend.runs.list("running", limit=5))
    assert [r.run_id for r in page] == expected[:5]


def test_a_page_of_runs_merges_the_shards_in_index_order(redis_cluster_backend_factory):
    # Runs of one status live in 8 shard indexes; a page (and its cursor) must be the page of
    # one index ordered by update time, whatever shard each run is in.
    clock = ManualClock(1_700_000_000.0)
    backend = redis_cluster_backend_factory(clock=clock)
    ids = [f"job-{i:03d}" for i in range(30)]
    for run_id in ids:
        backend.runs.start(run_id)
        clock.advance(0.002)
    store = backend.runs._store
    seen: list[str] = []
    cursor = None
    while True:
        page = store.query(RunStatus.RUNNING, None, 7, cursor, 0)
        seen.extend(r.run_id for r in page.runs)
        cursor = page.cursor
        if cursor is None:
            break
    assert seen == ids
