"""Fencing enforced at the resource, on every backend (issue 53, docs/locks.md "Fencing at the
resource").

Kleppmann's history: holder A acquires (fence f1) and pauses past its TTL; B acquires (f2 > f1)
and writes the resource with its fence; A resumes and writes with f1. A's write must be refused
*where it lands* and B's must stand. ``lease.fenced_update`` (every backend) keeps the fence in
the application's item; ``lease.guard(tx)`` (DynamoDB) makes a whole transaction of the
application's writes, in any table, conditional on the lease still holding the lock.

tests/mutations/guards.d/fencing.toml breaks each condition on each backend; these tests catch it.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from dynacoord import (
    FenceRejectedError,
    LockLostError,
    ManualClock,
    NotSupportedError,
    TransactionCancelledError,
)
from dynacoord.errors import InvalidValueError

DYNAMODB_KINDS = ("moto", "dynamodb")

#: the transaction tests: DynamoDB's kinds (with a table layout on moto), not parametrized over
#: backends that have no transaction only to be skipped there
transactions = pytest.mark.parametrize(
    "make_backend", ["moto", "dynamodb", "moto_layout"], indirect=True
)
#: checks of input, one backend of each kind
one_of_each = pytest.mark.parametrize("make_backend", ["moto", "redis", "mongo"], indirect=True)


def _kind(make_backend: Any) -> str:
    kind: str = make_backend.kind
    return "dynamodb" if kind in DYNAMODB_KINDS else "redis" if kind.startswith("redis") else kind


class Resource:
    """The application's own item a lock protects, on the backend's store: its key for
    ``lease.fenced_update`` and a consistent read of it as plain Python values."""

    def __init__(self, backend: Any, kind: str, name: str = "order") -> None:
        self.backend = backend
        self.kind = kind
        ns = backend.namespace
        if kind == "dynamodb":  # an item of yours in the backend's table, in its key names
            layout = backend.layout
            self.key: Any = {layout.pk: f"APP#{ns}#{name}", layout.sk: "ORDER"}
        elif kind == "redis":
            self.key = f"app:{ns}:{name}"
        else:  # a document of yours in the backend's collection: (pk, sk) is a unique index
            self.key = {"pk": f"APP#{ns}#{name}", "sk": "ORDER"}

    def read(self) -> dict[str, Any] | None:
        if self.kind == "dynamodb":
            from dynacoord.backends.dynamodb._marshal import marshal, unmarshal

            table = self.backend.table
            raw = table.client.get_item(
                TableName=table.name, Key=marshal(self.key), ConsistentRead=True
            ).get("Item")
            if not raw:
                return None
            return {k: int(v) if isinstance(v, Decimal) else v for k, v in unmarshal(raw).items()}
        if self.kind == "redis":
            raw = self.backend.conn.client.hgetall(self.key)
            return {k.decode(): v.decode() for k, v in raw.items()} or None
        doc = self.backend._ready().collection.find_one(dict(self.key), {"_id": 0})
        return doc


def _fence(value: Any) -> int:
    return int(value)


# -- Kleppmann's history, on every backend ---------------------------------------------------------


def test_a_paused_holder_is_refused_at_the_resource_and_the_next_holders_write_stands(
    make_backend: Any,
) -> None:
    clock = ManualClock()
    a_side = make_backend(clock=clock)
    b_side = make_backend(clock=clock, namespace=a_side.namespace)
    item = Resource(b_side, _kind(make_backend))

    a = a_side.locks.acquire("order", ttl=1)
    assert a is not None
    clock.advance(2)  # A pauses past its TTL (a GC pause, a frozen Lambda)
    b = b_side.locks.acquire("order", ttl=10)
    assert b is not None and b.fence > a.fence
    b.fenced_update(item.key, {"status": "shipped-by-b"})

    with pytest.raises(FenceRejectedError) as refused:
        a.fenced_update(item.key, {"status": "shipped-by-a"})  # A resumes, writes with f1
    assert refused.value.fence == a.fence
    assert refused.value.stored_fence == b.fence
    assert refused.value.key == "order" and refused.value.owner == a.owner

    stored = item.read()
    assert stored is not None
    assert stored["status"] == "shipped-by-b"
    assert _fence(stored["fence"]) == b.fence


def test_a_holder_writes_its_item_again_and_a_first_write_creates_it(make_backend: Any) -> None:
    backend = make_backend()
    item = Resource(backend, _kind(make_backend))
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    assert item.read() is None
    lease.fenced_update(item.key, {"status": "paid"})
    lease.fenced_update(item.key, {"status": "shipped", "carrier": "ups"})  # the same fence
    stored = item.read()
    assert stored is not None
    assert (stored["status"], stored["carrier"]) == ("shipped", "ups")
    assert _fence(stored["fence"]) == lease.fence


def test_a_later_lease_overwrites_and_an_earlier_one_never_does(make_backend: Any) -> None:
    # Without an expiry in between: the first holder releases, the next one writes; then the
    # first one's lease object (released, but the code kept it) tries again.
    backend = make_backend()
    item = Resource(backend, _kind(make_backend))
    first = backend.locks.acquire("order", ttl=10)
    assert first is not None
    first.fenced_update(item.key, {"n": 1})
    first.release()
    second = backend.locks.acquire("order", ttl=10)
    assert second is not None and second.fence > first.fence
    second.fenced_update(item.key, {"n": 2})
    with pytest.raises(FenceRejectedError):
        first.fenced_update(item.key, {"n": 3})
    stored = item.read()
    assert stored is not None and int(stored["n"]) == 2
    assert _fence(stored["fence"]) == second.fence


@one_of_each
def test_fenced_update_refuses_bad_input_before_writing(make_backend: Any) -> None:
    backend = make_backend()
    item = Resource(backend, _kind(make_backend))
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    with pytest.raises(InvalidValueError):
        lease.fenced_update(item.key, {"fence": 1})  # the write sets the fence itself
    with pytest.raises(InvalidValueError):
        lease.fenced_update(item.key, {"x": 1}, attr="")
    if _kind(make_backend) == "redis":
        with pytest.raises(InvalidValueError):
            lease.fenced_update(item.key, {"x": 1}, table="orders")  # Redis has no tables
    assert item.read() is None


# -- lease.guard(tx): DynamoDB transactions ---------------------------------------------------------


def _app_table(backend: Any) -> str:
    """A table of the application's own beside the dynacoord table (key ``id``)."""
    client = backend.table.client
    name = f"app-orders-{backend.namespace}"[:200]
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def _get(backend: Any, table: str, key: str) -> dict[str, Any] | None:
    raw = backend.table.client.get_item(
        TableName=table, Key={"id": {"S": key}}, ConsistentRead=True
    ).get("Item")
    return raw or None


@transactions
def test_a_guarded_transaction_commits_while_the_lease_holds(make_backend: Any) -> None:
    backend = make_backend()
    other = _app_table(backend)
    item = Resource(backend, "dynamodb")
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    with backend.transaction() as tx:
        tx.put(other, {"id": "1", "status": "paid"})
        lease.guard(tx)
        tx.update(
            backend.table_name,
            item.key,
            **lease.fence_condition().update_args(
                "SET #s = :s", names={"#s": "status"}, values={":s": "paid"}
            ),
        )
    assert tx.committed
    assert _get(backend, other, "1") is not None
    stored = item.read()
    assert stored is not None and stored["status"] == "paid"
    assert _fence(stored["fence"]) == lease.fence
    assert lease.is_held(), "a guard checks the lock item, it does not write it"


@transactions
def test_a_guarded_transaction_of_a_holder_taken_over_writes_nothing(make_backend: Any) -> None:
    clock = ManualClock()
    a_side = make_backend(clock=clock)
    b_side = make_backend(clock=clock, namespace=a_side.namespace)
    other = _app_table(a_side)
    a = a_side.locks.acquire("order", ttl=1)
    assert a is not None
    taken: list[Any] = []
    with pytest.raises(LockLostError) as lost:
        with a_side.transaction() as tx:
            tx.put(other, {"id": "1", "status": "by-a"})
            a.guard(tx)  # unexpired by A's clock now: only owner and fence can refuse it
            clock.advance(2)  # A pauses before its commit; B takes the lock over
            taken.append(b_side.locks.acquire("order", ttl=10))
    (b,) = taken
    assert b is not None and b.fence > a.fence
    error = lost.value
    assert isinstance(error, TransactionCancelledError) and isinstance(error, FenceRejectedError)
    assert (error.key, error.owner, error.fence) == ("order", a.owner, a.fence)
    assert error.holder == b.owner and error.stored_fence == b.fence
    assert [r["Code"] for r in error.reasons] == ["None", "ConditionalCheckFailed"]
    assert _get(a_side, other, "1") is None, "nothing of the transaction was written"


@transactions
def test_a_guard_refuses_a_lease_expired_by_the_clock_or_released_elsewhere(
    make_backend: Any,
) -> None:
    clock = ManualClock()
    backend = make_backend(clock=clock)
    other = _app_table(backend)
    lease = backend.locks.acquire("order", ttl=1)
    assert lease is not None
    clock.advance(2)  # expired, nobody took it: still refused (the lease is not held)
    with pytest.raises(LockLostError) as expired:
        with backend.transaction() as tx:
            tx.put(other, {"id": "1"})
            lease.guard(tx)
    assert expired.value.holder == lease.owner and "expired" in str(expired.value)
    fresh = backend.locks.acquire("order", ttl=10)
    assert fresh is not None
    assert backend.locks.force_release("order")  # an operator frees it
    with pytest.raises(LockLostError) as freed:
        with backend.transaction() as tx:
            tx.put(other, {"id": "1"})
            fresh.guard(tx)
    assert freed.value.holder is None
    assert _get(backend, other, "1") is None


@transactions
def test_a_guard_of_a_lease_known_lost_raises_at_once(make_backend: Any) -> None:
    backend = make_backend()
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    lease.release()
    with pytest.raises(LockLostError):
        with backend.transaction() as tx:
            lease.guard(tx)
    assert not tx.committed


@one_of_each
def test_guard_is_refused_clearly_where_there_is_no_transaction(make_backend: Any) -> None:
    backend = make_backend()
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    if _kind(make_backend) == "dynamodb":
        with pytest.raises(InvalidValueError):
            lease.guard(object())
        return
    with pytest.raises(NotSupportedError, match="fenced_update"):
        lease.guard(object())


# -- the pieces for a request of your own -------------------------------------------------------


def test_fence_condition_pieces_on_the_low_level_client_and_the_resource_api(moto_table):
    import boto3

    client, _ = moto_table
    client.create_table(
        TableName="orders",
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    from dynacoord import fence_condition

    def update(fence: int, status: str) -> None:
        client.update_item(
            **fence_condition(fence).update_item(
                TableName="orders",
                Key={"id": {"S": "1"}},
                UpdateExpression="SET #s = :s",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues={":s": {"S": status}},
            )
        )

    update(8, "b")
    update(8, "b again")
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        update(7, "a")
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        client.put_item(
            **fence_condition(7).put_item(
                TableName="orders", Item={"id": {"S": "1"}, "status": {"S": "a"}}
            )
        )
    table = boto3.resource("dynamodb", region_name=client.meta.region_name).Table("orders")
    fc = fence_condition(7)
    with pytest.raises(client.exceptions.ConditionalCheckFailedException):
        table.update_item(
            Key={"id": "1"},
            UpdateExpression="SET #s = :s, " + fc.set_action,
            ConditionExpression=fc.attr_condition(),
            ExpressionAttributeNames={"#s": "status", **fc.names},
            ExpressionAttributeValues={":s": "a", **fc.values},
        )
    fc9 = fence_condition(9)
    table.update_item(
        Key={"id": "1"},
        UpdateExpression="SET #s = :s, " + fc9.set_action,
        ConditionExpression=fc9.attr_condition(),
        ExpressionAttributeNames={"#s": "status", **fc9.names},
        ExpressionAttributeValues={":s": "c", **fc9.values},
    )
    item = client.get_item(TableName="orders", Key={"id": {"S": "1"}})["Item"]
    assert item["status"] == {"S": "c"} and item["fence"] == {"N": "9"}


def test_fence_condition_pieces_on_a_mongodb_filter(mongo_database):
    from pymongo.errors import DuplicateKeyError

    from dynacoord import fence_condition

    coll = mongo_database["app_orders_pieces"]
    coll.delete_many({})

    def update(fence: int, status: str) -> int:
        fc = fence_condition(fence)
        result = coll.update_one(
            fc.mongo_filter({"_id": "1"}),
            {"$set": {"status": status, **fc.mongo_set()}},
            upsert=True,
        )
        return int(result.matched_count + (result.upserted_id is not None))

    assert update(8, "b") == 1
    assert update(8, "b again") == 1
    with pytest.raises(DuplicateKeyError):  # a larger fence is there: the upsert clashes
        update(7, "a")
    assert coll.find_one({"_id": "1"}) == {"_id": "1", "status": "b again", "fence": 8}


def test_fenced_update_into_another_collection_keyed_by_id(mongo_backend_factory):
    clock = ManualClock()
    a_side = mongo_backend_factory(clock=clock)
    b_side = mongo_backend_factory(clock=clock, namespace=a_side.namespace)
    name = f"app_orders_{a_side.namespace}"
    a = a_side.locks.acquire("order", ttl=1)
    clock.advance(2)
    b = b_side.locks.acquire("order", ttl=10)
    b.fenced_update({"_id": "1"}, {"status": "b"}, table=name)
    with pytest.raises(FenceRejectedError) as refused:
        a.fenced_update({"_id": "1"}, {"status": "a"}, table=name)
    assert refused.value.stored_fence == b.fence
    doc = b_side._ready().collection.database[name].find_one({"_id": "1"})
    assert doc == {"_id": "1", "status": "b", "fence": b.fence}


# -- lost responses ------------------------------------------------------------------------------

#: the request of a fenced write, by backend (tests/lossy.py's names)
FENCED_WRITE = {"dynamodb": "UpdateItem", "redis": "EVALSHA", "mongo": "update_one"}


def _raised() -> tuple[type[BaseException], ...]:
    from botocore.exceptions import EndpointConnectionError

    from dynacoord import BackendError

    return (EndpointConnectionError, BackendError)


def test_a_fenced_write_re_sent_after_its_answer_was_lost_answers_as_applied(lossy: Any) -> None:
    # The client's own retry carries the same fence: an equal fence is accepted, so the retry
    # of an applied write is not reported as refused.
    backend = lossy.backend()
    item = Resource(backend, lossy.kind)
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    lossy.lose_next(operation=FENCED_WRITE[lossy.kind])
    lease.fenced_update(item.key, {"status": "paid"})
    assert lossy.lost == 1
    stored = item.read()
    assert stored is not None and stored["status"] == "paid"
    assert _fence(stored["fence"]) == lease.fence


def test_a_fenced_write_applied_then_raised_is_maybe_applied_and_its_retry_is_fenced(
    lossy: Any,
) -> None:
    # What the caller sees: the client's error (botocore's EndpointConnectionError, or the
    # backend's BackendError), the write applied. Its retry with the same lease is accepted
    # while no later holder wrote; once one did, the retry is refused and the later write
    # stands (A's write applied before B's: the order the fences say).
    clock = ManualClock()
    a_side = lossy.backend(clock=clock)
    b_side = lossy.backend(clock=clock, namespace=a_side.namespace)
    item = Resource(a_side, lossy.kind)
    a = a_side.locks.acquire("order", ttl=1)
    assert a is not None

    lossy.raise_next(operation=FENCED_WRITE[lossy.kind])
    with pytest.raises(_raised()):
        a.fenced_update(item.key, {"status": "a-1"})
    stored = item.read()
    assert stored is not None and stored["status"] == "a-1", "applied, then raised"
    a.fenced_update(item.key, {"status": "a-1"})  # the retry: accepted, the same fence

    taken: list[Any] = []

    def b_takes_over() -> None:
        clock.advance(2)
        b = b_side.locks.acquire("order", ttl=10)
        assert b is not None
        b.fenced_update(item.key, {"status": "b"})
        taken.append(b)

    lossy.raise_next(operation=FENCED_WRITE[lossy.kind], then=b_takes_over)
    with pytest.raises(_raised()):
        a.fenced_update(item.key, {"status": "a-2"})
    with pytest.raises(FenceRejectedError):
        a.fenced_update(item.key, {"status": "a-2"})
    stored = item.read()
    assert stored is not None and stored["status"] == "b"
    assert _fence(stored["fence"]) == taken[0].fence


@pytest.mark.parametrize("lossy", ["dynamodb"], indirect=True)  # transactions: DynamoDB's
def test_a_guarded_transaction_applied_then_raised_and_lost_and_re_sent(lossy: Any) -> None:
    backend = lossy.backend()
    item = Resource(backend, "dynamodb")
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None

    def write(status: str) -> None:
        with backend.transaction() as tx:
            lease.guard(tx)
            tx.update(
                backend.table_name,
                item.key,
                **lease.fence_condition().update_args(
                    "SET #s = :s", names={"#s": "status"}, values={":s": status}
                ),
            )

    # lost and re-sent by botocore (the same ClientRequestToken): answers as committed
    lossy.lose_next(operation="TransactWriteItems")
    write("paid")
    assert lossy.lost == 1
    # applied, then raised: the caller sees botocore's error; the write is there, and the
    # retry (a new transaction: guard and fenced update again) commits while the lease holds
    lossy.raise_next(operation="TransactWriteItems")
    with pytest.raises(_raised()):
        write("shipped")
    stored = item.read()
    assert stored is not None and stored["status"] == "shipped"
    write("shipped")
    assert lease.is_held()


# -- cost ----------------------------------------------------------------------------------------


def test_a_fenced_write_is_one_request_and_a_guard_one_more_transaction_item(moto_table):
    # docs/locks.md: fenced_update sends one UpdateItem; guard sends nothing itself and adds one
    # ConditionCheck to the transaction's single TransactWriteItems.
    from dynacoord.backends.dynamodb import DynamoDBBackend

    client, table = moto_table
    backend = DynamoDBBackend(client, table_name=table, namespace="cost")
    lease = backend.locks.acquire("order", ttl=10)
    assert lease is not None
    sent: list[tuple[str, int]] = []

    def watch(model: Any, params: dict[str, Any], **_: Any) -> None:
        sent.append((model.name, len(params.get("TransactItems", ()))))

    # the request's own parameters (before-call sees the serialized body)
    client.meta.events.register("before-parameter-build.dynamodb.*", watch)
    item = Resource(backend, "dynamodb")
    lease.fenced_update(item.key, {"status": "paid"})
    assert sent == [("UpdateItem", 0)]
    sent.clear()
    with backend.transaction() as tx:
        tx.put(table, {"pk": "APP#cost#x", "sk": "X"})
        lease.guard(tx)
        assert sent == [], "guard() sends nothing"
    assert sent == [("TransactWriteItems", 2)]


# -- the pieces themselves (no store) ------------------------------------------------------------


def test_fence_condition_merges_into_a_request_and_refuses_what_would_clash() -> None:
    from dynacoord import fence_condition

    fc = fence_condition(7, "version")
    request = fc.update_item(
        TableName="orders",
        Key={"id": {"S": "1"}},
        UpdateExpression="REMOVE note set #s = :s ADD n :one",
        ConditionExpression="attribute_exists(id)",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":s": {"S": "paid"}, ":one": {"N": "1"}},
    )
    assert request["UpdateExpression"] == (
        "REMOVE note set #dcfence = :dcfence, #s = :s ADD n :one"
    )
    assert request["ConditionExpression"] == (
        "(attribute_exists(id)) AND (attribute_not_exists(#dcfence) OR #dcfence <= :dcfence)"
    )
    assert request["ExpressionAttributeNames"] == {"#s": "status", "#dcfence": "version"}
    assert request["ExpressionAttributeValues"][":dcfence"] == {"N": "7"}
    # no SET clause: one is added; a #settings placeholder is not the keyword
    assert fc.update_item(UpdateExpression="REMOVE #settings")["UpdateExpression"] == (
        "SET #dcfence = :dcfence REMOVE #settings"
    )
    assert fc.update_args()["update_expression"] == "SET #dcfence = :dcfence"
    assert fc.put_item(Item={"id": {"S": "1"}})["Item"]["version"] == {"N": "7"}
    assert fc.mongo_filter({"_id": 1}) == {
        "_id": 1,
        "$or": [{"version": {"$exists": False}}, {"version": {"$lte": 7}}],
    }
    with pytest.raises(InvalidValueError):
        fc.update_item(ExpressionAttributeNames={"#dcfence": "x"})
    with pytest.raises(InvalidValueError):
        fc.put_item(Item={"id": {"S": "1"}, "version": {"N": "9"}})
    with pytest.raises(InvalidValueError):
        fc.mongo_filter({"$or": []})
    for bad in (-1, 1.5, "7", True):
        with pytest.raises(InvalidValueError):
            fence_condition(bad)


def test_kleppmanns_history_through_a_table_layout_on_dynamodb_local(
    dynamodb_layout_backend_factory: Any,
) -> None:
    # DynamoDB's own expression checks on the guard translated into the layout's names (moto
    # with a layout runs the other tests; the contract conftest keeps DynamoDB Local with a
    # layout to a few modules).
    clock = ManualClock()
    a_side = dynamodb_layout_backend_factory(clock=clock)
    b_side = dynamodb_layout_backend_factory(clock=clock, namespace=a_side.namespace)
    item = Resource(a_side, "dynamodb")
    a = a_side.locks.acquire("order", ttl=1)
    assert a is not None
    with a_side.transaction() as tx:
        tx.update(
            a_side.table_name,
            item.key,
            **a.fence_condition().update_args("SET n = :n", values={":n": 1}),
        )
        a.guard(tx)
    clock.advance(2)
    b = b_side.locks.acquire("order", ttl=10)
    assert b is not None
    b.fenced_update(item.key, {"n": 2})
    with pytest.raises(LockLostError) as lost:
        with a_side.transaction() as tx:
            tx.update(a_side.table_name, item.key, "SET n = :n", values={":n": 3})
            a.guard(tx)
    assert lost.value.holder == b.owner and lost.value.stored_fence == b.fence
    with pytest.raises(FenceRejectedError):
        a.fenced_update(item.key, {"n": 3})
    stored = item.read()
    assert stored is not None and stored["n"] == 2 and stored["fence"] == b.fence
