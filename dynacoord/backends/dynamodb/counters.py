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
from typing import Any

from ...counters import COUNTER, JOIN, MAX_COUNTER_VALUE, CounterItem, WriteOutcome, value_fields
from ...keys import COUNTER_SK, counter_pk
from ._table import (
    FREE,
    LIVE,
    ConditionFailedError,
    CountingToken,
    DynamoTable,
    exact_sum,
    primary,
    sum_limit,
    unmarshal,
    values,
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


@functools.lru_cache(maxsize=128)
def _placeholders(expression: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The placeholders of :data:`_NAMES`, of a counting token's names and of its values that
    ``expression`` uses (DynamoDB refuses unused ones). The expressions are a few fixed texts:
    each is searched once."""
    return (
        tuple(k for k in _NAMES if k in expression),
        tuple(k for k in ("#rqa", "#rqb", "#rqc") if k in expression),
        tuple(k for k in ("rqt", "rqs") if f":{k}" in expression),
    )


def _ttl_s(expires_at_ms: int) -> int:
    return math.ceil(expires_at_ms / 1000)


def _expiry(ttl_ms: int, now_ms: int) -> dict[str, Any]:
    return {"exp": now_ms + ttl_ms, "ttl": _ttl_s(now_ms + ttl_ms)}


def _keep_expiry(sets: str, ttl_ms: int | None, now_ms: int) -> tuple[str, dict[str, Any]]:
    """``sets`` plus an expiry for an item that has none yet: a live item keeps its own (fixed
    windows). Returns the SET clause and its values."""
    if ttl_ms is None:
        return sets, {}
    sets += ", expires_at_ms = if_not_exists(expires_at_ms, :exp), #ttl = if_not_exists(#ttl, :ttl)"
    return sets, _expiry(ttl_ms, now_ms)


def _new_expiry(
    sets: str, removes: str, ttl_ms: int | None, now_ms: int
) -> tuple[str, dict[str, Any]]:
    """The update of a write that replaces the item: ``sets`` and ``removes`` plus the new expiry,
    or without a TTL the removal of the old one. Returns the update and its values."""
    if ttl_ms is None:
        return f"{sets} {removes}, expires_at_ms, #ttl", {}
    return f"{sets}, expires_at_ms = :exp, #ttl = :ttl {removes}", _expiry(ttl_ms, now_ms)


class DynamoDBCounterStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _key(self, key: str) -> dict[str, Any]:
        return primary(counter_pk(self._ns, key), COUNTER_SK)

    def _update(
        self,
        key: str,
        *,
        update: str,
        condition: str,
        now_ms: int,
        return_values: str = "ALL_NEW",
        token: CountingToken | None = None,
        **vals: Any,
    ) -> WriteOutcome:
        used, token_names, token_values = _placeholders(update + " " + condition)
        names = {k: _NAMES[k] for k in used}
        if token is not None:  # only the parts the expressions use (DynamoDB refuses others)
            for k in token_names:
                names[k] = token.names[k]
            for k in token_values:
                vals[k] = token.values[k]
        try:
            response = self._table.call(
                "update_item",
                Key=self._key(key),
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values(**vals),
                ReturnValues=return_values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            if token is not None and token.applied(failed.item):
                # A retry of this very write whose first response was lost: it applied once.
                return WriteOutcome(True, item=CounterItem.from_item(failed.item, now_ms))
            return WriteOutcome(False, current=CounterItem.from_item(failed.item, now_ms))
        return WriteOutcome(
            True, item=CounterItem.from_item(unmarshal(response["Attributes"]), now_ms)
        )

    # -- counters --------------------------------------------------------------------------------

    def add(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        # A live counter keeps its expiry (fixed windows); only one without an expiry gets it.
        sets, expiry = _keep_expiry("SET #kind = :kind", ttl_ms, now_ms)
        token = CountingToken(now_ms)
        # DynamoDB would store a sum past 38 digits rounded: refuse it in the condition instead.
        in_range, bounds = sum_limit("#n", by)
        outcome = self._update(
            key,
            update=f"{sets} ADD #n :by, {token.add} REMOVE {token.remove}",
            condition=f"({_LIVE_OR_ABSENT}) AND {token.condition}{in_range}",
            now_ms=now_ms,
            token=token,
            kind=COUNTER,
            by=by,
            now=now_ms,
            **bounds,
            **expiry,
        )
        current = outcome.current
        if (
            not outcome.ok
            and current is not None
            and current.kind == COUNTER
            and not exact_sum(int(current.value), by)
        ):
            return WriteOutcome(False, current=current, out_of_range=MAX_COUNTER_VALUE)
        return outcome

    def restart(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        token = CountingToken(now_ms)
        update, expiry = _new_expiry(
            "SET #kind = :kind, #n = :by, #rqa = :rqs",
            "REMOVE #value, #members, #expected, #rqb, #rqc",
            ttl_ms,
            now_ms,
        )
        return self._update(
            key,
            update=update,
            condition=FREE,
            now_ms=now_ms,
            token=token,
            kind=COUNTER,
            by=by,
            now=now_ms,
            **expiry,
        )

    def put_if_absent(
        self, key: str, kind: str, value: Any, ttl_ms: int | None, now_ms: int
    ) -> bool:
        item: dict[str, Any] = {
            "pk": counter_pk(self._ns, key),
            "sk": COUNTER_SK,
            **value_fields(kind, value),
        }
        if ttl_ms is not None:
            item["expires_at_ms"] = now_ms + ttl_ms
            item["ttl"] = _ttl_s(now_ms + ttl_ms)
        return self._table.put_if_free(item, now_ms)

    def get(self, key: str, now_ms: int) -> CounterItem | None:
        return CounterItem.from_item(self._table.get_item(self._key(key)), now_ms)

    def delete(self, key: str, now_ms: int) -> bool:
        response = self._table.call("delete_item", Key=self._key(key), ReturnValues="ALL_OLD")
        old = response.get("Attributes")
        return CounterItem.from_item(unmarshal(old) if old else None, now_ms) is not None

    def extend(self, key: str, ttl_ms: int, now_ms: int) -> bool:
        expires = now_ms + ttl_ms
        try:
            self._table.call(
                "update_item",
                Key=self._key(key),
                ConditionExpression=f"attribute_exists(pk) AND {LIVE}",
                UpdateExpression="SET expires_at_ms = :exp, #ttl = :ttl",
                ExpressionAttributeNames={"#ttl": "ttl"},
                ExpressionAttributeValues=values(now=now_ms, exp=expires, ttl=_ttl_s(expires)),
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
        common = "#kind = :kind AND #expected = :expected AND " + LIVE
        sets, expiry = _keep_expiry(
            "SET #kind = :kind, #expected = :expected, #last = :member", ttl_ms, now_ms
        )
        outcome = self._update(
            key,
            update=f"{sets} ADD #members :mset, #n :one",
            condition=(
                f"attribute_not_exists(pk) OR ({common} AND NOT contains(#members, :member) "
                "AND #n < :expected)"
            ),
            now_ms=now_ms,
            kind=JOIN,
            expected=expected,
            mset={member},
            member=member,
            one=1,
            now=now_ms,
            **expiry,
        )
        current = outcome.current
        if outcome.ok or current is None or current.kind != JOIN:
            return outcome
        if current.expected != expected or member in current.members:
            return outcome
        if int(current.value) < expected:  # pragma: no cover - nothing else fails the condition
            return outcome
        return self._update(
            key,
            update="ADD #members :mset, #n :one",
            condition=f"{common} AND NOT contains(#members, :member)",
            now_ms=now_ms,
            kind=JOIN,
            expected=expected,
            mset={member},
            member=member,
            one=1,
            now=now_ms,
        )

    def join_restart(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        update, expiry = _new_expiry(
            "SET #kind = :kind, #expected = :expected, #members = :mset, #n = :one, "
            "#last = :member",
            "REMOVE #value",
            ttl_ms,
            now_ms,
        )
        return self._update(
            key,
            update=update,
            condition=FREE,
            now_ms=now_ms,
            kind=JOIN,
            expected=expected,
            mset={member},
            member=member,
            one=1,
            now=now_ms,
            **expiry,
        )
