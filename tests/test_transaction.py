"""``backend.transaction()``: business writes and outbox events in one TransactWriteItems.

Runs on moto and on Amazon DynamoDB Local (a DynamoDB-only feature: not part of the contract
suites that other backends run).
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynacoord import (
    DuplicateEventError,
    DynamoDBBackend,
    Event,
    EventStatus,
    InvalidValueError,
    TransactionCancelledError,
    TransactionTooLargeError,
)
from dynacoord.testing import unique_name


def _create_orders(client: Any, name: str) -> None:
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=name)


@pytest.fixture(params=["moto", "dynamodb"])
def env(request: pytest.FixtureRequest) -> Iterator[tuple[DynamoDBBackend, Any, str]]:
    """(backend, client, business table) on moto or DynamoDB Local."""
    fixture = "moto_table" if request.param == "moto" else "ddb_table"
    client, table = request.getfixturevalue(fixture)
    orders = unique_name("orders")
    _create_orders(client, orders)
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    backend.kind_for_tests = request.param  # type: ignore[attr-defined]
    yield backend, client, orders
    if request.param == "dynamodb":
        client.delete_table(TableName=orders)


def _order(client: Any, table: str, pk: str) -> dict[str, Any] | None:
    item = client.get_item(TableName=table, Key={"pk": {"S": pk}}, ConsistentRead=True).get("Item")
    if item is None:
        return None
    from boto3.dynamodb.types import TypeDeserializer

    return {k: TypeDeserializer().deserialize(v) for k, v in item.items()}


def test_business_write_and_event_commit_together(env):
    backend, client, orders = env
    event = Event("order.created", {"order": "o-1"})
    with backend.transaction() as tx:
        tx.put(orders, {"pk": "o-1", "total": decimal.Decimal("9.90"), "note": None})
        ids = tx.publish(event)
        assert len(tx) == 2
    assert ids == [event.id]
    assert tx.committed
    assert _order(client, orders, "o-1") == {
        "pk": "o-1",
        "total": decimal.Decimal("9.90"),
        "note": None,
    }
    assert backend.outbox.get(event.id).status is EventStatus.PENDING
    received = []
    assert backend.outbox.worker(received.append).run_once() == 1
    assert [e.payload for e in received] == [{"order": "o-1"}]


def test_block_that_raises_writes_nothing(env):
    backend, client, orders = env
    event = Event("order.created", {"order": "o-2"})
    with pytest.raises(RuntimeError, match="business rule"):
        with backend.transaction() as tx:
            tx.put(orders, {"pk": "o-2"})
            backend.outbox.publish(event, tx=tx)
            raise RuntimeError("business rule violated")
    assert not tx.committed
    assert _order(client, orders, "o-2") is None
    assert backend.outbox.get(event.id) is None
    assert backend.outbox.stats().pending == 0
    with pytest.raises(RuntimeError):
        tx.put(orders, {"pk": "late"})  # a finished transaction takes nothing more


def test_cancelled_transaction_reports_per_item_reasons(env):
    backend, client, orders = env
    client.put_item(TableName=orders, Item={"pk": {"S": "o-3"}, "state": {"S": "paid"}})
    event = Event("order.created", {"order": "o-3"})
    with pytest.raises(TransactionCancelledError) as info:
        with backend.transaction() as tx:
            tx.put(orders, {"pk": "o-3", "state": "new"}, condition="attribute_not_exists(pk)")
            tx.publish(event)
    assert not isinstance(info.value, DuplicateEventError)
    reasons = info.value.reasons
    assert len(reasons) == 2
    assert reasons[0]["Code"] == "ConditionalCheckFailed"
    assert reasons[0]["Operation"] == f"put into {orders!r}"
    assert reasons[1]["Code"] == "None"
    assert "ConditionalCheckFailed" in str(info.value)
    assert _order(client, orders, "o-3") == {"pk": "o-3", "state": "paid"}
    assert backend.outbox.get(event.id) is None


def test_101st_item_raises_while_collecting_and_nothing_is_written(env):
    backend, client, orders = env
    with pytest.raises(TransactionTooLargeError) as info:
        with backend.transaction() as tx:
            for i in range(99):
                tx.put(orders, {"pk": f"bulk-{i}"})
            with pytest.raises(TransactionTooLargeError):
                tx.publish([Event("t", 1), Event("t", 2)])  # would be 101: neither is added
            assert len(tx) == 99
            tx.publish(Event("t", 0, id="the-100th"))
            tx.put(orders, {"pk": "bulk-100"})  # the 101st
    assert info.value.size == 101 and info.value.limit == 100
    assert _order(client, orders, "bulk-0") is None
    assert backend.outbox.get("the-100th") is None


def test_exactly_100_items_commit(env):
    backend, client, orders = env
    with backend.transaction() as tx:
        for i in range(50):
            tx.put(orders, {"pk": f"hundred-{i}"})
        tx.publish([Event("t", i) for i in range(50)])
    assert _order(client, orders, "hundred-49") is not None
    assert backend.outbox.stats().pending == 50


def test_update_delete_and_condition_check(env):
    backend, client, orders = env
    client.put_item(TableName=orders, Item={"pk": {"S": "stock"}, "qty": {"N": "5"}})
    client.put_item(TableName=orders, Item={"pk": {"S": "cart"}})
    client.put_item(TableName=orders, Item={"pk": {"S": "flag"}, "open": {"BOOL": True}})
    with backend.transaction() as tx:
        tx.update(
            orders,
            {"pk": "stock"},
            "SET qty = qty - :n",
            condition="qty >= :n",
            values={":n": 2},
        )
        tx.delete(orders, {"pk": "cart"}, condition="attribute_exists(pk)")
        tx.condition_check(
            orders, {"pk": "flag"}, "#o = :yes", names={"#o": "open"}, values={":yes": True}
        )
        tx.publish(Event("stock.reserved", {"qty": 2}))
    assert _order(client, orders, "stock")["qty"] == 3
    assert _order(client, orders, "cart") is None
    # A false condition check cancels everything, the update included.
    with pytest.raises(TransactionCancelledError) as info:
        with backend.transaction() as tx:
            tx.update(orders, {"pk": "stock"}, "SET qty = qty - :n", values={":n": 1})
            tx.condition_check(
                orders, {"pk": "flag"}, "#o = :no", names={"#o": "open"}, values={":no": False}
            )
    assert [r["Code"] for r in info.value.reasons] == ["None", "ConditionalCheckFailed"]
    assert info.value.reasons[1]["Operation"] == f"condition check in {orders!r}"
    assert _order(client, orders, "stock")["qty"] == 3


def test_duplicate_event_id_cancels_the_transaction(env):
    backend, client, orders = env
    backend.outbox.publish(Event("t", 1, id="dup"))
    with pytest.raises(DuplicateEventError) as info:
        with backend.transaction() as tx:
            tx.put(orders, {"pk": "o-dup"})
            tx.publish(Event("t", 1, id="dup"))
    assert info.value.event_ids == ["dup"]
    assert isinstance(info.value, TransactionCancelledError)
    assert _order(client, orders, "o-dup") is None


def test_bad_input_fails_at_the_line_that_adds_it(env):
    backend, _, orders = env
    tx = backend.transaction()
    with pytest.raises(InvalidValueError, match="Decimal"):
        tx.put(orders, {"pk": "f", "price": 1.5})
    with pytest.raises(InvalidValueError):
        tx.put("", {"pk": "x"})
    with pytest.raises(InvalidValueError):
        tx.put(orders, {})
    with pytest.raises(InvalidValueError):
        tx.update(orders, {"pk": "x"}, "SET a = :a", values={"a": 1})  # placeholder without ':'
    with pytest.raises(InvalidValueError):
        tx.condition_check(orders, {"pk": "x"}, "a = :a", names={"a": "b"})
    assert len(tx) == 0


def test_empty_transaction_commits_without_a_request(env):
    backend, _, _ = env
    with backend.transaction() as tx:
        pass
    assert tx.committed and len(tx) == 0


def test_client_request_token_makes_a_retried_commit_idempotent(env):
    backend, client, orders = env
    if backend.kind_for_tests == "moto":  # type: ignore[attr-defined]
        pytest.skip("moto ignores ClientRequestToken")
    client.put_item(TableName=orders, Item={"pk": {"S": "counter"}, "n": {"N": "0"}})
    event = Event("counted", {}, id="counted-42")

    def bump() -> None:
        with backend.transaction(client_request_token="order-42-attempt") as tx:
            tx.update(orders, {"pk": "counter"}, "ADD n :one", values={":one": 1})
            tx.publish(event)

    bump()
    bump()  # the same request again within 10 minutes: DynamoDB does not apply it twice
    assert _order(client, orders, "counter")["n"] == 1
    assert backend.outbox.stats().pending == 1


def test_a_missing_business_table_is_named_not_the_dynacoord_table(env):
    from dynacoord import TableNotReadyError
    from dynacoord.outbox import Event

    backend, _, _ = env
    with pytest.raises(TableNotReadyError) as raised:
        with backend.transaction() as tx:
            tx.put("no-such-orders-table", {"pk": "o-1"})
            tx.publish(Event("order.placed", {"id": "o-1"}, id="evt-missing-table"))
    assert "'no-such-orders-table'" in str(raised.value)
    assert raised.value.table_name == "no-such-orders-table"
    assert backend.outbox.get("evt-missing-table") is None  # nothing written


def test_a_put_is_compared_again_once_its_tables_key_is_learned(env):
    """Two Puts of one item into a table whose key the transaction learns only later (from a
    keyed operation on another item of it): the later add that teaches the key finds the pair."""
    backend, _, orders = env
    first, other = unique_name("o"), unique_name("o")
    with pytest.raises(InvalidValueError, match="twice"):
        with backend.transaction() as tx:
            tx.put(orders, {"pk": first, "v": 1})
            tx.put(orders, {"pk": first, "v": 2})  # not comparable yet: key of orders unknown
            tx.delete(orders, {"pk": other})
    assert len(tx) == 2, "the add that found the pair added nothing"


def test_after_a_refused_add_the_transaction_goes_on_as_before(env):
    """An add refused for a duplicate leaves what was collected (and its identities) as it was."""
    backend, client, orders = env
    pk = unique_name("o")
    event = Event("order.created", {"id": 1})
    with backend.transaction() as tx:
        tx.put(orders, {"pk": pk, "v": 1})
        tx.publish(event)
        with pytest.raises(InvalidValueError, match="twice"):
            tx.publish([Event("order.other", {"id": 2}), event])
        with pytest.raises(InvalidValueError, match="twice"):
            tx.update(orders, {"pk": pk}, "SET v = :v", values={":v": 2})
        assert len(tx) == 2
    assert tx.committed
    assert _order(client, orders, pk) == {"pk": pk, "v": 1}
    assert backend.outbox.get(event.id) is not None


@pytest.mark.parametrize(
    "payload",
    [
        None,
        "",
        "é" * 300,
        "\U0001f600" * 200,
        {"nested": [1, 2.5, decimal.Decimal("1E+40"), b"\x00\xff" * 50, None, True]},
        list(range(500)),
        {f"k{i}" * 40: "v" * 40 for i in range(30)},
    ],
)
def test_an_events_size_bound_is_never_below_its_estimate(moto_table, payload):
    """The outbox hands the transaction an upper bound on an event's bytes (so the 4 MB check
    need not estimate it): it must never be under DynamoDB's size of the entry."""
    from dynacoord.backends.dynamodb._limits import entry_size

    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    store = backend.outbox._store
    for metadata in (None, {"trace": "t" * 30, "n": 7}):
        for group in (None, "g" * 20):
            event = Event("t" * 10, payload, metadata=metadata, group=group)
            entry, bound = store.transaction_entry(event, 1_700_000_000_000)
            assert bound >= entry_size(entry)


@pytest.mark.parametrize(
    "values",
    [
        {"pk": "a", "sk": "b"},
        {"pk": "é" * 100, "n": 10**37, "neg": -(10**37), "zero": 0},
        {"\U0001f600" * 10: "\U0001f600" * 50, "d": decimal.Decimal("1.5E+100")},
        {"m": {"nested": [1, "x" * 40, None, True, b"\x00" * 30]}, "s": {"a", "b"}},
        {"big": decimal.Decimal("1E+40"), "f": decimal.Decimal("-0.000001")},
    ],
)
def test_a_marshalled_items_bound_is_never_below_its_size(values):
    """A Put's or key's bytes are bounded while marshalling (so the 4 MB check need not
    estimate them): the bound must never be under DynamoDB's size of what was marshalled."""
    from dynacoord.backends.dynamodb._limits import map_size
    from dynacoord.backends.dynamodb.transaction import marshal_with_bound

    marshalled, bound = marshal_with_bound(values, "item")
    assert bound >= map_size(marshalled)


@pytest.mark.parametrize("ordered", [False, True])
def test_a_new_events_item_holds_exactly_the_shared_pending_fields(moto_table, ordered):
    """The DynamoDB store builds a new event's attribute values directly (once per published
    event): they must be the fields every backend shares (pending_fields), keys aside."""
    from dynacoord.backends.dynamodb._marshal import unmarshal
    from dynacoord.outbox import pending_fields

    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    store = backend.outbox._store
    for payload in (None, {"a": [1, "é", b"\x00"]}, "x" * 50):
        for metadata in (None, {"trace": "t"}):
            for group in {"g"} if ordered else {None, "g"}:
                event = Event("t.x", payload, metadata=metadata, group=group, ordered=ordered)
                seq = 7 if ordered else None
                item, _ = store._items.item(event, 1_700_000_000_123, seq)
                stored = unmarshal(item)
                keys = {name: stored.pop(name) for name in ("pk", "sk", "gsi1pk", "gsi1sk")}
                assert keys["sk"] == "EVENT" and keys["pk"].endswith("#" + event.id)
                expected = pending_fields(event, 1_700_000_000_123, seq)
                assert stored == expected
                assert list(stored) == list(expected), "the same attribute order"


def test_a_puts_identity_is_the_same_on_the_fast_and_the_general_path():
    """Puts into the dynacoord table are identified without the general path: same result."""
    from dynacoord.backends.dynamodb._limits import PK_SK, item_identity

    general = {"t": frozenset(["sk", "pk"])}  # equal, but not the fast path's own set
    assert general["t"] is not PK_SK
    for item in (
        {"pk": {"S": "a"}, "sk": {"S": "b"}, "v": {"N": "1"}},
        {"pk": {"S": "a"}, "sk": {"N": "2"}},
        {"pk": {"B": b"a"}, "sk": {"S": "b"}},
        {"pk": {"S": "a"}},
        {"v": {"S": "a"}},
    ):
        entry = {"Put": {"TableName": "t", "Item": item}}
        assert item_identity(entry, {"t": PK_SK}) == item_identity(entry, general)


def test_a_new_events_keys_are_the_key_functions_for_any_id(moto_table):
    """The store builds a new event's keys from its namespace's prefix: the same keys as
    outbox_pk / outbox_index_sk, and the same refusal of an id too long for a sort key."""
    from dynacoord.errors import InvalidKeyError
    from dynacoord.keys import outbox_index_sk, outbox_pk

    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"))
    store = backend.outbox._store
    for event_id in ("plain", "é-ü-\U0001f600", "x" * 1000, "é" * 500):
        item, _ = store._items.item(Event("t", None, id=event_id), 1_700_000_000_123)
        assert item["pk"]["S"] == outbox_pk(backend.namespace, event_id)
        assert item["gsi1sk"]["S"] == outbox_index_sk(1_700_000_000_123, event_id)
    for too_long in ("x" * 1010, "é" * 510):
        with pytest.raises(InvalidKeyError, match="too long for a sort key"):
            store._items.item(Event("t", None, id=too_long), 1_700_000_000_123)


@pytest.mark.parametrize("shards", [1, 4, 7])
def test_a_new_events_index_partition_is_its_shards_pending_queue(moto_table, shards):
    """The store picks a new event's gsi1 partition from its precomputed pending queues: the
    partition record_index gives it (by event id, or by group for an ordered event)."""
    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table, namespace=unique_name("ns"), shards=shards)
    store = backend.outbox._store
    now = 1_700_000_000_123
    seen = set()
    for i in range(60):
        for group, ordered in ((None, False), (f"g{i}", False), (f"g{i}", True)):
            event = Event("t", None, id=f"e{i}-{group}-{ordered}", group=group, ordered=ordered)
            item, _ = store._items.item(event, now, 3 if ordered else None)
            expected, _ = store._items.record_index(event, EventStatus.PENDING, now)
            assert item["gsi1pk"]["S"] == expected
            seen.add(expected)
    assert len(seen) == shards, "every shard's queue is used"


_ENTRY_OPS = st.one_of(
    # a Put into the dynacoord table "t" (string keys: the short path), a few keys only, so
    # that the same item comes up twice
    st.tuples(st.just("put"), st.sampled_from("abc"), st.sampled_from("xy"), st.integers(0, 400)),
    # a Put into "t" with a number sort key, into another table, a keyed operation on it
    st.tuples(st.just("put-n"), st.sampled_from("ab"), st.integers(0, 2), st.integers(0, 40)),
    st.tuples(st.just("put-other"), st.sampled_from("ab"), st.just(""), st.integers(0, 40)),
    st.tuples(st.just("delete-other"), st.sampled_from("ab"), st.just(""), st.just(0)),
    st.tuples(st.just("delete"), st.sampled_from("abc"), st.sampled_from("xy"), st.just(0)),
)


def _entry(op: tuple[str, str, Any, int]) -> tuple[Any, dict[str, Any]]:
    kind, pk, sk, size = op
    if kind == "put":
        item = {"pk": {"S": pk}, "sk": {"S": sk}, "v": {"S": "v" * size}}
        return ("put into", "t"), {"Put": {"TableName": "t", "Item": item}}
    if kind == "put-n":
        item = {"pk": {"S": pk}, "sk": {"N": str(sk)}, "v": {"S": "v" * size}}
        return ("put into", "t"), {"Put": {"TableName": "t", "Item": item}}
    if kind == "put-other":
        item = {"pk": {"S": pk}, "v": {"S": "v" * size}}
        return ("put into", "o"), {"Put": {"TableName": "o", "Item": item}}
    if kind == "delete-other":
        return ("delete from", "o"), {"Delete": {"TableName": "o", "Key": {"pk": {"S": pk}}}}
    key = {"pk": {"S": pk}, "sk": {"S": sk}}
    return ("delete from", "t"), {"Delete": {"TableName": "t", "Key": key}}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_ENTRY_OPS, st.booleans()), max_size=12))
def test_adding_one_entry_leaves_what_the_general_path_leaves(ops):
    """A single add takes a short path for a plain Put with string keys into a pk/sk table:
    after any sequence of adds, with or without event ids, near the item and byte limits, the
    transaction holds what the general path would hold, and refuses what it refuses, with the
    same error."""
    import copy
    import types

    from dynacoord.backends.dynamodb._limits import entry_size
    from dynacoord.backends.dynamodb.transaction import Transaction

    table = types.SimpleNamespace(name="t")
    short = Transaction(table, max_items=6, max_bytes=900)
    general = Transaction(table, max_items=6, max_bytes=900)
    for index, (op, is_event) in enumerate(ops):
        label, entry = _entry(op)
        event_id = f"e{index}" if is_event else None
        bound = 2 * entry_size(entry)  # an upper bound, as the outbox hands over
        outcomes = []
        for tx in (short, general):
            try:
                if tx is short:
                    tx._add_entry(label, event_id, copy.deepcopy(entry), bound)
                else:
                    tx._add_entries([(label, event_id, copy.deepcopy(entry), bound)])
                outcomes.append(None)
            except (InvalidValueError, TransactionTooLargeError) as exc:
                outcomes.append((type(exc), str(exc)))
        assert outcomes[0] == outcomes[1]
        for slot in Transaction.__slots__:
            assert getattr(short, slot) == getattr(general, slot), slot
