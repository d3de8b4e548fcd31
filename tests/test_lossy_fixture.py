"""Self-tests of the ``lossy`` fixture (tests/lossy.py): on every backend the fault really fires, a
lost write was applied and then re-sent by the client's own retry (a plain non-idempotent write
lands twice), reads and refused writes are never lost, and ``count``/``operation`` select what is
lost."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.lossy import Lossy

pytestmark = pytest.mark.integration


def _key() -> str:
    return f"lossy-{uuid.uuid4().hex[:12]}"


class Raw:
    """Plain, non-idempotent wire-level writes and reads on the backend's own (lossy) client."""

    def __init__(self, lossy: Lossy) -> None:
        self.kind = lossy.kind
        self.backend: Any = lossy.backend()

    # the names lose_next(operation=...) takes for each raw call
    @property
    def incr_op(self) -> str:
        return {"dynamodb": "UpdateItem", "redis": "INCRBY", "mongo": "update_one"}[self.kind]

    @property
    def put_op(self) -> str:
        return {"dynamodb": "PutItem", "redis": "SET", "mongo": "insert_one"}[self.kind]

    def incr(self, key: str, by: int = 1) -> Any:
        b = self.backend
        if self.kind == "dynamodb":
            return b.client.update_item(
                TableName=b.table_name,
                Key={"pk": {"S": key}, "sk": {"S": "RAW"}},
                UpdateExpression="ADD n :by",
                ExpressionAttributeValues={":by": {"N": str(by)}},
            )
        if self.kind == "redis":
            return b.client.incrby(key, by)
        return b.database["dynacoord"].update_one(
            {"pk": key, "sk": "RAW"}, {"$inc": {"n": by}}, upsert=True
        )

    def get(self, key: str) -> int | None:
        b = self.backend
        if self.kind == "dynamodb":
            item = b.client.get_item(
                TableName=b.table_name,
                Key={"pk": {"S": key}, "sk": {"S": "RAW"}},
                ConsistentRead=True,
            ).get("Item")
            return None if item is None else int(item["n"]["N"])
        if self.kind == "redis":
            raw = b.client.get(key)
            return None if raw is None else int(raw)
        doc = b.database["dynacoord"].find_one({"pk": key, "sk": "RAW"})
        return None if doc is None else int(doc["n"])

    def put_if_absent(self, key: str, value: int) -> bool:
        """A conditional create: True when written, False when refused (exists)."""
        b = self.backend
        if self.kind == "dynamodb":
            try:
                b.client.put_item(
                    TableName=b.table_name,
                    Item={"pk": {"S": key}, "sk": {"S": "RAW"}, "n": {"N": str(value)}},
                    ConditionExpression="attribute_not_exists(pk)",
                )
            except b.client.exceptions.ConditionalCheckFailedException:
                return False
            return True
        if self.kind == "redis":
            return bool(b.client.set(key, value, nx=True))
        from pymongo.errors import DuplicateKeyError

        b.ensure_indexes()
        try:
            b.database["dynacoord"].insert_one({"pk": key, "sk": "RAW", "n": value})
        except DuplicateKeyError:
            return False
        return True


@pytest.fixture()
def raw(lossy: Lossy) -> Raw:
    return Raw(lossy)


def test_a_lost_write_was_applied_and_sent_again(lossy, raw):
    key = _key()
    raw.incr(key)
    lossy.lose_next()
    raw.incr(key)
    assert lossy.lost == 1, "the fault must have fired"
    assert raw.get(key) == 3, "the lost increment was applied, then re-sent by the retry: +2"
    raw.incr(key)
    assert raw.get(key) == 4, "one lost response only"
    assert lossy.lost == 1


def test_count_loses_distinct_requests_and_never_the_retry(lossy, raw):
    a, b = _key(), _key()
    lossy.lose_next(2)
    raw.incr(a)
    raw.incr(b)
    raw.incr(b)
    assert lossy.lost == 2
    assert (raw.get(a), raw.get(b)) == (2, 3), "each lost write applied twice, its retry not lost"


def test_reads_never_lose_their_response(lossy, raw):
    key = _key()
    raw.incr(key, 5)
    lossy.lose_next()
    assert raw.get(key) == 5
    assert raw.get(key) == 5
    assert lossy.lost == 0, "a read must not take the fault"
    raw.incr(key)
    assert lossy.lost == 1 and raw.get(key) == 7


def test_operation_selects_which_write_loses_its_response(lossy, raw):
    counted, created = _key(), _key()
    lossy.lose_next(operation=raw.put_op)
    raw.incr(counted)
    assert lossy.lost == 0 and raw.get(counted) == 1, "another operation is not lost"
    # A naive conditional create whose response is lost hears its own retry refused: the bug
    # the primitives must not have, shown here on the raw wire to prove the replay.
    assert raw.put_if_absent(created, 7) is False
    assert lossy.lost == 1
    assert raw.get(created) == 7
    raw.incr(counted)
    assert raw.get(counted) == 2


def test_a_refused_write_is_answered_and_leaves_the_fault_armed(lossy, raw):
    taken, free = _key(), _key()
    assert raw.put_if_absent(taken, 1) is True
    lossy.lose_next(operation=raw.put_op)
    assert raw.put_if_absent(taken, 2) is False, "the refusal itself reaches the caller"
    # Redis SET NX answers a refusal with a nil reply (not an error): that reply can be lost.
    expected_lost = 1 if lossy.kind == "redis" else 0
    assert lossy.lost == expected_lost
    if expected_lost == 0:
        raw.put_if_absent(free, 3)
        assert lossy.lost == 1, "the fault stayed armed for the next matching write"
    assert raw.get(taken) == 1


def test_lose_next_refuses_a_bad_count(lossy):
    with pytest.raises(ValueError):
        lossy.lose_next(0)


def test_backend_is_fresh_and_wired_through_the_lossy_client(lossy):
    a, b = lossy.backend(), lossy.backend()
    assert a.namespace != b.namespace
    assert lossy.backend(namespace="fixed").namespace == "fixed"
    counters = a.counters
    lossy.lose_next()
    counters.set_if_absent(_key(), 1)
    assert lossy.lost == 1, "the primitives' writes go through the lossy client"


# -- per-backend details --------------------------------------------------------------------------


@pytest.mark.parametrize("lossy", ["redis"], indirect=True)
def test_redis_script_and_transaction_replies_are_lost_after_they_ran(lossy):
    client = lossy.backend().client
    key = _key()
    script = client.register_script("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    script(keys=[key], args=[1])  # loads the script (NOSCRIPT, SCRIPT LOAD, EVALSHA)
    lossy.lose_next(operation="EVALSHA")
    assert script(keys=[key], args=[1]) == 3, "EVALSHA is a write: run twice"
    assert lossy.lost == 1

    lossy.lose_next(operation="EXEC")
    pipe = client.pipeline(transaction=True)
    pipe.incrby(key, 10)
    pipe.get(key)
    assert pipe.execute() == [23, b"23"], "the MULTI/EXEC block ran twice"
    assert lossy.lost == 2 and int(client.get(key)) == 23

    lossy.lose_next()
    assert client.get(key) == b"23" and client.pttl(key) == -1 and client.exists(key) == 1
    assert lossy.lost == 2, "reads are never lost"


@pytest.mark.parametrize("lossy", ["mongo"], indirect=True)
def test_mongo_find_one_and_update_returns_the_retry_result(lossy):
    from pymongo import ReturnDocument

    coll = lossy.backend().database["dynacoord"]
    key = _key()
    lossy.lose_next(operation="find_one_and_update")
    doc = coll.find_one_and_update(
        {"pk": key, "sk": "RAW"},
        {"$inc": {"n": 1}},
        upsert=True,
        return_document=ReturnDocument.AFTER,
    )
    assert lossy.lost == 1 and doc["n"] == 2, "the caller sees the second (retried) call's answer"


# -- the serialized mongomock of tests/backends_fixtures.py ---------------------------------------


def test_serialized_mongomock_makes_each_call_atomic_across_threads(mongo_database):
    import threading

    from pymongo import ReturnDocument

    coll = mongo_database["serialized_selftest"]
    key = _key()
    seen: list[int] = []

    def bump() -> None:
        for _ in range(100):
            doc = coll.find_one_and_update(
                {"pk": key}, {"$inc": {"n": 1}}, upsert=True, return_document=ReturnDocument.AFTER
            )
            seen.append(doc["n"])

    threads = [threading.Thread(target=bump) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert coll.find_one({"pk": key})["n"] == 800
    assert sorted(seen) == list(range(1, 801)), "every call saw its own, distinct result"


def test_serialized_mongomock_find_chains_and_reads_under_the_lock(mongo_database):
    coll = mongo_database["serialized_selftest"]
    group = _key()
    coll.insert_many([{"g": group, "i": i} for i in range(10)])
    cursor = coll.find({"g": group}, {"_id": 0, "i": 1}).sort("i", -1).skip(2).limit(3)
    assert [d["i"] for d in cursor] == [7, 6, 5]
    assert next(iter(coll.find({"g": group}).sort("i", 1)))["i"] == 0
    assert coll.count_documents({"g": group}) == 10
