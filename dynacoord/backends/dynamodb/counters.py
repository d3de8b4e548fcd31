"""The counter / flag / join store on the single table.

Item: ``pk=COUNTER#{ns}#{key}``, ``sk=COUNTER``, ``kind`` (counter | flag | join), and

* counter: ``n`` (number)
* flag: ``value`` (codec-encoded JSON text)
* join: ``n`` (count of distinct members), ``expected``, ``last`` (the member that completed it),
  ``gen`` (the join's generation, a token made when it is created) and ``c{b}`` (how many
  members bucket ``b`` held when its count was last carried here); the members live in bucket
  items beside it (below).

**Joins at a constant cost.** An arrival writes two small items instead of rewriting one that
grows with the members (one string set of every member would cost up to ~250 WCU for the last
arrivals of a 2,000-member join):

1. its bucket, ``sk=JOIN#{gen}#{b}`` with ``b = crc32(member) % buckets`` (``buckets`` from
   ``expected``, at most :data:`_MAX_BUCKETS`): ``ADD members :m, n :1`` unless the member is in
   it (a redelivery, or a retry of this write whose answer was lost, changes nothing and reads
   the bucket's count);
2. the join item: ``SET c{b} = :nb ADD n :d`` on the condition ``c{b} = :old`` (``d = nb - old``):
   it carries the bucket's count up, never down, so carrying it again (a retry, a redelivery, a
   crash between the two writes repaired by the redelivery) changes nothing, and a count carried
   by another arrival of the same bucket first makes this one a no-op. ``n`` is therefore the
   sum of the buckets' counts carried so far: each member counted once.

The write that takes ``n`` to ``expected`` or past it is unique (each write moves ``n`` up
atomically from the value it read); only writes made while ``n < expected`` set ``last``, so
``last`` names the completer. Every arrival first needs the join's ``gen`` (a process keeps it
once read: one eventually consistent GetItem per process and join), and the first arrival
creates the join item. Buckets take the join's expiry; a join that expired starts again with a
new ``gen``, so its old buckets are never read again (the TTL sweeper removes them).

plus ``expires_at_ms`` and ``ttl`` when the item expires. Every condition treats an item with
``expires_at_ms <= :now`` as absent; an item without ``expires_at_ms`` never expires.
"""

from __future__ import annotations

import functools
import math
import os
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import codec
from ..._table_state import MAX_REMEMBERED
from ...counters import (
    COUNTER,
    FLAG,
    JOIN,
    MAX_COUNTER_VALUE,
    CounterItem,
    WriteOutcome,
    _counter_item,
    _write_outcome,
    value_fields,
)
from ...errors import BackendError
from ...keys import COUNTER_SK, counter_pk
from ._counting import CountingToken, counting_update
from ._limits import MAX_BATCH_WRITES
from ._marshal import exact_sum, marshal, sum_limit, unmarshal
from ._table import FREE, LIVE, REQUEST_TOKEN, ConditionFailedError, DynamoTable

__all__ = ["DynamoDBCounterStore"]

_NAMES = {
    "#kind": "kind",
    "#n": "n",
    "#value": "value",
    "#expected": "expected",
    "#last": "last",
    "#ttl": "ttl",
}

#: live or absent: the condition of every write that updates a live item in place
_LIVE_OR_ABSENT = f"attribute_not_exists(pk) OR (#kind = :kind AND {LIVE})"
#: the SET part that gives an expiry to an item that has none yet: a live item keeps its own
#: (fixed windows)
_KEEP_EXPIRY = (
    ", expires_at_ms = if_not_exists(expires_at_ms, :exp), #ttl = if_not_exists(#ttl, :ttl)"
)
_JOIN_LIVE = "#kind = :kind AND #expected = :expected AND " + LIVE
_EXTEND_CONDITION = f"attribute_exists(pk) AND {LIVE}"
#: a counter or a flag (anything but a join) is deleted in place, keeping its counting slots
_DELETE_IN_PLACE = "attribute_exists(pk) AND (attribute_not_exists(#kind) OR #kind <> :join)"


@dataclass(frozen=True, slots=True)
class _Write:
    """The expressions of one variant of a write and the placeholders they use (DynamoDB refuses
    unused ones): built once per variant, not on every call."""

    update: str
    condition: str
    #: the names of :data:`_NAMES` the expressions use
    names: dict[str, str]


def _write(update: str, condition: str) -> _Write:
    text = update + " " + condition
    return _Write(
        update,
        condition,
        {k: v for k, v in _NAMES.items() if k in text},
    )


@functools.cache
def _add_write(with_ttl: bool, in_range: str) -> _Write:
    """:meth:`DynamoDBCounterStore.add`: ``in_range`` is the condition part of ``sum_limit``."""
    sets = "SET #kind = :kind" + (_KEEP_EXPIRY if with_ttl else "")
    return _write(
        f"{sets} ADD #n :by",
        f"({_LIVE_OR_ABSENT}){in_range}",
    )


@functools.lru_cache(maxsize=256)
def _add_variant(with_ttl: bool, by: int) -> tuple[_Write, str | None]:
    """The write of an add of ``by`` and its ``:lim`` (None for ``by == 0``): callers add the
    same few amounts, so sum_limit runs once per amount."""
    in_range, bounds = sum_limit("#n", by)
    return _add_write(with_ttl, in_range), (str(bounds["lim"]) if bounds else None)


@functools.cache
def _replacing(sets: str, removes: str, with_ttl: bool) -> _Write:
    """A write that replaces an absent or expired item (condition FREE): ``sets`` and
    ``removes`` plus the new expiry, or without a TTL the removal of the old one."""
    if not with_ttl:
        return _write(f"{sets} {removes}, expires_at_ms, #ttl", FREE)
    return _write(f"{sets}, expires_at_ms = :exp, #ttl = :ttl {removes}", FREE)


def _restart_write(with_ttl: bool) -> _Write:
    return _replacing(
        "SET #kind = :kind, #n = :by",
        "REMOVE #value, #expected",
        with_ttl,
    )


def _ttl_s(expires_at_ms: int) -> int:
    return math.ceil(expires_at_ms / 1000)


def _expiry_values(values: dict[str, Any], ttl_ms: int, now_ms: int) -> dict[str, Any]:
    """``values`` (already marshalled) with the ``:exp`` and ``:ttl`` of an expiry ``ttl_ms``
    from now."""
    expires = now_ms + ttl_ms
    values[":exp"] = {"N": str(expires)}
    values[":ttl"] = {"N": str(_ttl_s(expires))}
    return values


def _read(raw: Mapping[str, Any] | None, now_ms: int) -> CounterItem | None:
    """``CounterItem.from_item(unmarshal(raw), now_ms)`` read straight from the attribute values.

    Every write stores the attribute types read here; an item with another type (or a number
    that is not a plain integer) raises KeyError or ValueError on the way and takes the
    unmarshal path, so the result is the same (a flag whose value does not decode raises its
    error again there).
    """
    if not raw:
        return None
    try:
        av = raw.get("expires_at_ms")
        expires_at_ms = None
        if av is not None:
            expires_at_ms = int(av["N"])
            if expires_at_ms <= now_ms:
                return None
        av = raw.get("kind")
        kind = COUNTER if av is None else av["S"]
        if kind == FLAG:
            return _counter_item(kind, codec.decode(raw["value"]["S"]), expires_at_ms)
        av = raw.get("n")
        n = 0 if av is None else int(av["N"])
        if kind == COUNTER:
            return _counter_item(kind, n, expires_at_ms)
        if kind == JOIN:
            # its members are in its buckets (read by get() when asked for)
            last = raw.get("last")
            return _counter_item(
                kind,
                n,
                expires_at_ms,
                int(raw["expected"]["N"]),
                frozenset(),
                None if last is None else last["S"],
            )
    except (KeyError, ValueError):
        pass
    return CounterItem.from_item(unmarshal(raw), now_ms)  # an unusual item


#: a join's members are spread over at most this many bucket items (about 16 members each up
#: to 2,560 members; more per bucket past that): the join item holds one small count per bucket
_MAX_BUCKETS = 160
_MEMBERS_PER_BUCKET = 16
_JOIN_ROUNDS = 8
#: (gen, expected, expires_at_ms) of a join, as this process knows it: kept per table session
#: (``TableState.join_gens``) by the join's pk; a stale one is found out by the join item's
#: condition on ``gen``
_Gen = tuple[str, int, int | None]


def join_buckets(expected: int) -> int:
    """How many bucket items a join waiting for ``expected`` members spreads them over."""
    return max(1, min(-(-expected // _MEMBERS_PER_BUCKET), _MAX_BUCKETS))


def _bucket_sk(gen: str, bucket: int) -> str:
    return f"JOIN#{gen}#{bucket:03d}"


def _bucket_of(member: str, buckets: int) -> int:
    return zlib.crc32(member.encode("utf-8")) % buckets


def _remember_gen(gens: dict[str, _Gen], pk: str, known: _Gen) -> None:
    if len(gens) >= MAX_REMEMBERED:
        gens.clear()
    gens[pk] = known


def _join_item(pk: str, gen: str, expected: int, ttl_ms: int | None, now_ms: int) -> dict[str, Any]:
    """A new join item of generation ``gen`` (no member carried yet)."""
    item: dict[str, Any] = {
        "pk": pk,
        "sk": COUNTER_SK,
        "kind": JOIN,
        "expected": expected,
        "n": 0,
        "gen": gen,
    }
    if ttl_ms is not None:
        item["expires_at_ms"] = now_ms + ttl_ms
        item["ttl"] = _ttl_s(now_ms + ttl_ms)
    return item


class DynamoDBCounterStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _pk(self, key: str) -> str:
        return counter_pk(self._ns, key)

    def _key(self, key: str) -> dict[str, Any]:
        # primary()'s dict, without its call
        return {"pk": {"S": counter_pk(self._ns, key)}, "sk": {"S": COUNTER_SK}}

    def _update(
        self,
        key: str,
        write: _Write,
        values: dict[str, Any],
        now_ms: int,
        token: CountingToken | None = None,
    ) -> WriteOutcome:
        """Send ``write`` with ``values`` (marshalled), counted by ``token`` if given."""
        kwargs: dict[str, Any] = {
            "Key": self._key(key),
            "UpdateExpression": write.update,
            "ConditionExpression": write.condition,
            # a copy: no request holds the cached variant's dict
            "ExpressionAttributeNames": dict(write.names),
            "ExpressionAttributeValues": values,
            "ReturnValues": "ALL_NEW",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        try:
            if token is None:
                response = self._table.call("update_item", **kwargs)
            else:
                response = counting_update(self._table, token, now_ms, **kwargs)
        except ConditionFailedError as failed:
            # the item read from its attribute values (a refused join arrival, a redelivery,
            # is a hot path), as from_item reads failed.item
            if token is not None and token.applied(failed.raw):
                # A retry of this very write whose first response was lost: it applied once.
                return _write_outcome(True, _read(failed.raw, now_ms))
            return _write_outcome(False, None, _read(failed.raw, now_ms))
        return _write_outcome(True, _read(response["Attributes"], now_ms))

    # -- counters --------------------------------------------------------------------------------

    def add(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        # A live counter keeps its expiry (fixed windows); only one without an expiry gets it.
        # DynamoDB would store a sum past 38 digits rounded: refuse it in the condition instead.
        write, lim = _add_variant(ttl_ms is not None, by)
        values = {":kind": {"S": COUNTER}, ":by": {"N": str(by)}, ":now": {"N": str(now_ms)}}
        if lim is not None:
            values[":lim"] = {"N": lim}
        if ttl_ms is not None:
            _expiry_values(values, ttl_ms, now_ms)
        token = CountingToken(now_ms, self._pk(key))
        outcome = self._update(key, write, values, now_ms, token)
        current = outcome.current
        if (
            not outcome.ok
            and current is not None
            and current.kind == COUNTER
            and not exact_sum(int(current.value), by)
        ):
            return _write_outcome(False, None, current, MAX_COUNTER_VALUE)
        return outcome

    def restart(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        values = {":kind": {"S": COUNTER}, ":by": {"N": str(by)}, ":now": {"N": str(now_ms)}}
        if ttl_ms is not None:
            _expiry_values(values, ttl_ms, now_ms)
        # The expired item keeps its slots (a retry across the expiry must find its own), so
        # the restart drops the stale ones the refused add saw, as any counting write does
        # (issue 49: else one-shot writers' slots outlive every restart).
        token = CountingToken(now_ms, self._pk(key))
        return self._update(key, _restart_write(ttl_ms is not None), values, now_ms, token)

    def put_if_absent(
        self,
        key: str,
        kind: str,
        value: Any,
        ttl_ms: int | None,
        now_ms: int,
        token: str | None = None,
    ) -> bool:
        item: dict[str, Any] = {
            "pk": counter_pk(self._ns, key),
            "sk": COUNTER_SK,
            **value_fields(kind, value),
        }
        if ttl_ms is not None:
            expires = now_ms + ttl_ms
            item["expires_at_ms"] = expires
            item["ttl"] = _ttl_s(expires)
        if token is None:
            return self._table.put_if_free(item, now_ms)
        # The caller's token (kept across its attempts when a call raised): a refusal by the
        # item that carries it is this caller's write, applied; botocore's own retry too.
        raw = marshal(item)
        raw[REQUEST_TOKEN] = {"S": token}
        try:
            self._table.put_free(raw, now_ms)
        except ConditionFailedError as failed:
            return failed.raw is not None and failed.raw.get(REQUEST_TOKEN) == {"S": token}
        return True

    def get(self, key: str, now_ms: int) -> CounterItem | None:
        raw = self._table.get_raw(self._key(key))
        item = _read(raw, now_ms)
        if item is not None and item.kind == JOIN and raw is not None and "gen" in raw:
            # a join's members live in its buckets: one Query (per MB) lists them
            members = frozenset(
                m
                for bucket in self._buckets(key, raw["gen"]["S"], "members")
                for m in bucket.get("members", {}).get("SS", ())
            )
            return _counter_item(
                JOIN, item.value, item.expires_at_ms, item.expected, members, item.last_member
            )
        return item

    def _buckets(self, key: str, gen: str, projection: str) -> list[dict[str, Any]]:
        """Every bucket item of the join ``key``'s generation ``gen`` (attribute values)."""
        found: list[dict[str, Any]] = []
        for page in self._table.query_pages(
            KeyConditionExpression="pk = :pk AND begins_with(sk, :prefix)",
            ExpressionAttributeValues={
                ":pk": {"S": counter_pk(self._ns, key)},
                ":prefix": {"S": f"JOIN#{gen}#"},
            },
            ProjectionExpression=f"pk, sk, {projection}",
            ConsistentRead=True,
        ):
            found.extend(page.get("Items", ()))
        return found

    def delete(self, key: str, now_ms: int) -> bool:
        """A counter or a flag is deleted *in place*: its value goes and it expires now, but the
        item keeps its counting slots until the TTL sweeper removes it (two retry windows
        later), so an increment applied before the delete and retried after it finds its token
        and is not applied again (the timeline: dynacoord._writers). Every read and write
        already treats the expired item as absent. A join (no slots: its arrivals are not
        counting writes) is deleted with its buckets. One request; two for a join."""
        expires = now_ms + 2 * self._table.count_window_ms
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(key),
                ConditionExpression=_DELETE_IN_PLACE,
                UpdateExpression=(
                    "SET expires_at_ms = :now, #ttl = :ttl REMOVE #n, #value, #last, gen"
                ),
                ExpressionAttributeNames={
                    "#kind": "kind",
                    "#n": "n",
                    "#value": "value",
                    "#last": "last",
                    "#ttl": "ttl",
                },
                ExpressionAttributeValues={
                    ":now": {"N": str(now_ms)},
                    ":ttl": {"N": str(_ttl_s(expires))},
                    ":join": {"S": JOIN},
                },
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            if failed.raw is None:
                return False  # nothing there
            return self._delete_item(key, now_ms)  # a join
        return _read(response.get("Attributes"), now_ms) is not None

    def _delete_item(self, key: str, now_ms: int) -> bool:
        response = self._table.call("delete_item", Key=self._key(key), ReturnValues="ALL_OLD")
        old = response.get("Attributes")
        if old and "gen" in old:
            # a join's buckets go with it (one Query, a batch delete per 25)
            keys = [
                {"DeleteRequest": {"Key": {"pk": b["pk"], "sk": b["sk"]}}}
                for b in self._buckets(key, old["gen"]["S"], "n")
            ]
            for i in range(0, len(keys), MAX_BATCH_WRITES):
                pending: list[dict[str, Any]] = keys[i : i + MAX_BATCH_WRITES]
                for _ in range(10):
                    left = self._table.call(
                        "batch_write_item", RequestItems={self._table.name: pending}
                    ).get("UnprocessedItems", {})
                    pending = left.get(self._table.name, [])
                    if not pending:
                        break
            self._table.state.join_gens.pop(counter_pk(self._ns, key), None)
        return _read(old, now_ms) is not None

    def extend(self, key: str, ttl_ms: int, now_ms: int) -> bool:
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(key),
                ConditionExpression=_EXTEND_CONDITION,
                UpdateExpression="SET expires_at_ms = :exp, #ttl = :ttl",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues=_expiry_values(
                    {":now": {"N": str(now_ms)}}, ttl_ms, now_ms
                ),
                ReturnValues="ALL_NEW",
            )
        except ConditionFailedError:
            return False
        new = response.get("Attributes", {})
        if "gen" in new:
            # a join's buckets take its new expiry (one write each): the TTL sweeper must not
            # remove them before the join item
            expires = now_ms + ttl_ms
            for bucket in self._buckets(key, new["gen"]["S"], "n"):
                self._table.call(
                    "update_item",
                    Key={"pk": bucket["pk"], "sk": bucket["sk"]},
                    UpdateExpression="SET expires_at_ms = :exp, #ttl = :ttl",
                    ExpressionAttributeNames={"#ttl": "ttl"},
                    ExpressionAttributeValues={
                        ":exp": {"N": str(expires)},
                        ":ttl": {"N": str(_ttl_s(expires))},
                    },
                )
            pk = counter_pk(self._ns, key)
            known = self._table.state.join_gens.get(pk)
            if known is not None:
                _remember_gen(self._table.state.join_gens, pk, (known[0], known[1], expires))
        return True

    # -- joins -------------------------------------------------------------------------------------

    def join_add(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        """One arrival (see the module docstring): the bucket write and the carry to the join
        item, after learning the join's generation (a read, once per process and join) and
        creating the join item if there is none (once per join)."""
        pk = counter_pk(self._ns, key)
        for _ in range(_JOIN_ROUNDS):
            known = self._table.state.join_gens.get(pk)
            if known is None or known[1] != expected:
                head = self._join_head(key, pk, expected, ttl_ms, now_ms)
                if isinstance(head, WriteOutcome):
                    return head
                known = head
            gen, _, expires = known
            if expires is not None and expires <= now_ms:
                self._table.state.join_gens.pop(pk, None)
                continue
            bucket = _bucket_of(member, join_buckets(expected))
            count = self._bucket_add(pk, gen, bucket, member, expires, now_ms)
            outcome = self._carry(key, gen, bucket, count, member, expected, now_ms)
            if outcome is not None:
                return outcome
            # the join ended or started again: _carry left what it learnt in the session
        raise BackendError(  # pragma: no cover - needs the join to restart on every round
            f"join {key!r} kept changing generation while joined ({_JOIN_ROUNDS} attempts)"
        )

    def _join_head(
        self, key: str, pk: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> tuple[str, int, int | None] | WriteOutcome:
        """The join's (gen, expected, expires_at_ms), creating the join item when there is no
        live one; or the refusal (another kind, another ``expected``) as a WriteOutcome for the
        caller."""
        raw = self._table.get_raw(self._key(key), consistent=False)
        for _ in range(_JOIN_ROUNDS):
            current = _read(raw, now_ms)
            if current is not None:
                if current.kind != JOIN or current.expected != expected:
                    return _write_outcome(False, None, current)
                known = (raw["gen"]["S"], expected, current.expires_at_ms)  # type: ignore[index]
                _remember_gen(self._table.state.join_gens, pk, known)
                return known
            gen = os.urandom(6).hex()
            item = _join_item(pk, gen, expected, ttl_ms, now_ms)
            try:
                self._table.put_free(marshal(item), now_ms)
            except ConditionFailedError as failed:
                # another arrival created it first (join that one), or this very put applied
                # and its answer was lost (the item shows its token: the same join)
                raw = failed.raw
                continue
            known = (gen, expected, item.get("expires_at_ms"))
            _remember_gen(self._table.state.join_gens, pk, known)
            return known
        raise BackendError(  # pragma: no cover
            f"join {key!r} kept expiring while being created ({_JOIN_ROUNDS} attempts)"
        )

    def _bucket_add(
        self, pk: str, gen: str, bucket: int, member: str, expires: int | None, now_ms: int
    ) -> int:
        """Add ``member`` to its bucket; the bucket's count after it (or, when the member was
        in it already, the count as it is)."""
        update = "ADD #members :mset, #n :one"
        values: dict[str, Any] = {
            ":mset": {"SS": [member]},
            ":member": {"S": member},
            ":one": {"N": "1"},
        }
        names = {"#members": "members", "#n": "n"}
        if expires is not None:
            update = "SET expires_at_ms = :exp, #ttl = :ttl " + update
            values[":exp"] = {"N": str(expires)}
            values[":ttl"] = {"N": str(_ttl_s(expires))}
            names["#ttl"] = "ttl"
        try:
            response = self._table.call(
                "update_item",
                Key={"pk": {"S": pk}, "sk": {"S": _bucket_sk(gen, bucket)}},
                UpdateExpression=update,
                ConditionExpression="attribute_not_exists(#members) OR NOT contains(#members, :member)",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ReturnValues="UPDATED_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            # arrived before (a redelivery, or this write retried after its answer was lost)
            return int((failed.raw or {}).get("n", {}).get("N", "0"))
        return int(response["Attributes"]["n"]["N"])

    def _carry(
        self,
        key: str,
        gen: str,
        bucket: int,
        count: int,
        member: str,
        expected: int,
        now_ms: int,
    ) -> WriteOutcome | None:
        """Carry the bucket's ``count`` up to the join item (see the module docstring); the
        join as it is after, or None when the join item is not this generation's any more."""
        slot = f"c{bucket}"
        old = count - 1  # the usual case: this arrival's own member is the only one not carried
        before_complete = True
        for _ in range(_JOIN_ROUNDS + count):
            names = {"#n": "n", "#c": slot, "#gen": "gen", "#kind": "kind"}
            values: dict[str, Any] = {
                ":join": {"S": JOIN},
                ":gen": {"S": gen},
                ":count": {"N": str(count)},
                ":d": {"N": str(count - old)},
                ":now": {"N": str(now_ms)},
            }
            # The kind too: a counter restarted over an expired join keeps its gen attribute,
            # and a process may still know that join as live (its expiry was shortened).
            condition = f"#kind = :join AND #gen = :gen AND {LIVE} AND "
            if old == 0:
                condition += "attribute_not_exists(#c)"
            else:
                condition += "#c = :old"
                values[":old"] = {"N": str(old)}
            if before_complete:
                # only a write made while the join is incomplete names itself the completer
                condition += " AND #n < :expected"
                values[":expected"] = {"N": str(expected)}
                values[":member"] = {"S": member}
                names["#last"] = "last"
                update = "SET #c = :count, #last = :member ADD #n :d"
            else:
                update = "SET #c = :count ADD #n :d"
            try:
                response = self._table.call(
                    "update_item",
                    Key=self._key(key),
                    UpdateExpression=update,
                    ConditionExpression=condition,
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues=values,
                    ReturnValues="ALL_NEW",
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ConditionFailedError as failed:
                raw = failed.raw
                current = _read(raw, now_ms)
                if (
                    raw is None
                    or current is None
                    or current.kind != JOIN
                    or raw.get("gen") != {"S": gen}
                ):
                    # absent, expired or started again: the next round joins what is there,
                    # known from this refusal when it is a live join (no stale read again)
                    pk = counter_pk(self._ns, key)
                    gens = self._table.state.join_gens
                    gens.pop(pk, None)
                    if (
                        raw is not None
                        and current is not None
                        and current.kind == JOIN
                        and current.expected == expected
                        and "gen" in raw
                    ):
                        _remember_gen(gens, pk, (raw["gen"]["S"], expected, current.expires_at_ms))
                    return None
                carried = int(raw.get(slot, {}).get("N", "0"))
                if carried >= count:
                    # carried already: by this write (its answer lost), by another arrival of
                    # the same bucket, or by an earlier delivery of this member
                    return _write_outcome(True, _read(raw, now_ms))
                if carried != old:
                    old = carried  # members of the bucket not carried yet: carry them too
                    continue
                before_complete = False  # complete: carry without naming a completer
                continue
            return _write_outcome(True, _read(response["Attributes"], now_ms))
        raise BackendError(  # pragma: no cover - every refusal moves old up or ends the loop
            f"join {key!r}: could not carry bucket {bucket}"
        )

    def join_restart(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        """A new join holding ``member`` in place of an absent or expired item: a join item of a
        new generation, then the arrival. :meth:`join_add` starts a new generation itself, so
        the counters' policy never needs this here; a live item (another arrival started the
        join first) is the refusal, and the policy joins it."""
        pk = counter_pk(self._ns, key)
        gen = os.urandom(6).hex()
        known = (gen, expected, None if ttl_ms is None else now_ms + ttl_ms)
        try:
            self._table.put_free(marshal(_join_item(pk, gen, expected, ttl_ms, now_ms)), now_ms)
        except ConditionFailedError as failed:
            return _write_outcome(False, None, _read(failed.raw, now_ms))
        _remember_gen(self._table.state.join_gens, pk, known)
        bucket = _bucket_of(member, join_buckets(expected))
        count = self._bucket_add(pk, gen, bucket, member, known[2], now_ms)
        outcome = self._carry(key, gen, bucket, count, member, expected, now_ms)
        return outcome or self.join_add(key, member, expected, ttl_ms, now_ms)
