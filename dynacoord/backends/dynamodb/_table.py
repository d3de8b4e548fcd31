"""Low-level helpers shared by the DynamoDB stores: marshalling and the one error translation point.

Values are marshalled by a direct fast path for the attribute types dynacoord writes (S, N as int
of at most 38 digits, BOOL, NULL, M, L) and by boto3's own ``TypeSerializer``/``TypeDeserializer``
for everything else (Decimal, bytes, sets, out-of-range ints: their errors stay boto3's). The fast
path is tested value-for-value and type-for-type against boto3's (``tests/test_marshal.py``) and
exists because boto3's Decimal-context deserializer costs ~4x more per item (``make bench``).
Every request goes through :meth:`DynamoTable.call`, the table session's one request path: in
order, a :class:`~dynacoord.TableLayout`'s translation (``_layout.py``), the request, the error
translation (``ClientError`` codes to dynacoord errors, in one place) and the metrics. The
first-use check comes before it (``_verify.VerifiedTable``). What the process learns about the
table through its client (checked, PartiQL or not, join generations, the stale counting slots
the breaker's window writes drop) is the session's :attr:`DynamoTable.state`, shared by every
backend on the same client and table; the slots a counting write saw on an item are kept with
the process's slot pool (dynacoord._writers.remember), which a forked child makes afresh.

No boto3/botocore import at module level: this module is imported deep inside the lazy-import
chain on a Lambda cold start, where module-level imports of boto3's regex-heavy modules cost
several times more than at the top level.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from ..._table_schema import DEFAULT_LAYOUT, TableLayout
from ..._table_state import MAX_REMEMBERED, TableState, table_state
from ..._writers import PRUNE_AT, finished, lease, recall, release, remember, token_ms
from ...errors import (
    BackendError,
    InvalidValueError,
    TableNotReadyError,
    TransactionCancelledError,
    TransactionTooLargeError,
    ValueTooLargeError,
)
from ...metrics import NO_METRICS, Metrics, measure_request
from ._limits import MAX_TRANSACTION_BYTES

if TYPE_CHECKING:
    from ._layout import Translator

__all__ = [
    "FREE",
    "LIVE",
    "REQUEST_TOKEN",
    "ConditionFailedError",
    "CountingToken",
    "DynamoTable",
    "after_counting_write",
    "before_counting_write",
    "counting_update",
    "drop_slots",
    "exact_sum",
    "request_token",
    "retry_window_ms",
    "slot_token",
    "slot_value",
    "sum_limit",
    "written_by",
]

logger = logging.getLogger("dynacoord.backends.dynamodb")

#: operations that can report their consumed capacity, and the metric name of each operation
_CAPACITY_OPERATIONS = frozenset(
    {
        "get_item",
        "put_item",
        "update_item",
        "delete_item",
        "query",
        "scan",
        "batch_get_item",
        "batch_write_item",
        "transact_write_items",
        "transact_get_items",
        "batch_execute_statement",
    }
)
_OPERATION_NAMES = {
    name: "".join(p.title() for p in name.split("_")) for name in _CAPACITY_OPERATIONS
}

#: The condition of a write that creates an item: no item, or an expired one (DynamoDB's TTL
#: sweeper may lag by days, so an expired item counts as absent). Needs ``:now``.
FREE = "attribute_not_exists(pk) OR expires_at_ms <= :now"
#: The attribute holding the request token of the write that last created or changed an item:
#: a retried write whose refusal shows its own token knows its first attempt applied.
REQUEST_TOKEN = "req"


def written_by(item: Mapping[str, Any] | None, token: str) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``item`` (a refusal's ALL_OLD) was written by the request carrying ``token``: a
    retry of an applied write whose first response was lost."""
    return item is not None and item.get(REQUEST_TOKEN) == token


def sum_limit(path: str, by: int) -> tuple[str, dict[str, Any]]:
    """The condition part (`` AND ...``) that keeps the number at ``path`` plus ``by`` within
    DynamoDB's 38 significant digits (past them DynamoDB would store it rounded), and its
    ``:lim`` value; nothing for ``by == 0``."""
    if by > 0:
        return f" AND (attribute_not_exists({path}) OR {path} <= :lim)", {"lim": _N_LIMIT - 1 - by}
    if by < 0:
        return f" AND (attribute_not_exists({path}) OR {path} >= :lim)", {"lim": 1 - _N_LIMIT - by}
    return "", {}


def exact_sum(n: int, by: int) -> bool:
    """Whether ``n + by`` is a number DynamoDB holds exactly (at most 38 digits)."""
    return -_N_LIMIT < n + by < _N_LIMIT


def request_token() -> str:
    """A fresh per-call request token (64 random bits)."""
    return os.urandom(8).hex()  # secrets.token_hex(8), without its two Python frames


#: Counting writes (an ADD cannot be refused by "already applied" on its own) keep one slot per
#: call in flight on the item (``w:{slot}`` = the slot's last token; see dynacoord._writers): a
#: write sets its slot on the condition that the slot does not hold its token yet, and a refusal
#: that shows its token means its first attempt applied. A retry the client sends within its
#: own retry window (:func:`retry_window_ms`) is always recognised. A token is stored as a
#: binary of its integer's bytes (6 bytes where a number takes 8): with a 6-character process id
#: a slot is ~15 bytes, so 120 slots and a counter fit in 2 KB. Slots stored as numbers (the
#: previous versions) are read as well.
#: the attribute-name prefix of writer slots
SLOT_PREFIX = "w:"
#: at most this many stale slots are dropped by one write of a process that saw them before
#: (the breaker's window writes)
_PRUNE_PER_WRITE = 16
#: at most this many slots are named by one request that only drops slots: its condition names
#: each, and a condition expression holds at most 4 KB
_DROP_PER_REQUEST = 50
#: a write whose answer shows more than PRUNE_AT stale slots drops them at once (one more
#: request) if that takes the item below a KB it bills, or if there are more than this many:
#: below it, they are left to the next write of a process that saw them (in its own request)
_DROP_AT_ONCE = 4 * PRUNE_AT

#: botocore's standard and adaptive modes wait at most this long before one retry
#: (``botocore.retries.standard``: ``min(rand * 2**i, 20)`` seconds)
_BACKOFF_CAP_S = 20.0
#: the attempts of standard and adaptive modes when none are configured
_STANDARD_ATTEMPTS = 3
#: a timeout of None (botocore then waits without limit) counts as this many seconds
_NO_TIMEOUT_S = 3600.0


def _legacy_policy() -> tuple[int, float, float]:
    """(attempts, base delay s, growth) of botocore's legacy retries for DynamoDB, from
    botocore's own retry model (``_retry.json``: 10 attempts, 0.05 s doubling)."""
    import botocore.loaders

    model = botocore.loaders.create_loader().load_data("_retry")["retry"]
    policy = {**model.get("__default__", {}), **model.get("dynamodb", {}).get("__default__", {})}
    delay = policy.get("delay", {})
    base = delay.get("base", 1)
    return (
        int(policy.get("max_attempts", 5)),
        1.0 if base == "rand" else float(base),
        float(delay.get("growth_factor", 2)),
    )


def retry_window_ms(config: Any) -> int:
    """How long after a call started botocore may still send a retry of its request, from the
    client's configuration (``client.meta.config``): every attempt may take its connect and
    read timeouts, and every retry waits its mode's backoff ceiling first.

    ``(connect_timeout + read_timeout) x attempts + backoff``, where attempts is
    ``total_max_attempts`` (botocore turns ``max_attempts`` into it, plus one), else the mode's
    default (standard and adaptive: 3; legacy: DynamoDB's 10), and backoff is 20 s per retry in
    standard and adaptive mode (botocore's cap) and the sum of the legacy mode's exponential
    delays. botocore's defaults (60 s + 60 s, standard, 3 attempts) give 400 s; the client of
    ``DynamoDBBackend.from_env()`` (adaptive, ``max_attempts=8``: 9 attempts) 1,240 s.
    """

    def seconds(value: Any) -> float:
        return _NO_TIMEOUT_S if value is None else float(value)

    connect = seconds(getattr(config, "connect_timeout", 60))
    read = seconds(getattr(config, "read_timeout", 60))
    retries = getattr(config, "retries", None) or {}
    mode = retries.get("mode") or "standard"
    attempts = retries.get("total_max_attempts")
    if attempts is None and retries.get("max_attempts") is not None:
        attempts = int(retries["max_attempts"]) + 1
    if mode == "legacy":
        default, base, growth = _legacy_policy()
        attempts = max(1, int(attempts or default))
        backoff = sum(base * growth**i for i in range(attempts - 1))
    else:
        attempts = max(1, int(attempts or _STANDARD_ATTEMPTS))
        backoff = _BACKOFF_CAP_S * (attempts - 1)
    return math.ceil((attempts * (connect + read) + backoff) * 1000)


def client_window_ms(client: Any) -> int:
    """:func:`retry_window_ms` of a client (botocore's defaults for an object without a
    botocore configuration, such as a test double)."""
    meta = getattr(client, "meta", None)
    config = getattr(meta, "config", None)
    if config is None:
        from botocore.config import Config

        config = Config()
    return retry_window_ms(config)


def slot_value(token: int | str) -> dict[str, Any]:
    """The attribute value a slot holds for ``token``: a binary of the integer's bytes."""
    value = int(token)
    return {"B": value.to_bytes(max(1, (value.bit_length() + 7) // 8), "big")}


def slot_token(av: Mapping[str, Any]) -> int | None:
    """The token a slot's attribute value holds (a binary, or a number written by a previous
    version), or None for anything else."""
    if "B" in av:
        return int.from_bytes(av["B"], "big")
    if "N" in av:
        return int(av["N"])
    return None


class CountingToken:
    """One counting write's slot and token, and the stale slots it drops.

    The slot is leased by :func:`counting_update` for the duration of its requests (botocore's
    retries included) and given back after them; :meth:`apply` adds the slot's parts to an
    UpdateItem's expressions. ``pk`` names the item. With ``prune`` (the keyword),
    :func:`counting_update` drops the slots no call can retry any more that its process saw
    there. ``prune`` (the attribute) lists the slots (name, value seen) this write drops in the
    same request (the breaker's window writes fill it from the table's
    :attr:`~dynacoord._table_state.TableState.stale_slots`). ``name`` and ``token`` stay set
    after the call, for :meth:`applied`."""

    __slots__ = ("name", "now_ms", "pk", "prune", "prunes", "token")

    #: the condition part: this token was not applied yet
    condition = "(attribute_not_exists(#rqw) OR #rqw <> :rqt)"

    def __init__(self, now_ms: int, pk: str, *, prune: bool = True) -> None:
        self.now_ms = now_ms
        self.name = ""
        self.token = ""
        self.pk = pk
        self.prunes = prune
        #: the stale slots (name, token value seen) this write drops
        self.prune: tuple[tuple[str, Any], ...] = ()

    def apply(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` of an UpdateItem (its own expressions, without the token) with the
        token's parts added: the slot set in the SET clause, the stale slots removed (a REMOVE
        clause, if any, must be the last clause), the condition and the placeholders."""
        update: str = kwargs["UpdateExpression"]
        if update.startswith("SET "):
            update = "SET #rqw = :rqt, " + update[4:]
        elif " SET " in update:
            update = update.replace(" SET ", " SET #rqw = :rqt, ", 1)
        else:
            update = "SET #rqw = :rqt " + update
        condition = kwargs.get("ConditionExpression")
        if condition is None:
            condition = self.condition
        elif _wrapped(condition):  # DynamoDB refuses redundant parentheses
            condition = f"{condition} AND {self.condition}"
        else:
            condition = f"({condition}) AND {self.condition}"
        names = {**kwargs.get("ExpressionAttributeNames", {}), "#rqw": self.name}
        attr_values = {**kwargs["ExpressionAttributeValues"], ":rqt": slot_value(self.token)}
        if self.prune:
            # never this writer's own slot: it is set by this very write (and DynamoDB refuses
            # a SET and a REMOVE of one path)
            self.prune = tuple(p for p in self.prune if p[0] != self.name)
        if self.prune:
            removed = []
            for i, (name, seen) in enumerate(self.prune):
                names[f"#rp{i}"] = name
                removed.append(f"#rp{i}")
                condition += " AND " + _still_as_seen(f"#rp{i}", f":rp{i}")
                attr_values[f":rp{i}"] = _seen_value(seen)
            sep = ", " if " REMOVE " in update else " REMOVE "
            update += sep + ", ".join(removed)
        return {
            **kwargs,
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": attr_values,
        }

    def applied(self, raw: Mapping[str, Any] | None) -> bool:
        """Whether ``raw`` (a refusal's ALL_OLD, attribute values) shows this token: the write
        applied before."""
        if raw is None or not self.token:
            return False
        av = raw.get(self.name)
        return av is not None and slot_token(av) == int(self.token)

    def refused_by_prune(self, raw: Mapping[str, Any] | None) -> bool:
        """Whether a refusal with ``raw`` may be due to a stale slot that was written again
        since it was seen (then the write is sent again without dropping it)."""
        return raw is None or any(
            name in raw and raw[name] != _seen_value(seen) for name, seen in self.prune
        )

    def observe(
        self,
        raw: Mapping[str, Any] | None,
        now_ms: int,
        stale_slots: dict[str, tuple[tuple[str, Any], ...]],
    ) -> None:
        """Note the stale slots of ``raw`` (the item after or before the write) in
        ``stale_slots``, for the next counting write of this process to the same item."""
        if not raw:
            return
        slots = [(n, av) for n, av in raw.items() if n.startswith(SLOT_PREFIX)]
        if len(slots) <= PRUNE_AT:
            return
        stale = [(name, av) for name, av in slots if name != self.name and _stale(av, now_ms)]
        if stale:
            if len(stale_slots) >= MAX_REMEMBERED:
                stale_slots.clear()
            stale_slots[self.pk] = tuple(stale[:_PRUNE_PER_WRITE])


def _seen_value(seen: Any) -> dict[str, Any]:
    # a token value as seen: an attribute value, or a number's text (what earlier versions kept)
    return dict(seen) if isinstance(seen, Mapping) else {"N": str(seen)}


def _stale(av: Mapping[str, Any], now_ms: int) -> bool:
    """Whether the call that wrote a slot holding ``av`` can no longer retry (its token says
    until when it could, by its own client's window)."""
    token = slot_token(av)
    return token is not None and token_ms(token) < now_ms


def _still_as_seen(name: str, value: str) -> str:
    # A slot is dropped only while it is gone or still holds the token seen: a slot leased and
    # written again since (its retry may still come) is kept, and a slot another writer dropped
    # first does not refuse this drop (every writer that saw it drops it; none is refused).
    return f"(attribute_not_exists({name}) OR {name} = {value})"


def _seen_slots(
    raw: Mapping[str, Any] | None, own: str
) -> tuple[tuple[str, dict[str, Any], int], ...]:
    """The slots of ``raw`` (an item's attribute values) but ``own``: (name, value, until when
    its call may retry)."""
    if not raw:
        return ()
    found = []
    for name, av in raw.items():
        if name.startswith(SLOT_PREFIX) and name != own:
            token = slot_token(av)
            if token is not None:
                found.append((name, dict(av), token_ms(token)))
    return tuple(found)


def _to_drop(
    seen: tuple[tuple[str, Any, int], ...], now_ms: int
) -> tuple[tuple[str, dict[str, Any]], ...]:
    """Those of the slots ``seen`` that no call can retry any more at ``now_ms``: stale ones
    (their token's time has passed) and this process's own slots that are free in its pool
    (their calls have returned). At most :data:`_DROP_PER_REQUEST` of them."""
    free = finished(name[len(SLOT_PREFIX) :] for name, _, _ in seen)
    found = tuple(
        (name, av) for name, av, until in seen if until < now_ms or name[len(SLOT_PREFIX) :] in free
    )
    return found[:_DROP_PER_REQUEST]


def _size(name: str, av: Mapping[str, Any]) -> int:
    """An attribute's size by DynamoDB's rules (bench/_units.py holds the tested copy)."""
    ((tag, raw),) = av.items()
    if tag == "S":
        size = len(raw.encode("utf-8"))
    elif tag == "N":
        digits = raw.lstrip("-").replace(".", "").strip("0") or "0"
        size = (len(digits) + 1) // 2 + 1
    elif tag == "B":
        size = len(raw)
    elif tag in ("M", "L", "SS", "NS", "BS"):
        size = len(str(raw))  # never on a counted item's slots; an upper bound is enough here
    else:
        size = 1
    return len(name.encode("utf-8")) + size


def _bills_less_without(
    raw: Mapping[str, Any] | None, stale: list[tuple[str, dict[str, Any]]]
) -> bool:
    """Whether the item ``raw`` bills fewer KB per write without the slots ``stale``."""
    if not raw:
        return False
    size = sum(_size(name, av) for name, av in raw.items())
    less = size - sum(_size(name, av) for name, av in stale)
    return -(-less // 1024) < -(-size // 1024)


def drop_slots(
    table: DynamoTable, key: dict[str, Any], found: list[tuple[str, dict[str, Any]]]
) -> None:
    """Drop the slots ``found`` (name, value seen) from the item at ``key``: one UpdateItem per
    :data:`_DROP_PER_REQUEST` slots, each slot on the condition that it is gone or still holds
    the value seen, so a slot leased and written again since is kept (such a request is sent
    once more without it) and writers dropping the same slots at once never refuse each other.
    What the caller's write did is already decided: a drop that fails is logged and left to
    whoever writes next."""
    for start in range(0, len(found), _DROP_PER_REQUEST):
        chunk = found[start : start + _DROP_PER_REQUEST]
        for _attempt in range(2):
            names = {f"#d{i}": name for i, (name, _) in enumerate(chunk)}
            conditions = ["attribute_exists(pk)"]
            conditions += [_still_as_seen(f"#d{i}", f":d{i}") for i in range(len(chunk))]
            try:
                table.call(
                    "update_item",
                    Key=key,
                    UpdateExpression="REMOVE " + ", ".join(names),
                    ConditionExpression=" AND ".join(conditions),
                    ExpressionAttributeNames=names,
                    ExpressionAttributeValues={f":d{i}": seen for i, (_, seen) in enumerate(chunk)},
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ConditionFailedError as failed:
                raw = failed.raw
                if raw is None:
                    return  # the item is gone
                # the slots written again since they were seen stay
                chunk = [(n, seen) for n, seen in chunk if n not in raw or raw[n] == seen]
                if chunk:
                    continue
            except Exception:  # the caller's write is done; whoever writes next drops them
                logger.debug("dropping %d counting slots failed", len(chunk), exc_info=True)
                return
            break


def _wrapped(expression: str) -> bool:
    """Whether ``expression`` is one parenthesised whole: ``(a OR b)``, not ``(a) OR (b)``."""
    if not expression.startswith("("):
        return False
    depth = 0
    for i, char in enumerate(expression):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i == len(expression) - 1
    return False


def counting_update(
    table: DynamoTable, token: CountingToken, now_ms: int, **kwargs: Any
) -> dict[str, Any]:
    """One counting UpdateItem: ``kwargs`` with ``token``'s parts (:meth:`CountingToken.apply`)
    and ``ReturnValuesOnConditionCheckFailure=ALL_OLD``, sent with a slot leased from this
    process's pool for the call (botocore's retries of it included) and given back after. A
    refusal raises ConditionFailedError (check :meth:`CountingToken.applied` on its ``raw``).

    With ``token.prunes``, the slots no call can retry any more go with whoever writes next:

    * this process remembers the other slots its write's answer shows (``ReturnValues=ALL_NEW``;
      dynacoord._writers.remember), and its next write to the item drops in the same request
      those that have turned stale by then, and its own that are free in its pool (a burst's
      calls that returned): no extra request, for a process that writes the item again;
    * when the answer shows more than PRUNE_AT stale slots and either more than
      :data:`_DROP_AT_ONCE` or enough to take the item below a KB it bills, this call drops
      them at once (:func:`drop_slots`: one more request per 50 slots, only then): the slots of
      writers that never write again (one-shot processes, Lambda environments reclaimed) go
      with whoever writes after them, whatever that writer's lifetime, and they never cost a
      KB more per write for long.

    Every drop is conditioned on the slot being gone or still holding the value seen: a slot
    leased and written again since is kept (the write is then sent again without the drop: a
    second request, only then), and writers dropping the same slot never refuse each other."""
    kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    before_counting_write(token, now_ms)
    slot, value = lease(token.now_ms, table.count_window_ms)
    token.name = SLOT_PREFIX + slot.name
    token.token = str(value)
    try:
        while True:
            try:
                response = table.call("update_item", **token.apply(kwargs))
            except ConditionFailedError as failed:
                if (
                    token.prune
                    and not token.applied(failed.raw)
                    and token.refused_by_prune(failed.raw)
                ):
                    token.prune = ()
                    continue
                if token.prunes:
                    remember(token.pk, _seen_slots(failed.raw, token.name))
                raise
            break
    finally:
        release(slot)
    after_counting_write(table, token, kwargs["Key"], response.get("Attributes"), now_ms)
    return response


def before_counting_write(token: CountingToken, now_ms: int) -> None:
    """Before a counting write with ``token.prunes``: ``token.prune`` takes the slots this
    process saw on the item that no call can retry any more at ``now_ms`` (dropped in the
    write's own request by :meth:`CountingToken.apply`). A write that sends its own request
    (the breaker's window writes) calls this and :func:`after_counting_write` around it."""
    if token.prunes:
        token.prune = _to_drop(recall(token.pk), now_ms)


def after_counting_write(
    table: DynamoTable,
    token: CountingToken,
    key: dict[str, Any],
    raw: Mapping[str, Any] | None,
    now_ms: int,
) -> None:
    """After a counting write with ``token.prunes`` applied and answered with the item ``raw``
    (``ReturnValues=ALL_NEW``): the slots it shows are remembered for this process's next
    write there, and more than PRUNE_AT stale ones are dropped at once if that takes the item
    below a KB it bills or there are more than :data:`_DROP_AT_ONCE` (see
    :func:`counting_update`)."""
    if not token.prunes:
        return
    seen = _seen_slots(raw, token.name)
    stale = [(name, av) for name, av, until in seen if until < now_ms]
    if len(stale) > PRUNE_AT and (len(stale) > _DROP_AT_ONCE or _bills_less_without(raw, stale)):
        drop_slots(table, key, stale)
        gone = {name for name, _ in stale}
        seen = tuple(s for s in seen if s[0] not in gone)
    remember(token.pk, seen)


#: The item (if any) has not expired: no expiry, or one still ahead of ``:now``.
LIVE = "(attribute_not_exists(expires_at_ms) OR expires_at_ms > :now)"

_boto3_types: Any = None


def _boto3() -> Any:
    """boto3's serializer and deserializer, made on first use (see the module docstring)."""
    global _boto3_types
    if _boto3_types is None:
        from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

        _boto3_types = (TypeSerializer(), TypeDeserializer())
    return _boto3_types


#: ints whose decimal form has at most 38 digits are exact DynamoDB numbers
_N_LIMIT = 10**38


def _serialize(value: Any) -> dict[str, Any]:
    cls = type(value)
    if cls is str:
        return {"S": value}
    if cls is int:
        if -_N_LIMIT < value < _N_LIMIT:
            return {"N": str(value)}
    elif cls is bool:
        return {"BOOL": value}
    elif value is None:
        return {"NULL": True}
    elif cls is dict:
        return {"M": {k: _serialize(v) for k, v in value.items()}}
    elif cls is list:
        return {"L": [_serialize(v) for v in value]}
    elif cls is set and value and all(type(v) is str for v in value):
        return {"SS": list(value)}  # the request tokens of counting writes
    return cast("dict[str, Any]", _boto3()[0].serialize(value))


def _deserialize(av: Mapping[str, Any]) -> Any:
    if len(av) == 1:
        # S and N first, by key lookup: most attributes are one of them
        if "S" in av:
            return av["S"]
        if "N" in av:
            return Decimal(av["N"])
        ((tag, raw),) = av.items()
        if tag == "BOOL":
            return raw
        if tag == "NULL":
            return None
        if tag == "M":
            return unmarshal(raw)
        if tag == "L":
            return [_deserialize(v) for v in raw]
        if tag == "SS":
            return set(raw)
    return _boto3()[1].deserialize(av)


class ConditionFailedError(Exception):
    """Internal: a condition expression was false. ``raw`` is the item as it was, if returned
    (attribute values), and ``item`` the same as Python values, converted on first use: many
    refusals are decided by one attribute (a request token) and need no conversion at all."""

    def __init__(self, raw: dict[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.raw = raw
        self._item: dict[str, Any] | None = None

    @property
    def item(self) -> dict[str, Any] | None:
        if self._item is None and self.raw:
            self._item = unmarshal(self.raw)
        return self._item


def primary(pk: str, sk: str) -> dict[str, Any]:
    """The ``Key`` of GetItem/UpdateItem/DeleteItem for ``pk``/``sk``, already marshalled."""
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def to_av(value: Any) -> dict[str, Any]:
    """One Python value to a DynamoDB attribute value."""
    return _serialize(value)


def marshal(item: Mapping[str, Any]) -> dict[str, Any]:
    """A dict of Python values to a DynamoDB item (None values are dropped)."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        # str and int inline (most attributes): no call per attribute, no comprehension frame
        cls = type(value)
        if cls is str:
            out[name] = {"S": value}
        elif cls is int and -_N_LIMIT < value < _N_LIMIT:
            out[name] = {"N": str(value)}
        elif value is not None:
            out[name] = _serialize(value)
    return out


def unmarshal(item: Mapping[str, Any]) -> dict[str, Any]:
    """A DynamoDB item to a dict of Python values."""
    out: dict[str, Any] = {}
    for name, av in item.items():
        # _deserialize's S and N cases inline: a call per attribute is most of the cost
        if len(av) == 1:
            if "S" in av:
                out[name] = av["S"]
                continue
            if "N" in av:
                out[name] = Decimal(av["N"])
                continue
        out[name] = _deserialize(av)
    return out


def unmarshal_only(item: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The attributes ``names`` of a DynamoDB item (those it has) as Python values: a reader
    that needs a few attributes of a wide item skips converting the rest."""
    out: dict[str, Any] = {}
    for name in names:
        av = item.get(name)
        if av is not None:
            out[name] = _deserialize(av)
    return out


def values(**kwargs: Any) -> dict[str, Any]:
    """``ExpressionAttributeValues`` from keyword arguments: ``values(now=1)`` -> ``{":now": ..}``."""
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        cls = type(value)
        if cls is str:
            out[":" + name] = {"S": value}
        elif cls is int and -_N_LIMIT < value < _N_LIMIT:
            out[":" + name] = {"N": str(value)}
        else:
            out[":" + name] = _serialize(value)
    return out


#: operations whose request names its tables inside (no ``TableName`` of their own)
_MULTI_TABLE_OPERATIONS = frozenset(
    {"transact_write_items", "batch_get_item", "batch_write_item", "batch_execute_statement"}
)


class DynamoTable:
    """The table session: one table through one client, as every store of a backend sends to it,
    with request helpers that each make exactly one request.

    ``layout`` (not the default) is translated on every request and answer at one point, the
    :class:`~._layout.Translator`; the stores write dynacoord's own schema. ``state`` is what
    this process knows of the table through ``client``, shared with every other session on the
    same client and table (:func:`dynacoord._table_state.table_state`)."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        metrics: Metrics = NO_METRICS,
        layout: TableLayout = DEFAULT_LAYOUT,
    ) -> None:
        from botocore.exceptions import ClientError  # boto3 is loaded: the client exists

        self.client = client
        self.name = table_name
        self.layout = layout
        #: the layout's translation (None for the default layout: no translation at all)
        self.translator: Translator | None = None
        if not layout.is_default:
            from ._layout import Translator

            self.translator = Translator(layout, table_name)
        self.state: TableState = table_state(client, table_name)
        #: how long botocore may re-send a counting write after its call started
        #: (:func:`retry_window_ms` of the client's configuration)
        self.count_window_ms = client_window_ms(client)
        self._client_error: type[Exception] = ClientError
        self.metrics = metrics

    # -- the request path -----------------------------------------------------------------------

    def call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """Call ``client.<operation>(TableName=..., **kwargs)``, kwargs in dynacoord's names:
        translated to the layout's and back, errors translated, metrics reported.

        Raises :class:`ConditionFailedError` (internal) for a false condition, carrying the old item
        when ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` was asked for.
        """
        if operation not in _MULTI_TABLE_OPERATIONS:
            kwargs.setdefault("TableName", self.name)
        if self.translator is not None:
            return self._translated(operation, kwargs)
        return self._send(operation, kwargs)

    def _send(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The request as it is, its errors translated, measured."""
        if self.metrics.enabled:
            return self._measured(operation, kwargs)
        try:
            response: dict[str, Any] = getattr(self.client, operation)(**kwargs)
        except self._client_error as exc:
            raise self.translate(exc) from exc
        return response

    def _translated(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """:meth:`call` on a table with a layout: the request in the layout's names, the answer
        and the items of a refusal back in dynacoord's."""
        translator = self.translator
        assert translator is not None
        request = translator.request_for(operation, kwargs)
        if request is None:  # already in the layout's names: a transaction of the caller's
            return self._send(operation, kwargs)
        try:
            response = self._send(operation, request)
        except ConditionFailedError as failed:
            if failed.raw:
                failed.raw = translator.item_in(failed.raw)
            raise
        except TransactionCancelledError as cancelled:
            cancelled.reasons = translator.reasons_in(cancelled.reasons)
            raise
        return translator.answer(response)

    def statement(self, action: str, op: Mapping[str, Any]) -> dict[str, Any]:
        """The PartiQL statement of a transaction item's ``Update``/``Delete`` (dynacoord's
        names), in the table's names (``_partiql.statement``; its refused items come back
        translated with the answer of :meth:`call`)."""
        from . import _partiql

        translator = self.translator
        return _partiql.statement(action, op if translator is None else translator.request(op))

    def statements_supported(self, probe_key: Mapping[str, Any]) -> bool:
        """Whether this endpoint runs conditional PartiQL batches on the table (asked once per
        client and table: ``_partiql.supported``); ``probe_key`` is a key that never exists."""
        from . import _partiql

        known = self.state.partiql
        if known is not None and known[0]:
            return True
        probe = self.statement("Update", _partiql.probe_op(self.name, probe_key))
        return _partiql.supported(self.state, self.client, probe)

    def stream_image(self, image: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """A stream record's image (DynamoDB JSON, in the table's names) in dynacoord's names, or
        None for an item of the application's sharing the table with a layout (not read
        through the client, so :meth:`call` never saw it)."""
        translator = self.translator
        if translator is None:
            return image
        return translator.item_in(image) if translator.owns(image) else None

    def _measured(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """:meth:`call` reporting latency, errors and consumed capacity (dynacoord.metrics)."""
        if self.metrics.consumed_capacity and operation in _CAPACITY_OPERATIONS:
            kwargs.setdefault("ReturnConsumedCapacity", "TOTAL")
        dimensions = {
            "Backend": "dynamodb",
            "Operation": _OPERATION_NAMES.get(operation, operation),
        }
        start = time.perf_counter()
        try:
            response: dict[str, Any] = getattr(self.client, operation)(**kwargs)
        except self._client_error as exc:
            translated = self.translate(exc)
            measure_request(
                self.metrics,
                dimensions,
                start,
                failed=not isinstance(translated, ConditionFailedError),
            )
            raise translated from exc
        except Exception:
            measure_request(self.metrics, dimensions, start, failed=True)
            raise
        capacity = response.get("ConsumedCapacity")
        if isinstance(capacity, dict):
            capacity = [capacity]
        units = sum(float(c.get("CapacityUnits", 0)) for c in capacity or ())
        measure_request(self.metrics, dimensions, start, capacity=units if capacity else None)
        return response

    def translate(self, exc: Any) -> Exception:
        """Map a botocore ``ClientError`` to the exception dynacoord raises for it."""
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        message = error.get("Message", str(exc))
        if code == "ConditionalCheckFailedException":
            raw = cast("dict[str, Any] | None", exc.response.get("Item"))
            return ConditionFailedError(raw or None)
        if code == "ResourceNotFoundException":
            return TableNotReadyError(
                f"DynamoDB table {self.name!r} not found or not active: create it with "
                f"`dynacoord table create --table {self.name}` ({message})",
                table_name=self.name,
            )
        if code == "TransactionCanceledException":
            reasons = cast("list[dict[str, Any]]", exc.response.get("CancellationReasons", []))
            summary = ", ".join(
                f"{i}:{r.get('Code')}" for i, r in enumerate(reasons) if r.get("Code") != "None"
            )
            return TransactionCancelledError(
                f"transaction cancelled ({summary or message})", reasons=reasons
            )
        if code == "ValidationException" and "multiple operations on one item" in message:
            # Two operations on one item the Transaction could not see (Puts into a table
            # whose key it does not know): DynamoDB refused the whole request.
            return InvalidValueError(
                f"one item appears twice in one transaction, nothing was written: {message}"
            )
        if code == "ValidationException" and "transaction payload size" in message.lower():
            return TransactionTooLargeError(
                f"DynamoDB refused the transaction, nothing was written: {message}",
                size=-1,
                limit=MAX_TRANSACTION_BYTES,
            )
        if (
            code == "ValidationException"
            and "size" in message.lower()
            and "item" in message.lower()
        ):
            # imported here: a rare error, and the codec stays off a Lambda's cold path
            from ...codec import DYNAMODB_ITEM_LIMIT

            return ValueTooLargeError(
                f"DynamoDB refused the item as too large: {message}",
                size=-1,
                limit=DYNAMODB_ITEM_LIMIT,
            )
        return BackendError(f"DynamoDB {code}: {message}", code=code)

    # -- one-request helpers ----------------------------------------------------------------

    def get(self, key: Mapping[str, str], *, consistent: bool = True) -> dict[str, Any] | None:
        return self.get_item(marshal(key), consistent=consistent)

    def get_item(self, key: dict[str, Any], *, consistent: bool = True) -> dict[str, Any] | None:
        """:meth:`get` of a key already marshalled (:func:`primary`)."""
        raw = self.get_raw(key, consistent=consistent)
        return unmarshal(raw) if raw else None

    def get_raw(self, key: dict[str, Any], *, consistent: bool = True) -> dict[str, Any] | None:
        """:meth:`get_item` without the unmarshal: the item as attribute values (or None), for
        a store that reads the few attributes it needs straight from them."""
        item: dict[str, Any] | None = self.call("get_item", Key=key, ConsistentRead=consistent).get(
            "Item"
        )
        return item

    def put_if_free(self, item: Mapping[str, Any], now_ms: int) -> bool:
        """PutItem of ``item`` on condition :data:`FREE`; False (nothing written) when a live
        item holds its key.

        The item carries a fresh request token (:data:`REQUEST_TOKEN`): when botocore retries
        the put after its first response was lost, the refusal shows the item as it is, and
        that item carrying this call's token means the first attempt applied: True, as the
        lost response would have said.
        """
        return self.put_item_if_free(marshal(item), now_ms)

    def put_free(self, item: dict[str, Any], now_ms: int) -> None:
        """PutItem of ``item`` (marshalled) on condition :data:`FREE`: no item at its key, or
        only an expired one (past its TTL, not swept yet). A refusal raises
        :class:`ConditionFailedError` holding the live item that refused it (ALL_OLD)."""
        self.call(
            "put_item",
            Item=item,
            ConditionExpression=FREE,
            ExpressionAttributeValues={":now": {"N": str(now_ms)}},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def put_item_if_free(self, item: dict[str, Any], now_ms: int) -> bool:
        """:meth:`put_if_free` of an item already marshalled (``item`` gains the token)."""
        token = request_token()
        item[REQUEST_TOKEN] = {"S": token}
        try:
            self.put_free(item, now_ms)
        except ConditionFailedError as failed:
            # written_by on the one attribute it reads, without converting the whole item
            return failed.raw is not None and failed.raw.get(REQUEST_TOKEN) == {"S": token}
        return True

    def query_pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Yield every page of a Query (each page is one request), following LastEvaluatedKey."""
        while True:
            page = self.call("query", **kwargs)
            yield page
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last
