"""Numbers at the edges (issue 13): a value out of range is refused with ``InvalidValueError`` when
it is given, never a raw ``decimal.Inexact``/``Rounded``/``Overflow`` or a plain ``ValueError``
later; DynamoDB's transaction limits (100 items, 4 MB, one item once) are checked before anything
is sent.

The DynamoDB cases run on Amazon DynamoDB Local (moto is lenient about numbers and transaction
sizes); the codec and ``@idempotent`` cases run on every contract backend. See
docs/guarantees.md, "Numbers".
"""

from __future__ import annotations

import decimal
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest

from dynacoord import (
    DynacoordError,
    Event,
    IdempotencyValueError,
    InvalidValueError,
    TransactionTooLargeError,
    codec,
)
from dynacoord.backends.dynamodb import DynamoDBBackend
from dynacoord.testing import DynamoDBLocal, unique_name

#: Python's default limit on int <-> str conversion, the codec's int limit.
MAX_INT_DIGITS = 4300

#: Numbers DynamoDB cannot hold exactly (or at all), as Python values.
UNSTORABLE_NUMBERS = [
    pytest.param(10**5000, id="int-5000-digits"),
    pytest.param(10**40, id="int-10**40"),
    pytest.param(-(10**38), id="int-minus-10**38"),
    pytest.param(Decimal("1." + "0" * 38 + "1"), id="decimal-40-digits"),
    pytest.param(Decimal("1e-200"), id="decimal-1e-200"),
    pytest.param(Decimal("1e-131"), id="decimal-1e-131"),
    pytest.param(Decimal(10**40), id="decimal-10**40"),
    pytest.param(Decimal("1e126"), id="decimal-1e126"),
    pytest.param(Decimal("1e200"), id="decimal-1e200"),
    pytest.param(Decimal("-1e126"), id="decimal-minus-1e126"),
]

#: The extremes DynamoDB holds exactly: accepted and read back unchanged.
STORABLE_NUMBERS = [
    pytest.param(10**38 - 1, id="int-38-nines"),
    pytest.param(-(10**38) + 1, id="int-minus-38-nines"),
    pytest.param(Decimal("9." + "9" * 37 + "E+125"), id="decimal-max"),
    pytest.param(Decimal("1E-130"), id="decimal-min-positive"),
    pytest.param(Decimal("-1E-130"), id="decimal-min-negative"),
    pytest.param(Decimal("1." + "0" * 36 + "1"), id="decimal-38-digits"),
    pytest.param(Decimal("0E-200"), id="decimal-zero-tiny-exponent"),
    pytest.param(Decimal("1E+40"), id="decimal-1E+40"),
]


class Sent:
    """Counts the requests of each operation a DynamoDB client sends."""

    def __init__(self, client: Any) -> None:
        self.ops: list[str] = []
        client.meta.events.register("before-send.dynamodb", self._hook)

    def _hook(self, event_name: str, **_: Any) -> None:
        self.ops.append(event_name.rsplit(".", 1)[-1])

    def count(self, operation: str) -> int:
        return self.ops.count(operation)


@pytest.fixture(scope="module")
def local(
    dynamodb_local: DynamoDBLocal, ddb_table: tuple[Any, str]
) -> Iterator[tuple[Any, str, Sent, str]]:
    """(client, dynacoord table, request counter, a business table with key ``pk``) on DynamoDB
    Local; the client is this module's own so its requests can be counted."""
    client = dynamodb_local.client()
    sent = Sent(client)
    orders = unique_name("orders")
    client.create_table(
        TableName=orders,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.get_waiter("table_exists").wait(TableName=orders)
    yield client, ddb_table[1], sent, orders
    client.delete_table(TableName=orders)


@pytest.fixture()
def env(local: tuple[Any, str, Sent, str]) -> tuple[DynamoDBBackend, Any, Sent, str]:
    client, table, sent, orders = local
    sent.ops.clear()
    return (
        DynamoDBBackend(client, table_name=table, namespace=unique_name("ns")),
        client,
        sent,
        orders,
    )


def _get(client: Any, table: str, pk: str) -> dict[str, Any] | None:
    # dynacoord's own unmarshal: boto3's TypeDeserializer raises decimal.Rounded on numbers that
    # DynamoDB returns with more than 38 digits written out (1E+40 comes back as 41 digits).
    from dynacoord.backends.dynamodb._marshal import unmarshal

    item = client.get_item(TableName=table, Key={"pk": {"S": pk}}, ConsistentRead=True).get("Item")
    return None if item is None else unmarshal(item)


def _assert_refused(exc: BaseException) -> None:
    assert isinstance(exc, InvalidValueError) and isinstance(exc, DynacoordError)
    assert not isinstance(exc, decimal.DecimalException)
    assert "digit" in str(exc) or "range" in str(exc) or "exactly" in str(exc), str(exc)


# -- the codec ------------------------------------------------------------------------------------


def test_codec_refuses_an_int_beyond_its_limit_with_invalid_value_error():
    with pytest.raises(InvalidValueError) as info:
        codec.encode(10**5000)
    _assert_refused(info.value)
    with pytest.raises(InvalidValueError):
        codec.encode({"deep": [1, -(10**MAX_INT_DIGITS)]})


def test_codec_round_trips_the_largest_int_it_takes():
    biggest = 10**MAX_INT_DIGITS - 1  # 4300 digits
    assert codec.decode(codec.encode(biggest)) == biggest
    assert codec.decode(codec.encode(-biggest)) == -biggest


def test_codec_keeps_decimals_exact_whatever_their_exponent():
    # The codec stores JSON text: any finite Decimal is exact there (DynamoDB's limits apply to
    # DynamoDB number attributes only, i.e. to transaction().put/update values).
    for value in (Decimal("1e-200"), Decimal("1." + "0" * 60 + "1"), Decimal(10**40)):
        back = codec.decode(codec.encode(value))
        assert back == value and str(back) == str(value)


def test_cache_set_of_a_huge_int_is_refused_on_every_backend_and_writes_nothing(make_backend):
    cache = make_backend().cache()
    with pytest.raises(InvalidValueError):
        cache.set("k", 10**5000)
    with pytest.raises(InvalidValueError):
        cache.add("k", [10**5000])
    assert cache.get("k") is None and cache.has("k") is False


def test_idempotent_result_beyond_the_codec_fails_loudly_and_never_runs_twice(make_backend):
    # issue 16: an unstorable result raises IdempotencyValueError at the first call, and the
    # record is completed as unstorable so duplicates raise instead of running again
    idem = make_backend().idempotency
    calls = []

    @idem.idempotent(key=lambda order: f"order:{order}")
    def handle(order: str) -> int:
        calls.append(order)
        return 10**5000

    with pytest.raises(IdempotencyValueError, match="cannot be stored"):
        handle("a")
    with pytest.raises(IdempotencyValueError):
        handle("a")
    assert calls == ["a"], "the side effects ran once"
    assert idem.get("order:a").unstorable == "int"


def test_idempotency_complete_with_an_unstorable_result_raises_invalid_value(make_backend):
    idem = make_backend().idempotency
    claim = idem.try_claim("k").claim
    assert claim is not None
    with pytest.raises(IdempotencyValueError) as info:
        idem.complete(claim, {"n": 10**5000})
    assert isinstance(info.value, InvalidValueError)
    assert idem.release(claim) is True, "nothing was written: the claim is still ours"


# -- Event(occurred_at=...) ------------------------------------------------------------------------


@pytest.mark.parametrize("occurred_at", [1e300, -1.0, 253402300800, 10**30, 1e19], ids=str)
def test_event_occurred_at_out_of_range_is_refused_when_given(occurred_at):
    with pytest.raises(InvalidValueError) as info:
        Event("t", 1, occurred_at=occurred_at)
    assert "occurred_at" in str(info.value)


def test_event_occurred_at_at_the_edges_publishes_and_reads_back(make_backend):
    outbox = make_backend().outbox
    first = Event("t", 1, occurred_at=0)
    last = Event("t", 2, occurred_at=253402300799.999)  # 9999-12-31T23:59:59.999Z
    outbox.publish([first, last])
    assert outbox.get(first.id).event.occurred_at == 0
    assert outbox.get(last.id).event.occurred_at == pytest.approx(253402300799.999)


# -- transaction().put/update numbers (DynamoDB Local) --------------------------------------------


@pytest.mark.integration
@pytest.mark.parametrize("number", UNSTORABLE_NUMBERS)
@pytest.mark.parametrize("where", ["put", "nested", "update-value", "key", "number-set"])
def test_transaction_refuses_a_number_dynamodb_cannot_hold_exactly(env, number, where):
    backend, client, sent, orders = env
    pk = unique_name("order")
    with pytest.raises(InvalidValueError) as info:
        with backend.transaction() as tx:
            tx.put(orders, {"pk": pk, "ok": 1})
            if where == "put":
                tx.put(orders, {"pk": unique_name("o"), "total": number})
            elif where == "nested":
                tx.put(orders, {"pk": unique_name("o"), "lines": [{"qty": 1, "price": number}]})
            elif where == "update-value":
                tx.update(orders, {"pk": unique_name("o")}, "SET total = :t", values={":t": number})
            elif where == "key":
                tx.delete(orders, {"pk": unique_name("o"), "n": number})
            else:
                tx.put(orders, {"pk": unique_name("o"), "ns": {1, number}})
    _assert_refused(info.value)
    assert sent.count("TransactWriteItems") == 0, "nothing is sent"
    assert _get(client, orders, pk) is None, "nothing is written"


@pytest.mark.integration
@pytest.mark.parametrize("number", STORABLE_NUMBERS)
def test_transaction_stores_the_extremes_dynamodb_holds_exactly(env, number):
    backend, client, _, orders = env
    pk = unique_name("order")
    with backend.transaction() as tx:
        tx.put(orders, {"pk": pk, "v": number, "lst": [number]})
    item = _get(client, orders, pk)
    assert item is not None and item["v"] == number and item["lst"] == [number]


@pytest.mark.integration
def test_transaction_refuses_a_float_with_invalid_value_error(env):
    backend, _, sent, orders = env
    with pytest.raises(InvalidValueError, match="float"):
        with backend.transaction() as tx:
            tx.put(orders, {"pk": "x", "v": 1.5})
    assert sent.count("TransactWriteItems") == 0


# -- transaction limits (DynamoDB Local) -----------------------------------------------------------

_BIG = "x" * (390 * 1024)  # 11 of these exceed DynamoDB's 4 MB transaction payload


@pytest.mark.integration
def test_transaction_over_4mb_is_refused_while_collecting_and_nothing_is_sent(env):
    backend, client, sent, orders = env
    pks = [unique_name("big") for _ in range(11)]
    with pytest.raises(TransactionTooLargeError) as info:
        with backend.transaction() as tx:
            for pk in pks:
                tx.put(orders, {"pk": pk, "blob": _BIG})
    assert "4 MB" in str(info.value) or "4MB" in str(info.value) or "bytes" in str(info.value)
    assert info.value.limit == 4 * 1024 * 1024 and info.value.size > info.value.limit
    assert len(tx) == 10, "the add that crossed the limit added nothing"
    assert sent.count("TransactWriteItems") == 0
    assert all(_get(client, orders, pk) is None for pk in pks)


@pytest.mark.integration
def test_transaction_just_under_4mb_commits(env):
    backend, client, _, orders = env
    pks = [unique_name("big") for _ in range(10)]
    with backend.transaction() as tx:
        for pk in pks:
            tx.put(orders, {"pk": pk, "blob": _BIG})
    assert all(_get(client, orders, pk) is not None for pk in pks)


@pytest.mark.integration
@pytest.mark.parametrize("extra", [0, 1])
def test_the_4mb_limit_is_dynamodbs_to_the_byte(env, extra):
    """DynamoDB's item-size rules give the aggregate DynamoDB checks (4 MiB = 4194304 bytes):
    exactly at the limit commits on DynamoDB Local, one byte more is refused before sending."""
    backend, client, sent, orders = env
    pks = [f"{unique_name('edge')}-{i:02d}" for i in range(11)]
    fixed = sum(len("pk") + len(pk) + len("blob") for pk in pks)
    per, rest = divmod(4 * 1024 * 1024 - fixed + extra, 11)
    blobs = [per + (1 if i < rest else 0) for i in range(11)]
    if extra:
        with pytest.raises(TransactionTooLargeError):
            with backend.transaction() as tx:
                for pk, n in zip(pks, blobs):
                    tx.put(orders, {"pk": pk, "blob": "x" * n})
        assert sent.count("TransactWriteItems") == 0
    else:
        with backend.transaction() as tx:
            for pk, n in zip(pks, blobs):
                tx.put(orders, {"pk": pk, "blob": "x" * n})
        assert all(_get(client, orders, pk) is not None for pk in pks)


@pytest.mark.integration
def test_events_over_4mb_in_one_publish_are_refused_before_sending(env):
    backend, _, sent, _ = env
    events = [Event("big", _BIG) for _ in range(11)]
    with pytest.raises(TransactionTooLargeError):
        backend.outbox.publish(events)
    assert sent.count("TransactWriteItems") == 0
    assert all(backend.outbox.get(e.id) is None for e in events)


@pytest.mark.integration
def test_events_over_4mb_in_a_transaction_are_refused_while_collecting(env):
    backend, _, sent, orders = env
    with pytest.raises(TransactionTooLargeError):
        with backend.transaction() as tx:
            tx.put(orders, {"pk": unique_name("o"), "blob": _BIG})
            tx.publish([Event("big", _BIG) for _ in range(10)])
    assert sent.count("TransactWriteItems") == 0


@pytest.mark.integration
@pytest.mark.parametrize(
    "case",
    [
        "same-event-published-twice",
        "same-put-twice-dynacoord-table",
        "update-then-delete-same-key",
        "put-then-condition-check-same-key",
        "put-then-update-same-key",
        "same-key-in-other-attribute-order",
    ],
)
def test_one_item_twice_in_a_transaction_is_refused_before_sending(env, case):
    backend, client, sent, orders = env
    pk = unique_name("o")
    with pytest.raises(InvalidValueError) as info:
        with backend.transaction() as tx:
            if case == "same-event-published-twice":
                event = Event("order.created", {"id": 1})
                tx.publish(event)
                tx.publish(event)
            elif case == "same-put-twice-dynacoord-table":
                tx.put(backend.table_name, {"pk": pk, "sk": "S", "v": 1})
                tx.put(backend.table_name, {"pk": pk, "sk": "S", "v": 2})
            elif case == "update-then-delete-same-key":
                tx.update(orders, {"pk": pk}, "SET v = :v", values={":v": 1})
                tx.delete(orders, {"pk": pk})
            elif case == "put-then-condition-check-same-key":
                tx.put(orders, {"pk": pk, "v": 1})
                tx.condition_check(orders, {"pk": pk}, "attribute_not_exists(pk)")
            elif case == "put-then-update-same-key":
                tx.put(orders, {"pk": pk, "v": 1})
                tx.update(orders, {"pk": pk}, "SET v = :v", values={":v": 2})
            else:
                tx.update(backend.table_name, {"pk": pk, "sk": "S"}, "SET v = :v", values={":v": 1})
                tx.delete(backend.table_name, {"sk": "S", "pk": pk})
    assert "twice" in str(info.value)
    assert sent.count("TransactWriteItems") == 0
    assert _get(client, orders, pk) is None


@pytest.mark.integration
def test_two_puts_of_one_item_in_a_table_of_unknown_key_are_refused_without_writing(env):
    """Two Puts into a table the transaction knows no key of (no Key-bearing operation on it):
    the duplicate cannot be seen before sending; DynamoDB refuses the whole transaction and the
    refusal is the same InvalidValueError (nothing written)."""
    backend, client, _, orders = env
    pk = unique_name("o")
    with pytest.raises(InvalidValueError, match="twice"):
        with backend.transaction() as tx:
            tx.put(orders, {"pk": pk, "v": 1})
            tx.put(orders, {"pk": pk, "v": 2})
    assert _get(client, orders, pk) is None


@pytest.mark.integration
def test_distinct_items_sharing_a_partition_key_are_not_duplicates(env):
    backend, _, _, _ = env
    pk = unique_name("p")
    with backend.transaction() as tx:
        tx.put(backend.table_name, {"pk": pk, "sk": "A"})
        tx.put(backend.table_name, {"pk": pk, "sk": "B"})
        tx.update(backend.table_name, {"pk": pk, "sk": "C"}, "SET v = :v", values={":v": 1})
    assert tx.committed
