"""Backend-specific checks for Redis and MongoDB (the shared semantics are in tests/contract/)."""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap
import time

import pytest

from dynacoord import ConfigurationError, InvalidValueError, ManualClock
from tests.backends_fixtures import EXTRA_CONTRACT_BACKENDS

#: ["mongodb"] when MONGODB_URI points at a real server, else []
REAL_MONGO = [k for k in EXTRA_CONTRACT_BACKENDS if k == "mongodb"]

# -- optional imports -----------------------------------------------------------------------------


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("module", "dependency", "extra"),
    [
        ("dynacoord.backends.redis", "redis", "redis"),
        ("dynacoord.backends.mongo", "pymongo", "mongo"),
    ],
)
def test_missing_extra_names_the_pip_command(module, dependency, extra):
    result = _run(
        f"""
        import sys
        sys.modules[{dependency!r}] = None  # as if the package were not installed
        try:
            import {module}
        except ImportError as exc:
            print("MESSAGE:", exc)
            print("CAUSE:", type(exc.__cause__).__name__)
        else:
            print("imported anyway")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "MESSAGE: " in result.stdout
    assert f"pip install 'dynacoord[{extra}]'" in result.stdout
    assert "CAUSE: ModuleNotFoundError" in result.stdout or "CAUSE: ImportError" in result.stdout


def test_import_dynacoord_does_not_import_redis_or_pymongo():
    result = _run(
        """
        import sys
        import dynacoord
        import dynacoord.locks, dynacoord.keys, dynacoord.codec
        from dynacoord import Locks, ManualClock
        loaded = sorted(m for m in ("redis", "pymongo", "mongomock", "bson") if m in sys.modules)
        print("LOADED:", loaded)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "LOADED: []" in result.stdout


# -- Redis ----------------------------------------------------------------------------------------


def test_redis_lock_is_a_hash_under_the_design_key(redis_client, redis_backend_factory):
    clock = ManualClock(1_700_000_000.123)
    backend = redis_backend_factory(clock=clock, namespace="keys-redis")
    lease = backend.locks.acquire("job/1", ttl=5, owner="me")
    assert lease is not None
    name = "{LOCK#keys-redis#job/1}"  # the pk in a hash tag (docs/redis.md)
    assert redis_client.type(name) == b"hash"
    fields = redis_client.hgetall(name)
    assert fields[b"owner"] == b"me"
    assert int(fields[b"expires_at_ms"]) == 1_700_000_000_123 + 5000
    # The first fence is exactly now_ms * 1000 + 1: no Lua float rounding of 16-digit numbers.
    assert lease.fence == 1_700_000_000_123 * 1000 + 1 == int(fields[b"fence"])
    assert lease.release()
    redis_client.delete(name)


def test_redis_gc_expiry_is_relative_so_a_fake_clock_never_deletes_live_items(
    redis_client, redis_backend_factory
):
    # A clock years in the past must not make Redis delete the item (absolute PEXPIREAT would).
    clock = ManualClock(1_000_000_000.0)
    backend = redis_backend_factory(clock=clock, lock_fence_grace=100)
    lease = backend.locks.acquire("gc", ttl=5, owner="a")
    pttl = redis_client.pttl(f"{{LOCK#{backend.namespace}#gc}}")
    assert 100_000 < pttl <= 105_000  # ttl + fence grace, in real milliseconds
    lease.release()
    pttl = redis_client.pttl(f"{{LOCK#{backend.namespace}#gc}}")
    assert 90_000 < pttl <= 100_000  # a released lock lingers for the grace only


def test_redis_expired_item_is_absent_even_while_redis_still_holds_it(
    redis_client, redis_backend_factory
):
    clock = ManualClock()
    backend = redis_backend_factory(clock=clock)
    old = backend.locks.acquire("stale", ttl=1, owner="a")
    clock.advance(2)
    assert redis_client.exists(f"{{LOCK#{backend.namespace}#stale}}") == 1
    assert backend.locks.get("stale") is None
    new = backend.locks.acquire("stale", ttl=1, owner="b")
    assert new is not None and new.fence == old.fence + 1
    # The item is swept (as PEXPIRE would): the next fence still grows, from the clock.
    redis_client.delete(f"{{LOCK#{backend.namespace}#stale}}")
    clock.advance(2)
    again = backend.locks.acquire("stale", ttl=1, owner="c")
    assert again is not None and again.fence > new.fence


def test_redis_works_with_decode_responses(redis_server):
    from dynacoord.backends.redis import RedisBackend

    client = redis_server.client(decode_responses=True)
    try:
        backend = RedisBackend(client, namespace="decoded")
        lease = backend.locks.acquire("k", ttl=5, owner="ö-owner")
        assert lease is not None
        info = backend.locks.get("k")
        assert info is not None and info.owner == "ö-owner" and info.fence == lease.fence
        assert lease.release()
    finally:
        client.delete("LOCK#decoded#k")
        client.close()


def test_redis_backend_rejects_bad_configuration(redis_client):
    from dynacoord.backends.redis import RedisBackend

    with pytest.raises(ConfigurationError):
        RedisBackend(None)
    with pytest.raises(ConfigurationError):
        RedisBackend(redis_client, lock_fence_grace=-1)
    with pytest.raises(ValueError):
        RedisBackend(redis_client, namespace="a#b")


def test_redis_server_errors_become_backend_errors(redis_server):
    from dynacoord import BackendError
    from dynacoord.backends.redis import RedisBackend

    dead = redis_server.client(socket_connect_timeout=0.2)
    dead.connection_pool.connection_kwargs["port"] = 1  # nothing listens there
    backend = RedisBackend(dead)
    with pytest.raises(BackendError) as err:
        backend.locks.acquire("k", ttl=1)
    assert err.value.__cause__ is not None
    dead.close()


def test_redis_cache_layout_and_listing_never_uses_keys(redis_client, redis_backend_factory):
    backend = redis_backend_factory(namespace="cache-layout")
    cache = backend.cache()
    cache.set("0", "zero")  # shard 1: the cache key "0" must not collide with an index
    cache.set("user:1", 5, ttl=60)  # shard 2 (crc32 % 8)
    item = "{CACHE#cache-layout#2}|CACHE#cache-layout#user:1"  # under its shard's hash tag
    assert redis_client.hgetall(item).keys() == {b"n", b"expires_at_ms"}
    assert redis_client.type("{CACHE#cache-layout#2}|idx") == b"zset"
    assert redis_client.zrange("{CACHE#cache-layout#2}|idx", 0, -1) == [b"user:1"]
    assert redis_client.zrange("{CACHE#cache-layout#1}|idx", 0, -1) == [b"0"]
    cache.set_many({f"k{i}": i for i in range(30)})
    redis_client.config_resetstat()
    assert len(cache.keys()) == 32
    assert cache.keys("user:*") == ["user:1"]
    assert cache.clear() == 32
    stats = redis_client.info("commandstats")
    assert "cmdstat_keys" not in stats  # never KEYS: it blocks the server on big keyspaces
    assert "cmdstat_zrangebylex" in stats  # the sorted-set index is what lists
    assert redis_client.exists(*[f"{{CACHE#cache-layout#{s}}}|idx" for s in range(8)]) == 0


def test_redis_cache_index_drops_entries_redis_expired(redis_client, redis_backend_factory):
    backend = redis_backend_factory()
    cache = backend.cache()
    cache.set("a", 1)
    cache.set("b", 2)
    ns = backend.namespace
    redis_client.delete(f"{{CACHE#{ns}#1}}|CACHE#{ns}#b")  # as PEXPIRE would ("b": shard 1)
    assert cache.keys() == ["a"]
    assert redis_client.zrange(f"{{CACHE#{ns}#1}}|idx", 0, -1) == []
    assert redis_client.zrange(f"{{CACHE#{ns}#3}}|idx", 0, -1) == [b"a"]


def test_redis_incr_beyond_64_bits_is_a_clear_error(redis_backend_factory):
    cache = redis_backend_factory().cache()
    cache.set("big", 2**63 - 1)
    with pytest.raises(InvalidValueError, match="64-bit"):
        cache.incr("big")
    assert cache.get("big") == 2**63 - 1
    cache.set("huge", 2**70)  # stored as text: round-trips, but is not a counter
    assert cache.get("huge") == 2**70
    with pytest.raises(InvalidValueError):
        cache.incr("huge")


def test_redis_incr_creates_and_restarts_counters_in_one_round_trip(redis_server):
    from dynacoord.backends.redis import RedisBackend
    from dynacoord.testing import unique_name

    sent: list[bytes] = []
    client = redis_server.client()
    base = client.connection_pool.connection_class

    class Counting(base):  # type: ignore[misc, valid-type]
        def send_packed_command(self, command, check_health=True):
            sent.append(command if isinstance(command, bytes) else b"".join(command))
            super().send_packed_command(command, check_health)

    client.connection_pool.connection_class = Counting
    clock = ManualClock()
    cache = RedisBackend(client, namespace=unique_name("incr"), clock=clock).cache()
    cache.get("warm-up")  # the connection's own handshake is not the operation under test
    cache.incr("warm-up")  # loads the script
    for label, step in [
        ("new", lambda: cache.incr("c", 5, ttl=1)),
        ("live", lambda: cache.incr("c")),
        ("expired", lambda: (clock.advance(1), cache.incr("c", 2, ttl=1))[1]),
    ]:
        sent.clear()
        value = step()
        assert len(sent) == 1, f"{label}: {len(sent)} round trips"
        assert value == {"new": 5, "live": 6, "expired": 2}[label]
    assert cache.keys() == ["c", "warm-up"]
    clock.advance(1)
    assert cache.get("c") is None  # the restarted counter got the new ttl


# -- MongoDB --------------------------------------------------------------------------------------


@pytest.fixture(params=["mongo", *REAL_MONGO])
def any_mongo(request):
    """(factory, database) on mongomock, and on a real server when MONGODB_URI is set."""
    if request.param == "mongo":
        return request.getfixturevalue("mongo_backend_factory"), request.getfixturevalue(
            "mongo_database"
        )
    return request.getfixturevalue("mongodb_backend_factory"), request.getfixturevalue(
        "mongodb_database"
    )


def test_mongo_ensure_indexes_is_idempotent(any_mongo):
    make, database = any_mongo
    backend = make(collection="idx_test")
    assert sorted(backend.ensure_indexes()) == ["gsi1", "pk_sk", "ttl"]
    assert sorted(backend.ensure_indexes()) == ["gsi1", "pk_sk", "ttl"]
    info = database["idx_test"].index_information()
    assert info["pk_sk"]["key"] == [("pk", 1), ("sk", 1)]
    assert info["pk_sk"]["unique"] is True
    assert info["gsi1"]["key"] == [("gsi1pk", 1), ("gsi1sk", 1)]
    assert info["ttl"]["key"] == [("expires_at", 1)]
    assert info["ttl"]["expireAfterSeconds"] == 0


def test_mongo_lock_document_uses_the_design_keys(any_mongo):
    make, database = any_mongo
    clock = ManualClock(1_700_000_000.123)
    backend = make(clock=clock)
    lease = backend.locks.acquire("job/1", ttl=5, owner="$not-a-field-path")
    assert lease is not None
    doc = database["dynacoord"].find_one({"pk": f"LOCK#{backend.namespace}#job/1"})
    assert doc["sk"] == "LOCK"
    assert doc["owner"] == "$not-a-field-path"  # written as a literal, not read as $field
    assert doc["fence"] == lease.fence == 1_700_000_000_123 * 1000 + 1
    assert doc["expires_at_ms"] == 1_700_000_000_123 + 5000
    # The TTL-monitor date is real time + remaining lifetime + grace, never the fake clock's.
    expires_at = doc["expires_at"].replace(tzinfo=datetime.timezone.utc)
    assert expires_at.timestamp() > time.time() + 3600


def test_mongo_expired_item_is_absent_whatever_the_ttl_monitor_did(any_mongo):
    make, database = any_mongo
    clock = ManualClock()
    backend = make(clock=clock)
    old = backend.locks.acquire("stale", ttl=1, owner="a")
    clock.advance(2)
    assert database["dynacoord"].count_documents({"pk": f"LOCK#{backend.namespace}#stale"}) == 1
    assert backend.locks.get("stale") is None
    new = backend.locks.acquire("stale", ttl=1, owner="b")
    assert new is not None and new.fence == old.fence + 1
    database["dynacoord"].delete_one({"pk": f"LOCK#{backend.namespace}#stale"})  # swept
    clock.advance(2)
    again = backend.locks.acquire("stale", ttl=1, owner="c")
    assert again is not None and again.fence > new.fence


class _CountingCollection:
    """Counts the requests a store makes through its pymongo collection."""

    def __init__(self, collection):
        self._collection = collection
        self.calls: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self._collection, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return counted


def test_mongo_incr_of_a_new_key_is_one_upsert(any_mongo):
    from dynacoord.cache import Cache

    make, database = any_mongo
    clock = ManualClock()
    backend = make(clock=clock)
    store = backend._cache_store(backend.namespace)
    counting = store._coll.collection = _CountingCollection(store._coll.collection)
    cache = Cache(store, clock=clock, namespace=backend.namespace, default_ttl=10)
    assert cache.incr("new", 4) == 4
    assert cache.incr("new") == 5
    assert counting.calls == ["find_one_and_update", "find_one_and_update"]
    doc = database["dynacoord"].find_one({"pk": f"CACHE#{backend.namespace}#new"})
    assert (doc["sk"], doc["gsi1sk"], doc["n"]) == ("CACHE", "new", 5)
    assert doc["expires_at_ms"] == int(clock.time() * 1000) + 10_000
    cache.set("text", "abc", ttl=100)
    with pytest.raises(InvalidValueError):
        cache.incr("text")
    clock.advance(10)
    assert cache.get("new") is None
    assert cache.incr("new", 2) == 2  # expired: replaced by a fresh counter
    assert cache.keys() == ["new", "text"]


def test_mongo_cache_document_and_listing(any_mongo):
    make, database = any_mongo
    backend = make()
    cache = backend.cache()
    cache.set("user:1", 5, ttl=60)
    cache.set("user:2", "two")
    cache.set("other", 1)
    doc = database["dynacoord"].find_one({"pk": f"CACHE#{backend.namespace}#user:1"})
    assert doc["sk"] == "CACHE"
    assert doc["gsi1pk"] == f"CACHE#{backend.namespace}#0" and doc["gsi1sk"] == "user:1"
    assert doc["n"] == 5 and "v" not in doc and "expires_at" in doc
    assert cache.keys("user:*") == ["user:1", "user:2"]
    assert cache.keys("us.r*") == []  # the prefix is matched literally, not as a regex
    assert cache.clear() == 3


def test_mongo_backend_rejects_bad_configuration(mongo_database):
    from dynacoord.backends.mongo import MongoBackend

    with pytest.raises(ConfigurationError):
        MongoBackend(None)
    with pytest.raises(ConfigurationError):
        MongoBackend(mongo_database, collection="")
    with pytest.raises(ConfigurationError):
        MongoBackend(mongo_database, gc_grace=-5)


# -- transactions and the remaining layouts -------------------------------------------------------


@pytest.fixture(params=["redis", "mongo", *REAL_MONGO])
def any_backend_factory(request):
    return request.getfixturevalue(f"{request.param}_backend_factory")


def test_transaction_is_refused_clearly_never_a_silent_fallback(any_backend_factory):
    from dynacoord import NotSupportedError
    from dynacoord.outbox import Event

    backend = any_backend_factory()
    with pytest.raises(NotSupportedError, match="DynamoDB-only"):
        with backend.transaction():
            pytest.fail("the block must not run")  # pragma: no cover
    # The outbox itself works: a multi-event publish is all or nothing.
    outbox = backend.outbox
    outbox.publish(Event("t", 1, id="e-1"))
    from dynacoord.errors import DuplicateEventError

    with pytest.raises(DuplicateEventError):
        outbox.publish([Event("t", 2, id="e-2"), Event("t", "other", id="e-1")])
    assert outbox.get("e-2") is None
    assert outbox.get("e-1").event.payload == 1


def test_redis_outbox_and_runs_use_lex_sorted_status_indexes(redis_client, redis_backend_factory):
    from dynacoord.outbox import Event

    clock = ManualClock(1_700_000_000.0)
    backend = redis_backend_factory(clock=clock, namespace="idx-layout")
    backend.outbox.publish(Event("t", 1, id="ev", occurred_at=1_700_000_000.0))
    # One hash tag for a namespace's whole outbox (a multi-event publish is one script).
    pending = "{OUTBOX#idx-layout#0}|idx|OUTBOX#idx-layout#pending#0"
    assert redis_client.zrange(pending, 0, -1) == [b"001700000000000#ev"]
    assert redis_client.hget("{OUTBOX#idx-layout#0}|OUTBOX#idx-layout#ev", "status") == b"pending"
    backend.runs.start("run-1")  # shard 3: the run and its status indexes share that tag
    running = "{RUN#idx-layout#3}|idx|RUN#idx-layout#running"
    assert redis_client.zrange(running, 0, -1) == [b"001700000000000#run-1"]
    clock.advance(1)
    backend.runs.complete("run-1", result={"ok": True})
    assert redis_client.exists(running) == 0
    completed = "{RUN#idx-layout#3}|idx|RUN#idx-layout#completed"
    assert redis_client.zrange(completed, 0, -1) == [b"001700000001000#run-1"]


def test_mongo_run_context_field_names_with_dots_and_dollars_round_trip(any_mongo):
    make, _database = any_mongo
    runs = make().runs
    context = {"a.b": 1, "$where": 2, "50%": 3, "%2E": 4}
    runs.start("r", context=context)
    assert runs.get("r").context == context
    runs.patch("r", set={"x.y": 5}, remove=["a.b"])
    assert runs.get("r").context == {"$where": 2, "50%": 3, "%2E": 4, "x.y": 5}


@pytest.mark.parametrize("claimed_meanwhile", [False, True])
def test_mongo_batch_refused_by_a_racing_publisher_rolls_back_only_unclaimed_events(
    any_mongo, monkeypatch, claimed_meanwhile
):
    """Between the clash check and ``insert_many`` another publisher stores one of the ids: the
    events this call inserted are removed again, except one a worker already claimed (deleting it
    would make an event that is being delivered vanish)."""
    from dynacoord import DuplicateEventError, Event, EventStatus

    make, _database = any_mongo
    outbox = make().outbox
    store = outbox._store
    real_clashes = store._clashes
    calls = []

    def clash_check_that_misses_the_race(events, now_ms):
        calls.append(1)
        if len(calls) == 1:
            outbox.publish(Event("t", "theirs", id="b"))  # the racing publisher wins "b"
            return {}
        return real_clashes(events, now_ms)

    monkeypatch.setattr(store, "_clashes", clash_check_that_misses_the_race)
    real_insert_many = store._coll.collection.insert_many

    def insert_many_then_a_worker_claims(docs, **kwargs):
        try:
            return real_insert_many(docs, **kwargs)
        finally:
            if claimed_meanwhile:
                store._coll.collection.update_one(
                    {"event_id": "a"}, {"$set": {"status": "in_flight", "attempts": 1}}
                )

    monkeypatch.setattr(store._coll.collection, "insert_many", insert_many_then_a_worker_claims)
    with pytest.raises(DuplicateEventError):
        outbox.publish([Event("t", "mine", id="a"), Event("t", "mine", id="b")])
    assert outbox.get("b").event.payload == "theirs"
    if claimed_meanwhile:
        assert outbox.get("a").status is EventStatus.IN_FLIGHT
    else:
        assert outbox.get("a") is None
