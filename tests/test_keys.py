"""The key schema: every item kind's keys as the design states them, their limits (on the fast
path and off it), and the shards of the listing partitions."""

from __future__ import annotations

import pytest

from dynacoord import (
    InvalidKeyError,
    keys,
)

# -- keys ------------------------------------------------------------------------------------------


def test_key_strings_match_the_design():
    assert keys.lock_key("ns", "k").as_dict() == {"pk": "LOCK#ns#k", "sk": "LOCK"}
    assert keys.breaker_key("ns", "db").as_dict() == {"pk": "CB#ns#db", "sk": "CB"}
    assert keys.idempotency_key("ns", "k").primary == {"pk": "IDEMP#ns#k", "sk": "IDEMP"}
    assert keys.counter_key("ns", "k").primary == {"pk": "COUNTER#ns#k", "sk": "COUNTER"}
    cp = keys.checkpoint_key("ns", "task", 12)
    assert cp.pk == "CHECKPOINT#ns#task" and cp.sk == "SEQ#" + "0" * 18 + "12"
    cache = keys.cache_key("ns", "user:1", shards=4)
    assert cache.pk == "CACHE#ns#user:1" and cache.sk == "CACHE"
    assert cache.gsi1pk == f"CACHE#ns#{keys.shard_of('user:1', 4)}" and cache.gsi1sk == "user:1"
    ev = keys.outbox_key("ns", "e1", status="pending", due_ms=1234, shards=1)
    assert ev.as_dict() == {
        "pk": "OUTBOX#ns#e1",
        "sk": "EVENT",
        "gsi1pk": "OUTBOX#ns#pending#0",
        "gsi1sk": "000000000001234#e1",
    }
    run = keys.run_key("ns", "r1", status="running", updated_ms=5)
    assert run.gsi1pk == "RUN#ns#running" and run.gsi1sk == "000000000000005#r1"


def test_keys_containing_hash_never_collide_and_parse_back():
    a = keys.lock_key("a", "b#c")
    parsed = keys.parse_pk(a.pk)
    assert (parsed.kind, parsed.namespace, parsed.key) == (keys.Kind.LOCK, "a", "b#c")
    with pytest.raises(InvalidKeyError):
        keys.lock_key("a#b", "c")


def test_checkpoint_sort_keys_sort_numerically():
    sks = [keys.checkpoint_key("n", "t", i).sk for i in (9, 10, 100, 2)]
    assert sorted(sks) == [keys.checkpoint_key("n", "t", i).sk for i in (2, 9, 10, 100)]
    assert keys.parse_sk_sequence(sks[1]) == 10


@pytest.mark.parametrize(
    ("namespace", "key"),
    [
        ("", "k"),
        ("a#b", "k"),
        ("a|b", "k"),
        ("n" * 129, "k"),
        ("ns", ""),
        ("ns", "x" * 2100),
        ("ns", "\ud800"),
        (None, "k"),
        ("ns", 3),
    ],
)
def test_invalid_keys_and_namespaces(namespace, key):
    with pytest.raises(InvalidKeyError):
        keys.lock_key(namespace, key)


def test_pk_limit_counts_utf8_bytes():
    ok = "é" * ((keys.MAX_PARTITION_KEY_BYTES - len("LOCK#ns#")) // 2)
    keys.lock_key("ns", ok)
    with pytest.raises(InvalidKeyError, match="2048 bytes"):
        keys.lock_key("ns", ok + "é")


def test_cache_key_sort_key_limit():
    with pytest.raises(InvalidKeyError, match="sort key"):
        keys.cache_key("ns", "k" * 1500)


def test_shards_are_stable_and_in_range():
    assert {keys.shard_of(f"k{i}", 4) for i in range(100)} == {0, 1, 2, 3}
    assert keys.shard_of("same", 8) == keys.shard_of("same", 8)
    assert keys.shard_of("x", 1) == 0


def test_key_length_limits_hold_on_the_fast_path_and_off_it():
    from dynacoord import keys

    for key_char in ("x", "é"):  # one byte, two bytes of UTF-8
        room = keys.MAX_PARTITION_KEY_BYTES - len(b"LOCK#ns#")
        fits = key_char * (room // len(key_char.encode()))
        assert keys.lock_pk("ns", fits) == f"LOCK#ns#{fits}"
        with pytest.raises(InvalidKeyError, match="too long"):
            keys.lock_pk("ns", fits + "x")
    for namespace in (["ns"], None, "a#b", ""):
        with pytest.raises(InvalidKeyError):
            keys.lock_pk(namespace, "k")  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError, match="surrogate"):
        keys.lock_pk("ns", "\ud800")
