"""Cache reads (issue 29): eventually consistent gets where the semantics allow, consistent
where a read decides something, and the optional in-process tier (``local_ttl``)."""

from __future__ import annotations

import pytest

from dynacoord import ManualClock


class _CountingStore:
    """Wraps a cache store and counts its single-key reads (every backend, no client hooks)."""

    def __init__(self, store):
        self._store = store
        self.reads: list[bool] = []

    def get(self, key, now_ms, *, consistent=True):
        self.reads.append(consistent)
        return self._store.get(key, now_ms, consistent=consistent)

    def __getattr__(self, name):
        return getattr(self._store, name)


def _cache(backend, **options):
    cache = backend.cache(**options)
    cache._store = store = _CountingStore(cache._store)
    return cache, store


def test_gets_are_eventually_consistent_and_the_fill_protocol_is_not(make_backend):
    cache, store = _cache(make_backend())
    cache.set("k", 1)
    assert cache.get("k") == 1 and cache.has("k")
    assert store.reads == [False, False]
    store.reads.clear()
    assert cache.get_or_set("k", lambda: 2) == 1
    assert store.reads == [True]
    strict, store = _cache(make_backend(), consistent_reads=True)
    strict.get("k")
    assert store.reads == [True]


def test_the_request_asks_for_an_eventually_consistent_read(make_backend):
    backend = make_backend()
    client = getattr(backend, "client", None)
    if client is None or not hasattr(client, "meta"):
        pytest.skip("request inspection needs a boto3 client")
    seen = []

    def note(params, model, **_):
        if model.name in ("GetItem", "BatchGetItem"):
            seen.append(
                params.get("ConsistentRead")
                if model.name == "GetItem"
                else next(iter(params["RequestItems"].values())).get("ConsistentRead")
            )

    client.meta.events.register("provide-client-params.dynamodb", note)
    try:
        cache = backend.cache()
        cache.get("a")
        cache.get_many(["a", "b"])
        backend.cache(consistent_reads=True).get("a")
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb", note)
    assert seen == [False, False, True]


def test_the_local_tier_serves_hot_keys_without_a_request(make_backend):
    clock = ManualClock()
    cache, store = _cache(make_backend(clock=clock), local_ttl=5)
    cache.set("hot", {"v": 1})
    for _ in range(10):
        assert cache.get("hot") == {"v": 1}
    assert store.reads == []  # the write kept a local copy
    clock.advance(5.5)
    assert cache.get("hot") == {"v": 1}
    assert len(store.reads) == 1  # the copy went stale: one read, kept again
    assert cache.get("hot") == {"v": 1} and len(store.reads) == 1


def test_another_processs_write_is_seen_within_local_ttl(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    cache, _ = _cache(backend, local_ttl=2)
    other = backend.cache()  # another process
    cache.set("k", "old")
    other.set("k", "new")
    assert cache.get("k") == "old"  # the documented staleness
    clock.advance(2.1)
    assert cache.get("k") == "new"
    other.delete("k")
    assert cache.get("k") == "new"
    clock.advance(2.1)
    assert cache.get("k") is None


def test_own_writes_update_the_local_tier_at_once(make_backend):
    clock = ManualClock()
    cache, _ = _cache(make_backend(clock=clock), local_ttl=60)
    cache.set("k", 1)
    assert cache.get("k") == 1
    cache.set("k", 2)
    assert cache.get("k") == 2
    assert cache.incr("k") == 3
    assert cache.get("k") == 3
    cache.delete("k")
    assert cache.get("k") is None
    assert cache.add("k", 4) is True and cache.get("k") == 4
    cache.set_many({"k": 5, "j": 6})
    assert cache.get_many(["k", "j"]) == {"k": 5, "j": 6} and cache.get("k") == 5
    cache.delete_many(["k"])
    assert cache.get("k") is None
    cache.set("k", 7)
    cache.clear()
    assert cache.get("k") is None


def test_a_local_copy_never_outlives_its_entry(make_backend):
    clock = ManualClock()
    cache, _ = _cache(make_backend(clock=clock), local_ttl=60)
    cache.set("k", 1, ttl=1)
    assert cache.get("k") == 1
    clock.advance(1.01)
    assert cache.get("k") is None and not cache.has("k")


def test_the_local_tier_is_bounded(make_backend):
    clock = ManualClock()
    cache, store = _cache(make_backend(clock=clock), local_ttl=60, local_max=3)
    for i in range(5):
        cache.set(f"k{i}", i)
    assert len(cache._local) == 3
    assert cache.get("k0") == 0 and store.reads == [False]  # dropped first: read again


@pytest.mark.parametrize(("bad", "error"), [(0, ValueError), (-1, ValueError), ("1", TypeError)])
def test_local_ttl_is_checked(make_backend, bad, error):
    with pytest.raises(error):
        make_backend().cache(local_ttl=bad)


@pytest.mark.parametrize("bad", ["no", 1, None])
def test_consistent_reads_is_true_or_false(make_backend, bad):
    # a truthy stand-in would silently mean the opposite of "no"
    with pytest.raises(TypeError, match="consistent_reads"):
        make_backend().cache(consistent_reads=bad)
