"""The rate limiter store on the single table.

Item: ``pk=RATE#{ns}#{name}``, ``sk=RATE`` (shard ``i``: ``RATE#{ns}#{name}#{i}`` /
``RATE#{i}``), ``tat`` (the theoretical arrival time, epoch microseconds), ``ttl``, and the
writer slots of the calls in flight (``w:{slot}``, dynacoord._writers): about 90 bytes and 15
per slot, so 1 write unit.

An admission is one UpdateItem (dynacoord.ratelimit has the two cases), a counting write: its
slot holds its token on the condition that it did not yet, so a request botocore re-sent after
it applied is refused, and ``ALL_OLD`` shows the token: "admitted", counted once. The slot and
token are the limiter's :class:`~dynacoord._breaker_window.WindowWrite`, kept across calls when
one raised. A refusal returns the item (``ReturnValuesOnConditionCheckFailure=ALL_OLD``): it
tells the caller how long to wait, or which case to send, with no read.

``ttl`` is set the client's retry window plus an hour past the largest ``tat`` a write may leave:
the item (and its slots) outlive every retry of a write to it; once ``tat`` has passed, a removed
item and a full bucket are the same thing.
"""

from __future__ import annotations

import math
from typing import Any

from ..._breaker_window import WindowWrite
from ...keys import rate_key
from ...ratelimit import RateAttempt
from ._counting import CountingToken, held_counting_update
from ._table import ConditionFailedError, DynamoTable

__all__ = ["DynamoDBRateLimitStore"]

#: how long past its last possible ``tat`` an item stays (seconds, besides the retry window)
_GRACE_S = 3600


def _tat(raw: dict[str, Any] | None) -> int | None:
    if not raw or "tat" not in raw:
        return None
    return int(raw["tat"]["N"])


class DynamoDBRateLimitStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _key(self, name: str, shard: int | None) -> dict[str, Any]:
        key = rate_key(self._ns, name, shard)
        return {"pk": {"S": key.pk}, "sk": {"S": key.sk}}

    def read(self, name: str, shard: int | None) -> int | None:
        """One consistent GetItem (1 read unit)."""
        return _tat(self._table.get_raw(self._key(name, shard)))

    def admit(
        self,
        name: str,
        shard: int | None,
        cost_us: int,
        limit_us: int,
        now_us: int,
        idle: bool,
        write: WindowWrite,
    ) -> RateAttempt:
        """One conditional UpdateItem (1 write unit, also when refused)."""
        key = self._key(name, shard)
        now_ms = now_us // 1000
        # the largest tat this write may leave is now + limit + cost: the item outlives it
        ttl = math.ceil((now_us + limit_us + cost_us) / 1_000_000)
        ttl += math.ceil(self._table.count_window_ms / 1000) + _GRACE_S
        attr_values: dict[str, Any] = {":now": {"N": str(now_us)}, ":ttl": {"N": str(ttl)}}
        if idle:
            # a full bucket (or none yet): the call starts from now
            condition = "attribute_not_exists(#tat) OR #tat <= :now"
            update = "SET #tat = :new, #ttl = :ttl"
            attr_values[":new"] = {"N": str(now_us + cost_us)}
        else:
            # tat ahead of now but within what this call may add to: an atomic add, so busy
            # callers never refuse each other
            condition = "#tat > :now AND #tat <= :lim"
            update = "SET #tat = #tat + :cost, #ttl = :ttl"
            attr_values[":cost"] = {"N": str(cost_us)}
            attr_values[":lim"] = {"N": str(now_us + limit_us)}
        kwargs: dict[str, Any] = {
            "Key": key,
            "ConditionExpression": condition,
            "UpdateExpression": update,
            "ExpressionAttributeNames": {"#tat": "tat", "#ttl": "ttl"},
            "ExpressionAttributeValues": attr_values,
            "ReturnValues": "ALL_NEW",
        }
        # a counting write sent with the slot and token the limiter holds across its sends
        # (leased at the first, kept when a call raised, given back by the limiter)
        token = CountingToken(now_ms, key["pk"]["S"])
        try:
            response = held_counting_update(self._table, write, token, now_ms, kwargs)
        except ConditionFailedError as refused:
            if token.applied(refused.raw):
                # this very write, applied earlier: its answer was lost (re-sent by botocore)
                # or its call raised (sent again by the limiter)
                return RateAttempt(True, _tat(refused.raw))
            return RateAttempt(False, _tat(refused.raw))
        return RateAttempt(True, _tat(response.get("Attributes")))
