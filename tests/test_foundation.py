"""Unit tests of the foundation: key schema, codec, validation, clock, package surface."""

from __future__ import annotations

import decimal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dynacoord
from dynacoord import (
    MANUAL_CLOCK_START,
    InvalidKeyError,
    InvalidValueError,
    ManualClock,
    ValueTooLargeError,
    codec,
    keys,
)
from dynacoord._validate import non_negative_seconds, ttl_to_ms

# -- keys ---------------------------------------------------------------------------------------


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


# -- codec --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        2**100,
        1.5,
        0.1,
        -0.0,
        1e308,
        5e-324,
        decimal.Decimal("1.10"),
        decimal.Decimal("-3E+5"),
        "",
        "ünïcødé 🚀",
        True,
        False,
        None,
        b"",
        b"\x00\xff",
        [1, [2, [3]]],
        {"a": {"b": [None, 1.25, b"x"]}},
        {"$b": "not bytes"},
        {"$$": 1},
        {"$d": {"$b": "x"}},
    ],
)
def test_codec_round_trips_type_and_value(value):
    decoded = codec.decode(codec.encode(value))
    assert decoded == value
    assert type(decoded) is type(value)
    if isinstance(value, float):
        assert repr(decoded) == repr(value)


def _reference_tree(value):
    """The codec's JSON tree by its plain definition: every container copied, every value
    converted (what the encoder must produce whatever shortcuts it takes)."""
    if isinstance(value, dict):
        out = {k: _reference_tree(v) for k, v in value.items()}
        return {"$$": out} if len(out) == 1 and next(iter(out)) in ("$b", "$d", "$$") else out
    if isinstance(value, (list, tuple)):
        return [_reference_tree(v) for v in value]
    if isinstance(value, decimal.Decimal):
        return {"$d": str(value)}
    if isinstance(value, bytes):
        import base64

        return {"$b": base64.b64encode(value).decode("ascii")}
    return value


_json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
    st.binary(max_size=8),
    st.decimals(allow_nan=False, allow_infinity=False),
)
_json_keys = st.one_of(st.sampled_from(["$b", "$d", "$$", "a"]), st.text(max_size=4))
_json_values = st.recursive(
    _json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_json_keys, inner, max_size=4),
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_json_values)
def test_codec_text_is_that_of_the_plain_conversion_and_the_value_is_untouched(value):
    import copy
    import json

    before = copy.deepcopy(value)
    expected = json.dumps(_reference_tree(value), ensure_ascii=False, separators=(",", ":"))
    assert codec.encode(value) == expected
    assert codec.canonical(value) == json.dumps(
        _reference_tree(value), ensure_ascii=False, sort_keys=True
    )
    assert value == before  # the walk changed nothing it was given


@pytest.mark.parametrize(
    ("value", "where"),
    [
        ({"a": [1, {"b": float("nan")}]}, "value['a'][1]['b']"),
        ([0, (1, {"k": object()})], "value[1][1]['k']"),
        ({"ok": 1, "bad": {3: "x"}}, "value['bad']"),
    ],
)
def test_codec_errors_name_the_path_to_the_bad_value(value, where):
    with pytest.raises(InvalidValueError) as info:
        codec.encode(value)
    assert f" at {where}" in str(info.value)


def test_codec_tuple_becomes_list():
    assert codec.decode(codec.encode((1, 2))) == [1, 2]


@pytest.mark.parametrize(
    "value",
    [
        float("nan"),
        float("inf"),
        decimal.Decimal("NaN"),
        {1, 2},
        object(),
        {1: "int key"},
        frozenset(),
        complex(1, 2),
    ],
)
def test_codec_refuses_unstorable_values(value):
    with pytest.raises(InvalidValueError):
        codec.encode(value)


def test_codec_refuses_recursive_structures():
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(InvalidValueError, match="deeper"):
        codec.encode(loop)


def test_item_size_check():
    codec.check_item_size({"pk": "x", "v": "a" * 1000})
    with pytest.raises(ValueTooLargeError) as err:
        codec.check_item_size({"pk": "x", "v": "a" * 410_000})
    assert err.value.size > err.value.limit == codec.DYNAMODB_ITEM_LIMIT


# -- validation and clock --------------------------------------------------------------------------


def test_ttl_validation():
    assert ttl_to_ms(1) == 1000
    assert ttl_to_ms(0.0015) == 2  # rounds up to whole ms
    for bad, error in [
        (0, ValueError),
        (-1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (10**12, ValueError),
        (True, TypeError),
        ("1", TypeError),
        (None, TypeError),
    ]:
        with pytest.raises(error):
            ttl_to_ms(bad)
    assert non_negative_seconds(0, "timeout") == 0
    with pytest.raises(ValueError):
        non_negative_seconds(-0.1, "timeout")


def test_manual_clock():
    clock = ManualClock(100.0)
    clock.sleep(1.5)
    assert clock.time() == 101.5 and clock.monotonic() == 1.5
    clock.set(50)
    assert clock.time() == 50 and clock.monotonic() == 1.5
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_manual_clock_starts_in_the_real_future():
    # DynamoDB's TTL deletes by the real clock, so an entry a past ManualClock still sees as live
    # can vanish; decades of headroom keep test data out of its reach.
    assert ManualClock().time() == MANUAL_CLOCK_START
    assert time.time() + 10 * 365 * 24 * 3600 < MANUAL_CLOCK_START


# -- package surface ---------------------------------------------------------------------------


def test_import_is_cheap_and_optional_backends_not_imported():
    code = (
        "import sys, dynacoord; "
        "bad = [m for m in ('boto3', 'botocore', 'redis', 'pymongo', 'dynacoord.outbox', "
        "'dynacoord.idempotency', 'dynacoord.cache') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_a_lambda_cold_path_imports_nothing_it_does_not_use():
    """``import dynacoord``, the DynamoDB backend and a first lock: typing_extensions (hundreds
    of module-level objects, which tip a full garbage collection inside ``boto3.client()``) and
    the modules of other primitives stay unloaded."""
    code = (
        "import sys, boto3, dynacoord; "
        "c = boto3.client('dynamodb', region_name='us-east-1', aws_access_key_id='x', "
        "aws_secret_access_key='x'); "
        "dynacoord.DynamoDBBackend(c, table_name='tbl').locks; "
        "bad = [m for m in ('typing_extensions', 'dynacoord.outbox', 'dynacoord.idempotency', "
        "'dynacoord.cache', 'dynacoord.codec') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names_resolve_and_py_typed_ships():
    for name in dynacoord.__all__:
        assert getattr(dynacoord, name) is not None, name
    assert (Path(dynacoord.__file__).parent / "py.typed").exists()
    with pytest.raises(AttributeError):
        dynacoord.NoSuchThing  # noqa: B018


def test_errors_share_one_root():
    from dynacoord import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), dynacoord.DynacoordError), name


def test_from_env_reads_table_namespace_and_endpoint(monkeypatch, ddb_table, dynamodb_local):
    """``DynamoDBBackend.from_env()`` against DynamoDB Local, configured only by variables."""
    from dynacoord import DynamoDBBackend
    from dynacoord.testing import DUMMY_CREDENTIALS

    _, table = ddb_table
    monkeypatch.setenv("DYNACOORD_TABLE", table)
    monkeypatch.setenv("DYNACOORD_NAMESPACE", "from-env")
    monkeypatch.setenv("DYNACOORD_ENDPOINT_URL", dynamodb_local.endpoint_url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", DUMMY_CREDENTIALS["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", DUMMY_CREDENTIALS["aws_secret_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", DUMMY_CREDENTIALS["region_name"])
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    backend = DynamoDBBackend.from_env()
    assert (backend.table_name, backend.namespace) == (table, "from-env")
    lease = backend.locks.acquire("env-lock", ttl=5)
    assert lease is not None and lease.release()
    # An explicit argument wins over the environment.
    assert DynamoDBBackend.from_env(namespace="explicit").namespace == "explicit"
    monkeypatch.setenv("DYNACOORD_NAMESPACE", "bad#ns")
    with pytest.raises(InvalidKeyError):
        DynamoDBBackend.from_env()


@pytest.mark.parametrize(
    "text",
    [
        '{"\\u0024b":"AA=="}',  # a tag spelled with an escape is still a tag
        ' {"$d":"1.5"} ',  # whitespace around the value
        '{"a":"\\u00e9$"}',
        '[1,{"$$":{"$b":"x"}}]',
        '"plain"',
        "12",
    ],
)
def test_codec_decode_reads_any_json_text_as_the_full_walk_does(text):
    import json

    from dynacoord.codec import _from_jsonable

    assert codec.decode(text) == _from_jsonable(json.loads(text))
    assert codec.decode(text.encode()) == _from_jsonable(json.loads(text))


def test_codec_decode_refuses_what_json_refuses():
    import json

    for text in ("", "{", '{"a":1} x', "nan?"):
        with pytest.raises(json.JSONDecodeError):
            codec.decode(text)


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


# -- the idempotency record's size check ---------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    chars=st.sampled_from(["x", "é", "€", "😀"]),
    length=st.integers(min_value=0, max_value=450 * 1024),
    key=st.text(min_size=1, max_size=40).filter(str.strip),
)
def test_the_idempotency_size_check_agrees_with_the_full_estimate(chars, length, key):
    # The check's cheap bound skips the estimate only where the estimate would pass too: a record
    # is refused exactly when the full estimate of the largest record it can become refuses it.
    from dynacoord.idempotency import Claim, Idempotency

    text = chars * (length // len(chars.encode()))
    claim = Claim(key, "t" * 32, 0, "h" * 64)
    try:
        codec.check_item_size(
            {
                "pk": f"IDEMP#{'x' * keys.MAX_NAMESPACE_CHARS}#{key}",
                "sk": "IDEMP",
                "status": "COMPLETED",
                "result": text,
                "payload_hash": "h" * 64,
                "expires_at_ms": 10**15,
                "ttl": 10**12,
                "created_ms": 10**15,
                "completed_ms": 10**15,
            },
            key=key,
        )
        fits = True
    except ValueTooLargeError:
        fits = False
    if fits:
        Idempotency._check_size(claim, text)
    else:
        with pytest.raises(ValueTooLargeError):
            Idempotency._check_size(claim, text)


# -- idempotency key selectors ----------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["order_id", "_x", "A1", "true", "null"])
@pytest.mark.parametrize(
    "event",
    [
        {"order_id": "o-1", "_x": 0, "A1": [1], "true": False, "null": {"a": 1}},
        {"order_id": None},
        {},
        ["order_id"],
        "order_id",
        7,
        None,
    ],
)
def test_a_bare_field_selector_gives_what_jmespath_gives(spec, event):
    # a JMESPath expression that is one field name is evaluated without jmespath: same answer
    import jmespath

    from dynacoord._invocation import _selector, jmespath_options

    assert _selector(spec, "key")(event) == jmespath.search(spec, event, options=jmespath_options())
    assert _selector(spec, "key").__name__ == f"jmespath({spec!r})"


def test_a_bare_field_selector_needs_the_event():
    from dynacoord._invocation import _selector

    with pytest.raises(TypeError, match="without a positional argument"):
        _selector("order_id", "key")(order_id="o-1")


def test_a_default_event_id_is_a_random_version_4_uuid_in_hex():
    """Events made without an id (and workers' lease tokens) get what uuid.uuid4().hex gives:
    32 hex digits of a version-4, RFC 4122 UUID, different every time."""
    import uuid

    from dynacoord.outbox import Event
    from dynacoord.outbox.event import new_event_id

    ids = [Event("t").id for _ in range(200)] + [new_event_id() for _ in range(200)]
    assert len(set(ids)) == len(ids)
    for event_id in ids:
        parsed = uuid.UUID(hex=event_id)
        assert parsed.hex == event_id and len(event_id) == 32
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_records_built_in_their_unfrozen_twins_are_what_the_constructor_makes():
    """Runs, checkpoints and counter results are built without the frozen dataclass __init__
    (dynacoord._items.unfrozen_twin): each builder must set every field, and give an object
    equal, hashed, printed, pickled and frozen as the constructor's."""
    import copy
    import dataclasses
    import pickle

    from dynacoord import counters, runs
    from dynacoord.checkpoints import Checkpoint, _checkpoint
    from dynacoord.counters import CounterItem, JoinResult, WriteOutcome
    from dynacoord.outbox import Event, EventRecord, EventStatus
    from dynacoord.outbox.event import _new_event, new_record

    event = Event("t", None, id="e")
    item = counters._counter_item("join", 3, 9, 5, frozenset({"a"}), "a")
    pairs = [
        (
            runs._new_run("r", runs.RunStatus.RUNNING, {"k": 1}, 1, 2, "ok", "e", 3, 4, 5),
            runs.Run("r", runs.RunStatus.RUNNING, {"k": 1}, 1, 2, "ok", "e", 3, 4, 5),
        ),
        (
            _checkpoint("t", 7, '{"a":1}', 0.5, 1500, 2500),
            Checkpoint("t", 7, {"a": 1}, 0.5, 1.5, 2.5),
        ),
        (item, CounterItem("join", 3, 9, 5, frozenset({"a"}), "a")),
        (counters._write_outcome(True, item, None, 2), WriteOutcome(True, item, None, 2)),
        (counters._join_result(3, True, False, 5), JoinResult(3, True, False, 5)),
        (
            _new_event("t", {"p": 1}, "i", 1.5, {"m": 2}, "g", 3, True),
            Event(
                "t",
                {"p": 1},
                id="i",
                occurred_at=1.5,
                metadata={"m": 2},
                group="g",
                attempt=3,
                ordered=True,
            ),
        ),
        (
            new_record(event, EventStatus.FAILED, 2, 9, "tok", "err", 8, 4),
            EventRecord(event, EventStatus.FAILED, 2, 9, "tok", "err", 8, 4),
        ),
    ]
    for built, made in pairs:
        cls = type(made)
        assert type(built) is cls
        for field in dataclasses.fields(cls):  # every field set, to the constructor's value
            assert getattr(built, field.name) == getattr(made, field.name), field.name
        assert built == made and repr(built) == repr(made)
        try:
            expected_hash: object = hash(made)
        except TypeError:  # holds a dict (a run's context, a checkpoint's data)
            expected_hash = TypeError
        try:
            assert hash(built) == expected_hash
        except TypeError:
            assert expected_hash is TypeError
        assert pickle.loads(pickle.dumps(built)) == made and copy.deepcopy(built) == made
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(built, dataclasses.fields(cls)[0].name, None)


@given(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**20), max_value=10**20),
        st.text(alphabet=st.characters(max_codepoint=0x2030, exclude_categories=["Cs"])),
        st.sampled_from(["", '"', "\\", "\x7f", "\x00", "a\tb", "\u2028"]),
    )
)
@settings(max_examples=400, deadline=None)
def test_a_lone_scalar_is_encoded_as_json_encodes_it(value):
    """codec.encode writes a lone str, int, bool or None without its walk: the same text."""
    import json

    from dynacoord import codec

    text = codec.encode(value)
    assert text == json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    assert codec.decode(text) == value
