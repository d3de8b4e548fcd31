"""The counter / flag / join store on the single table.

Item: ``pk=COUNTER#{ns}#{key}``, ``sk=COUNTER``, ``kind`` (counter | flag | join), and

* counter: ``n`` (number)
* flag: ``value`` (codec-encoded JSON text)
* join: ``n`` (count of distinct members), ``members`` (string set), ``expected`` (number)

plus ``expires_at_ms`` and ``ttl`` when the item expires. Every condition treats an item with
``expires_at_ms <= :now`` as absent; an item without ``expires_at_ms`` never expires.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ... import codec
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
from ...keys import COUNTER_SK, counter_pk
from ._table import (
    FREE,
    LIVE,
    ConditionFailedError,
    CountingToken,
    DynamoTable,
    counting_update,
    exact_sum,
    sum_limit,
    unmarshal,
)

__all__ = ["DynamoDBCounterStore"]

_NAMES = {
    "#kind": "kind",
    "#n": "n",
    "#value": "value",
    "#members": "members",
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
        "REMOVE #value, #members, #expected",
        with_ttl,
    )


@functools.cache
def _join_add_write(with_ttl: bool) -> _Write:
    sets = "SET #kind = :kind, #expected = :expected, #last = :member"
    return _write(
        f"{sets}{_KEEP_EXPIRY if with_ttl else ''} ADD #members :mset, #n :one",
        f"attribute_not_exists(pk) OR ({_JOIN_LIVE} AND NOT contains(#members, :member) "
        "AND #n < :expected)",
    )


#: the second request of an arrival beyond ``expected``: it leaves ``last`` alone
_JOIN_BEYOND = _write(
    "ADD #members :mset, #n :one", f"{_JOIN_LIVE} AND NOT contains(#members, :member)"
)


def _join_restart_write(with_ttl: bool) -> _Write:
    return _replacing(
        "SET #kind = :kind, #expected = :expected, #members = :mset, #n = :one, #last = :member",
        "REMOVE #value",
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


def _join_values(member: str, expected: int, now_ms: int) -> dict[str, Any]:
    """The marshalled values of a join write (the ints are small: plain N strings)."""
    return {
        ":kind": {"S": JOIN},
        ":expected": {"N": str(expected)},
        ":mset": {"SS": [member]},
        ":member": {"S": member},
        ":one": {"N": "1"},
        ":now": {"N": str(now_ms)},
    }


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
            members = raw.get("members")
            last = raw.get("last")
            return _counter_item(
                kind,
                n,
                expires_at_ms,
                int(raw["expected"]["N"]),
                frozenset(() if members is None else members["SS"]),
                None if last is None else last["S"],
            )
    except (KeyError, ValueError):
        pass
    return CounterItem.from_item(unmarshal(raw), now_ms)  # an unusual item


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
        token = CountingToken(now_ms, self._pk(key), prune=False)
        return self._update(key, _restart_write(ttl_ms is not None), values, now_ms, token)

    def put_if_absent(
        self, key: str, kind: str, value: Any, ttl_ms: int | None, now_ms: int
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
        return self._table.put_if_free(item, now_ms)

    def get(self, key: str, now_ms: int) -> CounterItem | None:
        return _read(self._table.get_raw(self._key(key)), now_ms)

    def delete(self, key: str, now_ms: int) -> bool:
        response = self._table.call("delete_item", Key=self._key(key), ReturnValues="ALL_OLD")
        return _read(response.get("Attributes"), now_ms) is not None

    def extend(self, key: str, ttl_ms: int, now_ms: int) -> bool:
        try:
            self._table.call(
                "update_item",
                Key=self._key(key),
                ConditionExpression=_EXTEND_CONDITION,
                UpdateExpression="SET expires_at_ms = :exp, #ttl = :ttl",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues=_expiry_values(
                    {":now": {"N": str(now_ms)}}, ttl_ms, now_ms
                ),
            )
        except ConditionFailedError:
            return False
        return True

    # -- joins -------------------------------------------------------------------------------------

    def join_add(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        # One atomic write: the member is added and counted only if it is not in the set yet, so
        # a redelivered arrival fails the condition (and reads back the state) instead of counting
        # twice; the count each successful add returns is therefore distinct.
        # ``last`` names the member that completed the join: every arrival before completion
        # sets it (``#n < :expected``), so once complete it is the completer's, and arrivals
        # beyond ``expected`` (a second request, only for them) leave it alone.
        values = _join_values(member, expected, now_ms)
        if ttl_ms is not None:
            _expiry_values(values, ttl_ms, now_ms)
        outcome = self._update(key, _join_add_write(ttl_ms is not None), values, now_ms)
        current = outcome.current
        if outcome.ok or current is None or current.kind != JOIN:
            return outcome
        if current.expected != expected or member in current.members:
            return outcome
        if int(current.value) < expected:  # pragma: no cover - nothing else fails the condition
            return outcome
        return self._update(key, _JOIN_BEYOND, _join_values(member, expected, now_ms), now_ms)

    def join_restart(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        values = _join_values(member, expected, now_ms)
        if ttl_ms is not None:
            _expiry_values(values, ttl_ms, now_ms)
        return self._update(key, _join_restart_write(ttl_ms is not None), values, now_ms)
