"""The cache store on the single table.

Item: ``pk=CACHE#{ns}#{key}``, ``sk=CACHE``, ``gsi1pk=CACHE#{ns}#{shard}``, ``gsi1sk={key}``, the
value, and ``expires_at_ms`` + ``ttl`` (epoch seconds, for DynamoDB's sweeper) when it expires.

The value is in exactly one of two attributes:

* ``n`` (number) when the codec text is a plain integer of at most 38 digits (DynamoDB's number
  precision). Keeping integers numeric is what lets ``incr`` be one atomic ``ADD`` instead of a
  read-modify-write; on read, ``n`` is turned back into the codec text of that integer, so the
  cache above never sees the difference and ``get`` returns an ``int``.
* ``v`` (string) with the codec text for every other value (bool, float, str, bytes, Decimal,
  lists, dicts, None, and integers over 38 digits).

An ``ADD`` on an item that has ``v`` is refused by its condition, so ``incr`` on a non-integer
value raises instead of silently creating a second value attribute.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal
from typing import Any

from ... import codec
from ...cache import CacheEntry, KeyPage
from ...errors import InvalidValueError
from ...keys import (
    CACHE_SK,
    MAX_PARTITION_KEY_BYTES,
    MAX_SORT_KEY_BYTES,
    cache_index_pk,
    cache_key,
    cache_pk,
    cache_sort_key,
    shard_of,
)
from ._counting import CountingToken, counting_update
from ._limits import MAX_BATCH_GET_KEYS, MAX_BATCH_WRITES
from ._marshal import exact_sum, marshal, sum_limit, unmarshal, values
from ._table import LIVE, ConditionFailedError, DynamoTable

__all__ = ["DynamoDBCacheStore"]

_CACHE_SK = CACHE_SK
_INT_TEXT = re.compile(r"-?(?:0|[1-9][0-9]{0,37})")


def _check_range(key: str, item: Any, by: int) -> None:
    """Refuse (nothing was written) an incr whose sum DynamoDB could only store rounded."""
    n = (item or {}).get("n")
    if n is not None and not exact_sum(int(n), by):
        raise InvalidValueError(
            f"incr of cache key {key!r} by {by} would leave DynamoDB's 38 significant digits; "
            "nothing was written"
        )


@functools.lru_cache(maxsize=256)
def _incr_variant(with_expiry: bool, by: int) -> tuple[str, str, str | None]:
    """The condition and update of :meth:`DynamoDBCacheStore.incr`, and its ``:lim`` (None for
    ``by == 0``): callers add the same few amounts, so each variant is built once."""
    sets = ["gsi1pk = :gpk", "gsi1sk = :gsk"]
    if with_expiry:
        # if_not_exists keeps a live counter's own expiry. A live counter without one must stay
        # without one, so it is left out here and takes the plain ADD of _add_to_live.
        live = "expires_at_ms > :now"
        sets.append("expires_at_ms = if_not_exists(expires_at_ms, :exp)")
        sets.append("#ttl = if_not_exists(#ttl, :ttl)")
    else:
        live = LIVE
    in_range, bounds = sum_limit("n", by)
    condition = f"(attribute_not_exists(pk) OR (attribute_exists(n) AND {live})){in_range}"
    update = f"SET {', '.join(sets)} ADD n :by"
    return condition, update, str(bounds["lim"]) if bounds else None


def _entry(raw: dict[str, Any], now_ms: int) -> CacheEntry | None:
    """The live entry of a stored item as DynamoDB returns it (attribute values, not unmarshalled:
    an entry needs three of them), or None if it has expired."""
    exp = raw.get("expires_at_ms")
    expires = int(exp["N"]) if exp is not None else None
    if expires is not None and expires <= now_ms:
        return None
    number = raw.get("n")
    if number is not None:
        return CacheEntry(str(int(Decimal(number["N"]))), expires)
    return CacheEntry(raw["v"]["S"] if "v" in raw else "null", expires)


class DynamoDBCacheStore:
    max_batch_get = MAX_BATCH_GET_KEYS
    max_batch_write = MAX_BATCH_WRITES

    def __init__(self, table: DynamoTable, namespace: str, *, shards: int = 1) -> None:
        self._table = table
        self._ns = namespace
        self.partitions = shards
        # the gsi1 partition of each shard, built once (the namespace was checked by the backend)
        self._index_pks = tuple(cache_index_pk(namespace, shard) for shard in range(shards))
        # what cache_pk puts before the key (taken from it, so the two cannot differ)
        self._pk_prefix = cache_pk(namespace, "k")[:-1]

    # -- item layout ----------------------------------------------------------------------------
    #
    # Keys arrive validated by the Cache (non-empty str): what is left to check is whether the
    # table can hold them. The stored key is built from the namespace's prefix; only a key that
    # is not ASCII or may be too long takes the full checks of dynacoord.keys (and their errors).

    def _primary(self, key: str) -> dict[str, Any]:
        """The ``Key`` of a read, delete or touch of ``key`` (checked as pk only)."""
        pk = self._pk_prefix + key
        if not (pk.isascii() and len(pk) <= MAX_PARTITION_KEY_BYTES):
            pk = cache_pk(self._ns, key)
        return {"pk": {"S": pk}, "sk": {"S": _CACHE_SK}}

    def _entry_pk(self, key: str) -> str:
        """The pk of ``key`` for a write, which also stores the key as gsi1sk: checked as both."""
        pk = self._pk_prefix + key
        if pk.isascii() and len(pk) <= MAX_PARTITION_KEY_BYTES and len(key) <= MAX_SORT_KEY_BYTES:
            return pk
        pk = cache_pk(self._ns, key)
        cache_sort_key(key)
        return pk

    def _item(self, key: str, encoded: str, expires_at_ms: int | None) -> dict[str, Any]:
        """The entry as a marshalled item (built directly: this is every write's hot path)."""
        item: dict[str, Any] = {
            "pk": {"S": self._entry_pk(key)},
            "sk": {"S": _CACHE_SK},
            "gsi1pk": {"S": self._index_pks[shard_of(key, self.partitions)]},
            "gsi1sk": {"S": key},
        }
        if _INT_TEXT.fullmatch(encoded):
            item["n"] = {"N": str(int(encoded))}
        else:
            item["v"] = {"S": encoded}
        if expires_at_ms is not None:
            item["expires_at_ms"] = {"N": str(expires_at_ms)}
            item["ttl"] = {"N": str(math.ceil(expires_at_ms / 1000))}
        return item

    def check_entry(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        self._entry_pk(key)  # refuses a key the table cannot hold, as pk or as gsi1sk
        # The key is in pk and gsi1sk, the namespace in pk and gsi1pk; at most 4 bytes of UTF-8
        # per character, and the other attributes (names, two numbers, sk) take far less than
        # 256 bytes: an entry within that bound fits and needs no estimate.
        if 4 * (len(encoded) + 2 * (len(key) + len(self._ns))) + 256 <= codec.DYNAMODB_ITEM_LIMIT:
            return
        codec.check_item_size(unmarshal(self._item(key, encoded, expires_at_ms)), key=key)

    # -- single items ---------------------------------------------------------------------------

    def get(self, key: str, now_ms: int, *, consistent: bool = True) -> CacheEntry | None:
        # the table's call itself, not get_raw: a frame less on the hottest read
        raw = self._table.call("get_item", Key=self._primary(key), ConsistentRead=consistent).get(
            "Item"
        )
        return _entry(raw, now_ms) if raw else None

    def set(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        self._table.call("put_item", Item=self._item(key, encoded, expires_at_ms))

    def add(self, key: str, encoded: str, expires_at_ms: int | None, now_ms: int) -> bool:
        return self._table.put_item_if_free(self._item(key, encoded, expires_at_ms), now_ms)

    def create_counter(self, key: str, value: int, expires_at_ms: int | None, now_ms: int) -> bool:
        return self.add(key, str(value), expires_at_ms, now_ms)

    def delete(self, key: str, now_ms: int) -> bool:
        response = self._table.call("delete_item", Key=self._primary(key), ReturnValues="ALL_OLD")
        old = response.get("Attributes")
        if not old:
            return False
        # a live entry was removed (is_live, on the one attribute it reads)
        expires = old.get("expires_at_ms")
        return expires is None or int(Decimal(expires["N"])) > now_ms

    def touch(self, key: str, expires_at_ms: int | None, now_ms: int) -> bool:
        if expires_at_ms is None:
            update = "REMOVE expires_at_ms, #ttl"
            attr_values = values(now=now_ms)
        else:
            update = "SET expires_at_ms = :exp, #ttl = :ttl"
            attr_values = values(now=now_ms, exp=expires_at_ms, ttl=math.ceil(expires_at_ms / 1000))
        try:
            self._table.call(
                "update_item",
                Key=self._primary(key),
                ConditionExpression=f"attribute_exists(pk) AND {LIVE}",
                UpdateExpression=update,
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues=attr_values,
            )
        except ConditionFailedError:
            return False
        return True

    def incr(self, key: str, by: int, now_ms: int, expires_if_new: int | None) -> int | None:
        pk = self._entry_pk(key)  # the one key built for this call (it may create the entry)
        token = CountingToken(now_ms, pk)
        condition, update, lim = _incr_variant(expires_if_new is not None, by)
        attr_values: dict[str, Any] = {
            ":now": {"N": str(now_ms)},
            ":by": {"N": str(by)},
            ":gpk": {"S": self._index_pks[shard_of(key, self.partitions)]},
            ":gsk": {"S": key},
        }
        if expires_if_new is not None:
            attr_values[":exp"] = {"N": str(expires_if_new)}
            attr_values[":ttl"] = {"N": str(math.ceil(expires_if_new / 1000))}
        if lim is not None:
            attr_values[":lim"] = {"N": lim}
        names = {} if expires_if_new is None else {"#ttl": "ttl"}
        try:
            # One request for the common cases: ADD to a live counter, or create an absent key
            # (ADD on a missing number starts from 0).
            response = counting_update(
                self._table,
                token,
                now_ms,
                Key={"pk": {"S": pk}, "sk": {"S": _CACHE_SK}},
                ConditionExpression=condition,
                UpdateExpression=update,
                ExpressionAttributeValues=attr_values,
                # ALL_NEW, not UPDATED_NEW: an ADD of 0 leaves n unchanged, and a store may then
                # leave n out of the updated attributes (moto does). A counter item is small.
                ReturnValues="ALL_NEW",
                ExpressionAttributeNames=names,
            )
        except ConditionFailedError as failed:
            if token.applied(failed.raw):
                # A retry of this very write whose first response was lost: counted once.
                return int((failed.item or {})["n"])
            entry = CacheEntry.from_item(failed.item, now_ms)
            if entry is None:
                return None  # expired: the caller replaces it with a fresh counter
            _check_range(key, failed.item, by)
            if "n" in (failed.item or {}) and expires_if_new is not None:
                return self._add_to_live(key, by, now_ms)  # a live counter without expiry
            raise self._not_an_integer(key) from None
        return int(Decimal(response["Attributes"]["n"]["N"]))

    def _add_to_live(self, key: str, by: int, now_ms: int) -> int | None:
        token = CountingToken(now_ms, self._entry_pk(key))
        attr_values: dict[str, Any] = {"now": now_ms, "by": by}
        in_range, bounds = sum_limit("n", by)
        attr_values.update(bounds)
        try:
            response = counting_update(
                self._table,
                token,
                now_ms,
                Key=self._primary(key),
                # Only a live numeric entry: a string value must not grow an `n`.
                ConditionExpression=f"attribute_exists(n) AND {LIVE}{in_range}",
                UpdateExpression="ADD n :by",
                ExpressionAttributeValues=values(**attr_values),
                ReturnValues="ALL_NEW",  # see incr: n must come back even when by is 0
            )
        except ConditionFailedError as failed:
            if token.applied(failed.raw):
                return int((failed.item or {})["n"])
            if CacheEntry.from_item(failed.item, now_ms) is not None:
                _check_range(key, failed.item, by)
            if CacheEntry.from_item(failed.item, now_ms) is not None:
                raise self._not_an_integer(key) from None
            return None
        return int(unmarshal(response["Attributes"])["n"])

    @staticmethod
    def _not_an_integer(key: str) -> InvalidValueError:
        return InvalidValueError(
            f"cache key {key!r} holds a value that is not an integer: incr needs an int (set it "
            "with an int, or delete it first)"
        )

    # -- listing and batches --------------------------------------------------------------------

    def keys_page(self, partition: int, prefix: str, now_ms: int, cursor: Any) -> KeyPage:
        condition = "gsi1pk = :p"
        attr_values: dict[str, Any] = {":p": cache_index_pk(self._ns, partition)}
        if prefix:
            condition += " AND begins_with(gsi1sk, :prefix)"
            attr_values[":prefix"] = prefix
        kwargs: dict[str, Any] = {
            "IndexName": "gsi1",
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": marshal(attr_values),
            # Only what listing needs; DynamoDB still cuts pages at 1 MB of items read.
            "ProjectionExpression": "gsi1sk, expires_at_ms",
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        page = self._table.call("query", **kwargs)
        live: list[str] = []
        expired: list[str] = []
        for raw in page.get("Items", []):
            item = unmarshal(raw)
            exp = item.get("expires_at_ms")
            (expired if exp is not None and int(exp) <= now_ms else live).append(
                str(item["gsi1sk"])
            )
        return KeyPage(live, expired, page.get("LastEvaluatedKey") or None)

    def get_batch(
        self, keys: list[str], now_ms: int, *, consistent: bool = True
    ) -> tuple[dict[str, tuple[str, int | None]], list[str]]:
        name = self._table.name
        # Plain low-level dicts both ways: this path handles 100 items per request, and boto3's
        # generic (de)serializer would cost more than the request's own parsing.
        prefix = self._pk_prefix
        requested = {prefix + k: k for k in keys}
        # The whole batch checked at once (see _primary); the full check, key by key, otherwise.
        longest = len(prefix) + max(map(len, keys), default=0)
        if longest > MAX_PARTITION_KEY_BYTES or not "".join(requested).isascii():
            requested = {cache_pk(self._ns, k): k for k in keys}
        sk = {"S": _CACHE_SK}  # one value shared by every key of the request (only read)
        response = self._table.call(
            "batch_get_item",
            RequestItems={
                name: {
                    "Keys": [{"pk": {"S": pk}, "sk": sk} for pk in requested],
                    "ConsistentRead": consistent,
                    # Only what an entry needs: less to send, parse and decode.
                    "ProjectionExpression": "pk, v, n, expires_at_ms",
                }
            },
        )
        found: dict[str, tuple[str, int | None]] = {}
        for raw in response.get("Responses", {}).get(name, ()):
            # _entry inlined (a call per item costs as much as the reading itself)
            exp = raw.get("expires_at_ms")
            if exp is None:
                expires = None
            else:
                expires = int(exp["N"])
                if expires <= now_ms:
                    continue
            number = raw.get("n")
            if number is not None:
                encoded = str(int(Decimal(number["N"])))
            else:
                value = raw.get("v")
                encoded = "null" if value is None else value["S"]
            found[requested[raw["pk"]["S"]]] = (encoded, expires)  # a plain tuple: cheapest
        unprocessed = response.get("UnprocessedKeys", {}).get(name, {}).get("Keys", [])
        return found, [requested[k["pk"]["S"]] for k in unprocessed]

    def _batch_write(self, requests: dict[str, dict[str, Any]]) -> list[str]:
        """One BatchWriteItem of ``{pk: request}``; returns the pks left unprocessed."""
        name = self._table.name
        response = self._table.call(
            "batch_write_item", RequestItems={name: list(requests.values())}
        )
        left: list[str] = []
        for request in response.get("UnprocessedItems", {}).get(name, []):
            body = request.get("PutRequest", {}).get("Item") or request["DeleteRequest"]["Key"]
            left.append(str(unmarshal(body)["pk"]))
        return left

    def set_batch(
        self, entries: list[tuple[str, str, int | None]]
    ) -> list[tuple[str, str, int | None]]:
        by_pk: dict[str, tuple[str, str, int | None]] = {}
        requests: dict[str, dict[str, Any]] = {}
        for entry in entries:
            item = self._item(*entry)
            pk = item["pk"]["S"]
            by_pk[pk] = entry
            requests[pk] = {"PutRequest": {"Item": item}}
        return [by_pk[pk] for pk in self._batch_write(requests)]

    def delete_batch(self, keys: list[str]) -> list[str]:
        by_pk: dict[str, str] = {}
        requests: dict[str, dict[str, Any]] = {}
        for key in keys:
            primary = cache_key(self._ns, key).primary
            by_pk[primary["pk"]] = key
            requests[primary["pk"]] = {"DeleteRequest": {"Key": marshal(primary)}}
        return [by_pk[pk] for pk in self._batch_write(requests)]
