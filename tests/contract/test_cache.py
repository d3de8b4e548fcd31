"""Cache contract: every backend must pass these unchanged (public API only)."""

from __future__ import annotations

import decimal
import threading
import time

import pytest

from dynacoord import InvalidKeyError, InvalidValueError, ManualClock, ValueTooLargeError
from tests.conftest import needs_atomic_store

ROUND_TRIP_VALUES = [
    0,
    -7,
    12345678901234567890123456789012345678,  # 38 digits: the numeric limit
    123456789012345678901234567890123456789012345,  # longer: still exact
    1.5,
    0.1,
    -0.0,
    True,
    False,
    None,
    "",
    "héllo ✓",
    b"\x00\xffbytes",
    decimal.Decimal("3.14159265358979323846264338327950288419"),
    [1, "two", [3.0, None]],
    {"a": {"b": [1, 2]}, "$b": "looks like a tag"},
    {"$d": "1"},
]


@pytest.mark.parametrize("value", ROUND_TRIP_VALUES, ids=repr)
def test_values_round_trip_exactly(make_backend, value):
    cache = make_backend().cache()
    cache.set("k", value)
    got = cache.get("k", default="MISSING")
    assert got == value
    assert type(got) is type(value)
    assert cache.get_many(["k"]) == {"k": value}
    assert type(cache.get_many(["k"])["k"]) is type(value)


def test_get_set_delete_has(make_backend):
    cache = make_backend().cache()
    assert cache.get("x") is None
    assert cache.get("x", default=5) == 5
    assert cache.has("x") is False
    cache.set("x", {"n": 1})
    assert cache.get("x") == {"n": 1}
    assert cache.has("x")
    cache.set("x", "replaced")
    assert cache.get("x") == "replaced"
    assert cache.delete("x") is True
    assert cache.delete("x") is False
    assert cache.get("x", default="gone") == "gone"


def test_stored_none_is_a_hit(make_backend):
    cache = make_backend().cache()
    cache.set("none", None)
    assert cache.has("none")
    assert cache.get("none", default="d") is None
    assert cache.get_or_set("none", lambda: pytest.fail("fn must not run on a hit")) is None


def test_ttl_expiry_at_ms_scale(make_backend):
    clock = ManualClock()
    cache = make_backend(clock=clock).cache()
    cache.set("t", "v", ttl=0.25)
    clock.advance(0.249)
    assert cache.get("t") == "v"
    assert cache.has("t")
    assert cache.keys() == ["t"]
    assert cache.get_many(["t"]) == {"t": "v"}
    clock.advance(0.001)  # now == expires_at: expired
    assert cache.get("t", default="gone") == "gone"
    assert not cache.has("t")
    assert cache.keys() == []
    assert cache.get_many(["t"]) == {}
    assert cache.touch("t", 10) is False
    assert cache.delete("t") is False  # an expired entry does not count as removed


def test_default_ttl_and_explicit_ttl(make_backend):
    clock = ManualClock()
    cache = make_backend(clock=clock).cache(default_ttl=1)
    cache.set("d", 1)
    cache.set("long", 2, ttl=5)
    clock.advance(1.0)
    assert cache.get("d") is None
    assert cache.get("long") == 2
    forever = make_backend(clock=clock).cache()
    forever.set("p", 3)
    clock.advance(10 * 365 * 24 * 3600)
    assert forever.get("p") == 3


def test_add_is_set_if_absent_and_expired_counts_as_absent(make_backend):
    clock = ManualClock()
    cache = make_backend(clock=clock).cache()
    assert cache.add("a", 1, ttl=1) is True
    assert cache.add("a", 2, ttl=1) is False
    assert cache.get("a") == 1
    clock.advance(1)
    assert cache.add("a", 3) is True
    assert cache.get("a") == 3


def test_add_races_exactly_one_wins(make_backend):
    needs_atomic_store(make_backend)
    cache = make_backend().cache()
    barrier = threading.Barrier(8)
    results: list[bool] = []

    def contend(i):
        barrier.wait()
        results.append(cache.add("race", i))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1


def test_touch(make_backend):
    clock = ManualClock()
    cache = make_backend(clock=clock).cache()
    assert cache.touch("missing", 5) is False
    cache.set("t", "v", ttl=1)
    clock.advance(0.9)
    assert cache.touch("t", 1) is True
    clock.advance(0.9)
    assert cache.get("t") == "v"  # would have expired without the touch
    assert cache.touch("t", None) is True  # persist
    clock.advance(1000)
    assert cache.get("t") == "v"


def test_incr(make_backend):
    clock = ManualClock()
    cache = make_backend(clock=clock).cache()
    assert cache.incr("c") == 1
    assert cache.incr("c", 5) == 6
    assert cache.incr("c", -10) == -4
    assert cache.get("c") == -4
    assert type(cache.get("c")) is int
    cache.set("s", 10, ttl=1)
    assert cache.incr("s") == 11
    clock.advance(0.5)
    assert cache.incr("s") == 12  # keeps its expiry
    clock.advance(0.5)
    assert cache.get("s") is None
    assert cache.incr("s") == 1  # an expired counter restarts from 0
    assert cache.incr("new", 3, ttl=2) == 3
    clock.advance(2)
    assert cache.get("new") is None
    listed = cache.keys()
    assert "c" in listed and "s" in listed


def test_incr_expiry_rules(make_backend):
    """A new counter gets ``ttl`` (or the cache's default); a live one keeps exactly its own."""
    clock = ManualClock()
    cache = make_backend(clock=clock).cache(default_ttl=5)
    cache.set("forever", 5, ttl=None)  # ttl=None on set uses default_ttl; make it permanent:
    cache.touch("forever", None)
    assert cache.incr("forever", ttl=1) == 6  # no expiry stays no expiry
    cache.set("short", 1, ttl=1)
    assert cache.incr("short", ttl=100) == 2  # its own 1 s expiry stays
    assert cache.incr("fresh") == 1  # the default 5 s
    assert cache.incr("given", 7, ttl=2) == 7
    cache.set("text", "abc", ttl=1)
    clock.advance(1)
    assert cache.get("short") is None
    assert cache.incr("text", 4) == 4  # an expired non-integer entry is replaced
    clock.advance(1)
    assert cache.get("given") is None
    assert cache.get("fresh") == 1
    clock.advance(3)
    assert cache.get("fresh") is None
    assert cache.get("text") == 4  # the replacement got the default 5 s from its creation at 1
    clock.advance(1)
    assert cache.get("text") is None
    clock.advance(1000)
    assert cache.get("forever") == 6


def test_incr_costs_one_request_for_a_new_or_live_counter(make_backend):
    backend = make_backend()
    client = getattr(backend, "client", None)
    if client is None or not hasattr(client, "meta"):
        pytest.skip("request counting needs a boto3 client")
    cache = backend.cache(default_ttl=60)
    requests: list[str] = []

    def count(model, **_):
        requests.append(model.name)

    client.meta.events.register("provide-client-params.dynamodb", count)
    try:
        assert cache.incr("n") == 1
        assert cache.incr("n") == 2
        assert requests == ["UpdateItem", "UpdateItem"]
    finally:
        client.meta.events.unregister("provide-client-params.dynamodb", count)


def test_incr_on_non_integer_raises(make_backend):
    cache = make_backend().cache()
    cache.set("str", "abc")
    cache.set("float", 1.5)
    cache.set("bool", True)
    for key in ("str", "float", "bool"):
        with pytest.raises(InvalidValueError):
            cache.incr(key)
    assert cache.get("str") == "abc" and cache.get("float") == 1.5 and cache.get("bool") is True
    with pytest.raises(TypeError):
        cache.incr("x", 1.5)
    with pytest.raises(TypeError):
        cache.incr("x", True)
    assert not cache.has("x")


@pytest.mark.parametrize("default_ttl", [None, 60])
def test_incr_from_8_threads_sums_exactly(make_backend, default_ttl):
    needs_atomic_store(make_backend)
    cache = make_backend().cache(default_ttl=default_ttl)
    barrier = threading.Barrier(8)
    results: list[int] = []
    lock = threading.Lock()

    def bump():
        barrier.wait()
        for _ in range(10):
            value = cache.incr("hits")
            with lock:
                results.append(value)

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.get("hits") == 80
    assert sorted(results) == list(range(1, 81))  # every increment saw a distinct value


def test_keys_glob_and_prefix(make_backend):
    cache = make_backend().cache()
    cache.set_many({"user:1": 1, "user:2": 2, "user:10": 10, "order:1": "o", "u": 0, "User:3": 3})
    assert cache.keys() == sorted(["user:1", "user:2", "user:10", "order:1", "u", "User:3"])
    assert cache.keys("user:*") == ["user:1", "user:10", "user:2"]
    assert cache.keys("user:?") == ["user:1", "user:2"]
    assert cache.keys("*:1") == ["order:1", "user:1"]
    assert cache.keys("[uU]ser:[13]*") == ["User:3", "user:1", "user:10"]
    assert cache.keys("u") == ["u"]
    assert cache.keys("nothing*") == []


def test_keys_follows_every_page_over_1mb(make_backend):
    # ~6 MB of entries: more than one 1 MB query page in every listing partition.
    cache = make_backend().cache()
    blob = "x" * 100_000
    wanted = {f"big:{i:03d}": blob for i in range(60)}
    cache.set_many(wanted)
    cache.set("small", 1)
    assert cache.keys("big:*") == sorted(wanted)
    assert len(cache.keys()) == 61
    assert cache.clear() == 61
    assert cache.keys() == []


def test_clear_more_than_25_items(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    cache = backend.cache()
    cache.set_many({f"k{i}": i for i in range(60)})
    cache.set("short", 1, ttl=1)
    other = backend.cache(namespace=backend.namespace + "-other")
    other.set("k1", "kept")
    clock.advance(1)  # "short" is expired: removed but not counted
    assert cache.clear() == 60
    assert cache.keys() == []
    assert cache.get("k59") is None
    assert other.get("k1") == "kept"  # another namespace is untouched
    assert cache.clear() == 0


def test_get_many_150_keys_and_set_many(make_backend):
    cache = make_backend().cache()
    mapping = {f"key-{i}": {"i": i} for i in range(150)}
    cache.set_many(mapping)
    wanted = [*mapping, "absent-1", "key-3", "absent-2"]  # duplicates and misses are fine
    got = cache.get_many(wanted)
    assert got == mapping
    assert list(got) == list(mapping)  # in request order
    cache.delete_many([f"key-{i}" for i in range(100)])
    assert cache.get_many(mapping) == {f"key-{i}": {"i": i} for i in range(100, 150)}


def test_set_many_ttl(make_backend):
    clock = ManualClock()
    cache = make_backend(clock=clock).cache()
    cache.set_many({"a": 1, "b": 2}, ttl=0.5)
    clock.advance(0.5)
    assert cache.get_many(["a", "b"]) == {}


def test_get_or_set_computes_once_and_then_hits(make_backend):
    cache = make_backend().cache()
    calls = []

    def compute():
        calls.append(1)
        return {"computed": True}

    assert cache.get_or_set("gos", compute, ttl=30) == {"computed": True}
    assert cache.get_or_set("gos", compute, ttl=30) == {"computed": True}
    assert len(calls) == 1


def test_get_or_set_error_is_not_cached(make_backend):
    cache = make_backend().cache()

    def boom():
        raise RuntimeError("upstream down")

    with pytest.raises(RuntimeError):
        cache.get_or_set("err", boom)
    assert not cache.has("err")
    assert cache.get_or_set("err", lambda: 7) == 7  # the fill lock was released


def test_stampede_8_threads_cold_key_call_fn_once(make_backend):
    needs_atomic_store(make_backend)
    cache = make_backend().cache()
    barrier = threading.Barrier(8)
    calls = []
    results = []

    def expensive():
        calls.append(threading.get_ident())
        time.sleep(0.3)
        return "fresh"

    def worker():
        barrier.wait()
        results.append(cache.get_or_set("cold", expensive, ttl=30, lock_timeout=10))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert results == ["fresh"] * 8


def test_cached_decorator(make_backend):
    cache = make_backend().cache()
    calls = []

    @cache.cached(ttl=30)
    def price(item, qty=1, *, currency="EUR"):
        calls.append((item, qty, currency))
        return {"item": item, "total": qty * 2, "currency": currency}

    first = price("apple", 2)
    assert first == {"item": "apple", "total": 4, "currency": "EUR"}
    assert price("apple", 2) == first
    assert price("apple", qty=2) == first  # same bound arguments, same key
    assert price(item="apple", qty=2, currency="EUR") == first
    assert len(calls) == 1
    price("apple", 3)
    price("apple", 2, currency="USD")
    assert len(calls) == 3
    key = price.cache_key("apple", 2)
    assert key.startswith(f"{price.__module__}.{price.__qualname__}:")
    assert key == price.cache_key(item="apple", qty=2)
    assert cache.get(key) == first
    assert price.invalidate("apple", 2) is True
    price("apple", 2)
    assert len(calls) == 4


def test_cached_key_is_stable_across_versions(make_backend):
    """The key of a @cached call is the digest of its bound arguments' sorted JSON, as it always
    was: entries written by an earlier version are found again."""
    import hashlib
    import json

    from dynacoord import codec

    cache = make_backend().cache()

    @cache.cached()
    def plain(a, b):
        return 1

    @cache.cached()
    def mixed(a, b=2.5, *rest, c=None, **more):
        return 1

    def expected(fn, arguments):
        text = json.dumps(json.loads(codec.encode(arguments)), sort_keys=True, ensure_ascii=False)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        return f"{fn.__module__}.{fn.__qualname__}:{digest}"

    nested = {"z": [1, 0.1, None], "a": {"$d": "x"}, "é": b"\x00", "n": decimal.Decimal("1.10")}
    assert plain.cache_key("héllo ✓", nested) == expected(plain, {"a": "héllo ✓", "b": nested})
    assert plain.cache_key(b=1, a=2) == expected(plain, {"a": 2, "b": 1})
    assert mixed.cache_key(1) == expected(
        mixed, {"a": 1, "b": 2.5, "rest": (), "c": None, "more": {}}
    )
    assert mixed.cache_key(1, 2, 3, c=True, x=-0.0) == expected(
        mixed, {"a": 1, "b": 2, "rest": (3,), "c": True, "more": {"x": -0.0}}
    )


def test_cached_custom_key_and_unencodable_args(make_backend):
    cache = make_backend().cache()

    @cache.cached(key=lambda user: f"profile:{user.name}")
    def profile(user):
        return {"name": user.name}

    class User:
        name = "ada"

    assert profile(User()) == {"name": "ada"}
    assert cache.get("profile:ada") == {"name": "ada"}

    @cache.cached()
    def plain(obj):
        return 1

    with pytest.raises(InvalidValueError, match="key="):
        plain(object())


def test_namespaces_isolate(make_backend):
    backend = make_backend()
    one = backend.cache(namespace=backend.namespace + "-one")
    two = backend.cache(namespace=backend.namespace + "-two")
    one.set("shared", 1)
    two.set("shared", 2)
    assert one.get("shared") == 1 and two.get("shared") == 2
    assert one.keys() == ["shared"]


def test_value_too_large_raises_before_writing(make_backend):
    cache = make_backend().cache()
    with pytest.raises(ValueTooLargeError) as err:
        cache.set("huge", "x" * 500_000)
    assert err.value.size > err.value.limit
    assert not cache.has("huge")
    with pytest.raises(ValueTooLargeError):
        cache.set_many({"fine": 1, "huge": b"x" * 400_000})
    assert cache.get_many(["fine", "huge"]) == {}  # nothing of the batch was written
    with pytest.raises(ValueTooLargeError):
        cache.add("huge", "x" * 500_000)
    assert not cache.has("huge")


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.set("bad", object()), InvalidValueError),
        (lambda c: c.set("bad", {1: "int key"}), InvalidValueError),
        (lambda c: c.set("bad", float("nan")), InvalidValueError),
        (lambda c: c.set("bad", {"s": {1, 2}}), InvalidValueError),
        (lambda c: c.set("bad", 1, ttl=0), InvalidValueError),
        (lambda c: c.set("bad", 1, ttl=-1), InvalidValueError),
        (lambda c: c.set("bad", 1, ttl=float("inf")), InvalidValueError),
        (lambda c: c.set("bad", 1, ttl="5"), TypeError),
        (lambda c: c.add("bad", 1, ttl=0), InvalidValueError),
        (lambda c: c.add("bad", object()), InvalidValueError),
        (lambda c: c.set_many({"bad": 1, "other": object()}), InvalidValueError),
        (lambda c: c.set_many({"bad": 1, "": 2}), InvalidKeyError),
        (lambda c: c.set_many({"bad": 1}, ttl=0), InvalidValueError),
        (lambda c: c.set_many([("bad", 1)]), TypeError),
        (lambda c: c.touch("bad", 0), InvalidValueError),
        (lambda c: c.get_or_set("bad", lambda: 1, ttl=-1), InvalidValueError),
        (lambda c: c.get_or_set("bad", lambda: 1, lock_timeout=0), InvalidValueError),
        (lambda c: c.get_or_set("bad", lambda: object()), InvalidValueError),
        (lambda c: c.get_or_set("bad", 5), TypeError),
        (lambda c: c.cached(ttl=0), InvalidValueError),
        (lambda c: c.cached()("not a function"), TypeError),
        (lambda c: c.set("", 1), InvalidKeyError),
        (lambda c: c.get(""), InvalidKeyError),
        (lambda c: c.set(5, 1), InvalidKeyError),
        (lambda c: c.set("x" * 3000, 1), InvalidKeyError),
        (lambda c: c.incr(""), InvalidKeyError),
        (lambda c: c.get_many(["ok", ""]), InvalidKeyError),
        (lambda c: c.get_many(5), TypeError),
        (lambda c: c.get_many("bad"), TypeError),
        (lambda c: c.delete_many(5), TypeError),
        (lambda c: c.delete_many(None), TypeError),
    ],
)
def test_bad_input_raises_clearly_and_writes_nothing(make_backend, call, error):
    cache = make_backend().cache()
    with pytest.raises(error) as err:
        call(cache)
    assert str(err.value)  # a message, not a bare exception
    assert cache.keys() == []
    assert not cache.has("bad")


def test_a_str_where_several_keys_are_expected_is_refused_not_split(make_backend):
    # get_many("abc") / delete_many("abc") would otherwise read or delete "a", "b" and "c".
    cache = make_backend().cache()
    cache.set_many({"a": 1, "b": 2, "c": 3, "abc": 4})
    with pytest.raises(TypeError, match="keys must be an iterable of cache keys, not a str"):
        cache.delete_many("abc")
    with pytest.raises(TypeError, match="not a str"):
        cache.get_many("abc")
    with pytest.raises(TypeError, match="not a bytes"):
        cache.delete_many(b"abc")
    assert cache.get_many(["a", "b", "c", "abc"]) == {"a": 1, "b": 2, "c": 3, "abc": 4}
    assert cache.get_many(k for k in ("a", "b")) == {"a": 1, "b": 2}  # any iterable is fine
    cache.delete_many({"a", "b"})
    assert cache.get_many(["a", "b", "c", "abc"]) == {"c": 3, "abc": 4}


class _SpyLocks:
    """Wraps a Locks: records every acquire."""

    def __init__(self, locks):
        self._locks = locks
        self.acquired = []

    def __getattr__(self, name):
        return getattr(self._locks, name)

    def acquire(self, key, ttl, **kwargs):
        self.acquired.append(key)
        return self._locks.acquire(key, ttl, **kwargs)


def test_get_or_set_refuses_a_non_callable_fn_before_taking_the_fill_lock(make_backend):
    from dynacoord.cache import Cache

    backend = make_backend()
    locks = _SpyLocks(backend.locks)
    cache = Cache(backend._cache_store(backend.namespace), locks=locks, namespace=backend.namespace)
    for fn in (5, None, "value", {"a": 1}):
        with pytest.raises(TypeError, match="fn must be callable"):
            cache.get_or_set("k", fn)
    assert locks.acquired == []
    assert not cache.has("k")
    assert cache.get_or_set("k", lambda: 1) == 1
    assert locks.acquired == ["cache-fill:k"]


@pytest.mark.parametrize(
    ("value", "error"), [(object(), InvalidValueError), ("x" * 500_000, ValueTooLargeError)]
)
def test_get_or_set_unstorable_value_caches_nothing_and_frees_the_fill_lock(
    make_backend, value, error
):
    backend = make_backend()
    cache = backend.cache()
    with pytest.raises(error):
        cache.get_or_set("k", lambda: value)
    assert not cache.has("k")
    # Released (documented: its item stays, expired and without owner, like after every fill).
    assert backend.locks.get("cache-fill:k") is None
    assert cache.get_or_set("k", lambda: 7) == 7


def test_bad_default_ttl(make_backend):
    backend = make_backend()
    with pytest.raises(InvalidValueError):
        backend.cache(default_ttl=0)
    with pytest.raises(InvalidKeyError):
        backend.cache(namespace="has#hash")


class _HalfProcessed:
    """Wraps a backend's cache store: the first batch request of each kind processes only half
    of its items and reports the rest unprocessed, as DynamoDB does under throttling."""

    def __init__(self, store):
        self._store = store
        self.calls = {"get": [], "set": [], "delete": []}

    def __getattr__(self, name):
        return getattr(self._store, name)

    def get_batch(self, keys, now_ms, **options):
        self.calls["get"].append(len(keys))
        if len(self.calls["get"]) == 1:
            found, left = self._store.get_batch(keys[: len(keys) // 2], now_ms, **options)
            return found, left + keys[len(keys) // 2 :]
        return self._store.get_batch(keys, now_ms, **options)

    def set_batch(self, entries):
        self.calls["set"].append(len(entries))
        if len(self.calls["set"]) == 1:
            return self._store.set_batch(entries[:10]) + entries[10:]
        return self._store.set_batch(entries)

    def delete_batch(self, keys):
        self.calls["delete"].append(len(keys))
        if len(self.calls["delete"]) == 1:
            return self._store.delete_batch(keys[:10]) + keys[10:]
        return self._store.delete_batch(keys)


def test_unprocessed_batch_items_are_resent(make_backend):
    from dynacoord.cache import Cache

    clock = ManualClock()
    backend = make_backend(clock=clock)
    store = _HalfProcessed(backend._cache_store(backend.namespace))
    cache = Cache(store, clock=clock, namespace=backend.namespace)
    write, read = store.max_batch_write, store.max_batch_get
    n = write + 5  # two write batches; the first leaves all but 10 of its entries unprocessed
    mapping = {f"u{i}": i for i in range(n)}
    cache.set_many(mapping)
    assert store.calls["set"] == [write, write - 10, 5]  # the leftovers were resent
    assert cache.get_many(mapping) == mapping
    first_get = min(n, read)
    assert store.calls["get"][:2] == [first_get, first_get - first_get // 2]
    cache.delete_many(list(mapping))
    assert store.calls["delete"] == [write, write - 10, 5]
    assert backend.cache().get_many(mapping) == {}


def test_get_or_set_waiter_takes_over_when_the_filler_dies(make_backend):
    clock = ManualClock()  # the waiter's backoff sleeps advance it: no real waiting
    backend = make_backend(clock=clock)
    cache = backend.cache()
    # Another process took the fill lock (documented name) and died: it expires after 0.5 s.
    assert backend.locks.acquire("cache-fill:k", ttl=0.5, owner="dead-filler") is not None
    start = clock.monotonic()
    calls = []
    assert cache.get_or_set("k", lambda: calls.append(1) or "v", lock_timeout=5) == "v"
    assert calls == [1]
    assert 0.5 <= clock.monotonic() - start < 5  # took over when the lock expired, not later
    assert cache.get("k") == "v"
    assert backend.locks.get("cache-fill:k") is None  # released after filling


def test_get_or_set_waiter_computes_itself_after_lock_timeout(make_backend):
    clock = ManualClock()
    backend = make_backend(clock=clock)
    cache = backend.cache()
    # A live filler that is stuck: it holds the lock far longer than the waiter's lock_timeout.
    assert backend.locks.acquire("cache-fill:k", ttl=100, owner="stuck-filler") is not None
    start = clock.monotonic()
    assert cache.get_or_set("k", lambda: "mine", lock_timeout=2) == "mine"
    assert clock.monotonic() - start == pytest.approx(2, abs=0.01)
    assert cache.get("k") == "mine"
    assert backend.locks.get("cache-fill:k").owner == "stuck-filler"  # never stolen


def test_incr_by_zero_reads_the_counter_back(make_backend):
    """An ADD of 0 changes nothing, yet the counter's value must still come back (a store may
    leave an unchanged attribute out of what it reports as updated)."""
    clock = ManualClock()
    cache = make_backend(clock=clock).cache()
    assert cache.incr("z", 0) == 0  # absent: created at 0
    assert cache.incr("z", 4) == 4
    assert cache.incr("z", 0) == 4
    assert cache.incr("z", 0, ttl=5) == 4  # live counter without expiry: the plain ADD path
    assert cache.incr("t", 3, ttl=1) == 3
    assert cache.incr("t", 0, ttl=1) == 3  # live counter with its own expiry
    clock.advance(1)
    assert cache.incr("t", 0, ttl=1) == 0  # expired: restarts from 0
    assert cache.get("z") == 4 and cache.get("t") == 0
