"""The counting slots: how a counting write (an ``ADD``) on DynamoDB recognises its own retry, and
how the slots of writers that will never retry go.

Counting writes (an ADD cannot be refused by "already applied" on its own) keep one slot per call
in flight on the item (``w:{slot}`` = the slot's last token; see dynacoord._writers), leased from
this process's pool: a write sets its slot on the condition that the slot does not hold its token
yet, and a refusal that shows its token means its first attempt applied. The slots a write saw on
an item are kept with the process's slot pool (dynacoord._writers.remember), which a forked child
makes afresh; the next writer drops those no call can retry any more
(:func:`counting_update`). Every request goes through the table session
(:meth:`~._table.DynamoTable.call`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..._writers import PRUNE_AT, finished, lease, recall, release, remember, token_ms
from ._table import ConditionFailedError

if TYPE_CHECKING:
    from ..._breaker_window import WindowWrite
    from ._table import DynamoTable

__all__ = [
    "SLOT_PREFIX",
    "CountingToken",
    "after_counting_write",
    "before_counting_write",
    "counting_update",
    "drop_slots",
    "held_counting_update",
    "slot_token",
    "slot_value",
]

logger = logging.getLogger("dynacoord.backends.dynamodb")

#: A retry the client sends within its own retry window (``_retry_window.retry_window_ms``) is
#: always recognised. A token is stored as a binary of its integer's bytes (6 bytes where a
#: number takes 8): with a 6-character process id a slot is ~15 bytes, so 120 slots and a counter
#: fit in 2 KB. Slots stored as numbers (the previous versions) are read as well.
#: the attribute-name prefix of writer slots
SLOT_PREFIX = "w:"
#: at most this many slots are named by one request that only drops slots: its condition names
#: each, and a condition expression holds at most 4 KB
_DROP_PER_REQUEST = 50
#: a write whose answer shows more than PRUNE_AT stale slots drops them at once (one more
#: request) if that takes the item below a KB it bills, or if there are more than this many:
#: below it, they are left to the next write of a process that saw them (in its own request)
_DROP_AT_ONCE = 4 * PRUNE_AT


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
    same request (:func:`before_counting_write` fills it). ``name`` and ``token`` stay set
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


def _seen_value(seen: Any) -> dict[str, Any]:
    # a token value as seen: an attribute value, or a number's text (what earlier versions kept)
    return dict(seen) if isinstance(seen, Mapping) else {"N": str(seen)}


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


def held_counting_update(
    table: DynamoTable,
    write: WindowWrite,
    token: CountingToken,
    now_ms: int,
    kwargs: dict[str, Any],
) -> dict[str, Any]:
    """:func:`counting_update` sent with the slot and token ``write`` holds across its sends
    (leased at the first, kept when a call raised, given back by its owner: the breaker's window
    writes, the rate limiter's admissions) instead of a slot leased for this call alone: a send
    after one whose call raised is refused with its own token, "applied". A refusal raises
    ConditionFailedError (check :meth:`CountingToken.applied` on its ``raw``). The steps around
    the write are the counting write's own (:func:`before_counting_write`,
    :func:`after_counting_write`), so the slots of writers that never write again go with
    whoever writes next."""
    kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
    before_counting_write(token, now_ms)
    slot, value = write.take(token.now_ms, table.count_window_ms)
    token.name = SLOT_PREFIX + slot
    token.token = str(value)
    while True:
        try:
            response = table.call("update_item", **token.apply(kwargs))
        except ConditionFailedError as failed:
            if token.prune and not token.applied(failed.raw) and token.refused_by_prune(failed.raw):
                token.prune = ()  # a stale slot written again since it was seen
                continue
            raise
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
