"""The circuit-breaker store on the single table.

Item: ``pk=CB#{ns}#{name}``, ``sk=CB``, ``state`` (closed/open/half_open), ``failures``,
``successes``, ``opened_at_ms``, ``trial_round``, ``trial_calls``, ``trial_started_ms``,
``updated_ms``; ``req`` (the request token of the last transition) and ``req_from`` (the state
a trip or reset left), and one slot per call in flight (``w:{slot}``, dynacoord._writers) for failures,
trial successes and joined trial slots, so that a write retried after its answer was lost recognises itself. With the failure-rate policy, ``wgen`` (the window's
generation: every trip and reset adds one) and one count pair per bucket of the window,
``c:{gen}:{bucket}`` and ``f:{gen}:{bucket}`` (calls, failures; dynacoord.breaker); a window
write drops the pairs it saw last time that no window needs any more (another generation, or
aged out), so the item holds about one window of buckets. No TTL: the state must outlive every process. An absent item means closed with no
failures. ``reset`` closes the item in place instead of deleting it: ``trial_round`` must never go
back, or a trial that was in flight across the reset would share its round number with a trial
taken after it, and its late outcome would be applied to the new round.

Every method is one request; every state change is conditional on the state it leaves, so when
several processes race for the same transition exactly one write succeeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...breaker import (
    BreakerRecord,
    BreakerWindow,
    StartTrialResult,
    State,
    WindowWrite,
    _state,
    stale_window_names,
    window_field,
    window_from_fields,
)
from ...keys import BREAKER_SK, breaker_pk
from ._counting import CountingToken, counting_update, held_counting_update
from ._marshal import unmarshal, values
from ._table import REQUEST_TOKEN, ConditionFailedError, DynamoTable, request_token, written_by

__all__ = ["DynamoDBBreakerStore"]

_NAMES = {"#st": "state"}
#: the stored states as plain str (an enum member's ``.value`` is a descriptor call)
_CLOSED = State.CLOSED.value
_OPEN = State.OPEN.value
_HALF = State.HALF_OPEN.value
#: what trip and a failed trial round write: open now, the trial state cleared, and the
#: request token (``#req``) that lets a retry of this very write recognise it
_OPEN_UPDATE = (
    "SET #st = :open, opened_at_ms = :now, successes = :zero, trial_calls = :zero, "
    "updated_ms = :now, #req = :req{extra} REMOVE trial_started_ms"
)
#: what a successful trial round and reset write: closed, no failures; trial_round is kept
_CLOSED_UPDATE = (
    "SET #st = :closed, failures = :zero, successes = :zero, trial_calls = :zero, "
    "updated_ms = :now, #req = :req{extra} REMOVE opened_at_ms, trial_started_ms"
)
#: trip and reset also keep the state they left (``req_from``): a retry of the write, refused
#: because it applied, then still answers with the old state (operands are read before the write)
_FROM = ", req_from = if_not_exists(#st, :closed)"
#: a transition is not written twice by one request: its retry finds its own token and is refused
_NOT_MINE = "(attribute_not_exists(#req) OR #req <> :req)"
_REQ_NAMES = {"#req": REQUEST_TOKEN}
#: trip and reset start a new window generation (the failure-rate policy's counts)
_NEW_GEN = " ADD wgen :one"
#: closed (or absent) in the window generation ``:gen`` (absent ``wgen``: generation 0)
_CLOSED_STATE = "(attribute_not_exists(#st) OR #st = :closed)"


def _in_gen(gen: int) -> str:
    return "attribute_not_exists(wgen)" if gen == 0 else "wgen = :gen"


def _window(raw: Mapping[str, Any], gen: int) -> BreakerWindow:
    """The window of a raw item (its count pairs are plain Ns)."""
    return window_from_fields(
        {k: v["N"] for k, v in raw.items() if k[:2] in ("c:", "f:") and "N" in v}, gen
    )


def _as_before(item: Mapping[str, Any]) -> BreakerRecord:
    """The record a trip's or reset's first answer held: the stored one, in the state it left
    and the window generation before the one it started."""
    record = BreakerRecord.from_item(item)
    return dataclasses.replace(
        record,
        state=_state(str(item.get("req_from", _CLOSED))),
        window_gen=max(0, record.window_gen - 1),
    )


def _record(raw: Mapping[str, Any] | None) -> BreakerRecord:
    """``BreakerRecord.from_item(unmarshal(raw))`` of a raw DynamoDB item, read straight from
    the attribute values the store writes (state an S, integer Ns): no Decimal on every
    protected call. Any other form goes the general way (which decides, or raises, alike)."""
    if not raw:
        return BreakerRecord()
    get = raw.get
    try:
        state = get("state")
        failures = get("failures")
        successes = get("successes")
        opened_at_ms = get("opened_at_ms")
        trial_calls = get("trial_calls")
        trial_round = get("trial_round")
        trial_started_ms = get("trial_started_ms")
        wgen = get("wgen")
        return BreakerRecord(
            State.CLOSED if state is None else _state(state["S"]),
            0 if failures is None else int(failures["N"]),
            0 if successes is None else int(successes["N"]),
            None if opened_at_ms is None else int(opened_at_ms["N"]),
            0 if trial_calls is None else int(trial_calls["N"]),
            0 if trial_round is None else int(trial_round["N"]),
            None if trial_started_ms is None else int(trial_started_ms["N"]),
            0 if wgen is None else int(wgen["N"]),
        )
    except (KeyError, TypeError, ValueError):
        return BreakerRecord.from_item(unmarshal(raw))


class DynamoDBBreakerStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace
        #: the pk of each name (a store serves one breaker, or a few): built and checked once
        self._pks: dict[str, str] = {}
        #: the window counts each name's item held at the last window write this store saw
        self._window_names: dict[str, tuple[str, ...]] = {}

    def _key(self, name: str) -> dict[str, Any]:
        pk = self._pks.get(name) if type(name) is str else None
        if pk is None:
            pk = breaker_pk(self._ns, name)
            if type(name) is str and len(self._pks) < 64:
                self._pks[name] = pk
        return {"pk": {"S": pk}, "sk": {"S": BREAKER_SK}}

    def _update(
        self,
        name: str,
        *,
        update: str,
        condition: str | None,
        return_values: str = "NONE",
        old_on_failure: bool = False,
        names: dict[str, str] | None = None,
        attr_values: dict[str, Any],
        token: CountingToken | None = None,
        now_ms: int = 0,
        write: WindowWrite | None = None,
    ) -> dict[str, Any] | None:
        """One UpdateItem with ``attr_values`` (marshalled, as :func:`values` makes them); the
        returned attributes, raw (or {}), or None if the condition failed.

        With ``old_on_failure`` a failed condition raises ConditionFailedError carrying the item.
        """
        kwargs: dict[str, Any] = {
            "Key": self._key(name),
            "UpdateExpression": update,
            "ExpressionAttributeNames": _NAMES if names is None else {**_NAMES, **names},
            "ExpressionAttributeValues": attr_values,
            "ReturnValues": return_values,
        }
        if condition is not None:
            kwargs["ConditionExpression"] = condition
        if token is not None and write is not None:  # the slot and token of ``write``
            # breaker items have no TTL: the slots go with whoever writes next
            response = held_counting_update(self._table, write, token, now_ms, kwargs)
        elif token is not None:  # a counting write (old_on_failure): its slot and token added
            response = counting_update(self._table, token, now_ms, **kwargs)
        elif old_on_failure:
            kwargs["ReturnValuesOnConditionCheckFailure"] = "ALL_OLD"
            response = self._table.call("update_item", **kwargs)
        else:
            try:
                response = self._table.call("update_item", **kwargs)
            except ConditionFailedError:
                return None
        attributes: dict[str, Any] = response.get("Attributes", {})
        return attributes

    def get(self, name: str, *, consistent: bool = True) -> BreakerRecord:
        return _record(self._table.get_raw(self._key(name), consistent=consistent))

    def record_failure(self, name: str, now_ms: int) -> BreakerRecord | None:
        # ADD is atomic: concurrent failures all land, none is lost to a read-modify-write. The
        # request token makes a retry of an applied failure (its response lost) count once.
        token = CountingToken(now_ms, self._key(name)["pk"]["S"])
        try:
            attrs = self._update(
                name,
                condition="attribute_not_exists(pk) OR #st = :closed",
                update=(
                    "SET #st = if_not_exists(#st, :closed), updated_ms = :now ADD failures :one"
                ),
                return_values="ALL_NEW",
                old_on_failure=True,
                attr_values=values(closed=_CLOSED, now=now_ms, one=1),
                token=token,
                now_ms=now_ms,
            )
        except ConditionFailedError as failed:
            if token.applied(failed.raw):
                return BreakerRecord.from_item(failed.item)
            return None
        return None if attrs is None else _record(attrs)

    def reset_failures(self, name: str, now_ms: int) -> bool:
        attrs = self._update(
            name,
            condition="#st = :closed AND failures > :zero",
            update="SET failures = :zero, updated_ms = :now",
            attr_values=values(closed=_CLOSED, zero=0, now=now_ms),
        )
        return attrs is not None

    def trip(self, name: str, now_ms: int, min_failures: int | None) -> BreakerRecord | None:
        token = request_token()
        condition = _NOT_MINE
        attr_values = values(open=_OPEN, now=now_ms, zero=0, closed=_CLOSED, req=token, one=1)
        if min_failures is not None:
            # Closes the race "many callers saw failures >= threshold": the first write changes
            # the state to open, so every later one fails this condition and does not re-trip.
            condition += " AND #st = :closed AND failures >= :min"
            attr_values.update(values(min=min_failures))
        try:
            attrs = self._update(
                name,
                condition=condition,
                update=_OPEN_UPDATE.format(extra=_FROM) + _NEW_GEN,
                return_values="ALL_OLD",
                old_on_failure=True,
                names=_REQ_NAMES,
                attr_values=attr_values,
            )
        except ConditionFailedError as failed:
            # this very trip, applied, its answer lost: answer with the state it left
            return _as_before(failed.item) if written_by(failed.item, token) else None
        return None if attrs is None else _record(attrs)

    def add_window(
        self,
        name: str,
        now_ms: int,
        gen: int,
        counts: Mapping[int, tuple[int, int]],
        oldest: int,
        *,
        write: WindowWrite | None = None,
    ) -> BreakerWindow | None:
        # ADD: concurrent writes of many processes all land. The condition keeps counts out of
        # a window that is gone: another generation (a trip or reset since they were counted)
        # or a breaker that is not closed.
        token = CountingToken(now_ms, self._key(name)["pk"]["S"])
        names: dict[str, str] = {}
        attr_values = values(closed=_CLOSED, gen=gen) if gen else values(closed=_CLOSED)
        added = []
        written = set()
        for i, (bucket, (calls, failures)) in enumerate(sorted(counts.items())):
            names[f"#c{i}"] = window_field("c", gen, bucket)
            attr_values[f":c{i}"] = {"N": str(calls)}
            added.append(f"#c{i} :c{i}")
            written.add(names[f"#c{i}"])
            if failures:
                names[f"#f{i}"] = window_field("f", gen, bucket)
                attr_values[f":f{i}"] = {"N": str(failures)}
                added.append(f"#f{i} :f{i}")
                written.add(names[f"#f{i}"])
        update = "ADD " + ", ".join(added)
        stale = [
            n
            for n in stale_window_names(self._window_names.get(name, ()), gen, oldest)
            if n not in written
        ]
        if stale:
            for i, stale_name in enumerate(stale):
                names[f"#x{i}"] = stale_name
            update += " REMOVE " + ", ".join(f"#x{i}" for i in range(len(stale)))
        try:
            attrs = self._update(
                name,
                condition=f"{_CLOSED_STATE} AND {_in_gen(gen)}",
                update=update,
                return_values="ALL_NEW",
                old_on_failure=True,
                names=names,
                attr_values=attr_values,
                token=token,
                now_ms=now_ms,
                write=write,
            )
        except ConditionFailedError as failed:
            window = _window(failed.raw or {}, gen)
            self._remember(name, window)
            # this very write, applied, its answer lost: the window as stored
            return window if token.applied(failed.raw) else None
        window = _window(attrs or {}, gen)
        self._remember(name, window)
        return window

    def _remember(self, name: str, window: BreakerWindow) -> None:
        """Keep the window counts an item holds, to drop the stale ones on the next write."""
        if len(self._window_names) < 64 or name in self._window_names:
            self._window_names[name] = window.names

    def trip_window(self, name: str, now_ms: int, gen: int) -> BreakerRecord | None:
        token = request_token()
        attr_values = values(open=_OPEN, now=now_ms, zero=0, closed=_CLOSED, req=token, one=1)
        if gen:
            attr_values.update(values(gen=gen))
        try:
            attrs = self._update(
                name,
                # of the processes that saw this generation's window cross the threshold, the
                # first one's write starts a new generation: every later one is refused
                condition=f"{_NOT_MINE} AND {_CLOSED_STATE} AND {_in_gen(gen)}",
                update=_OPEN_UPDATE.format(extra=_FROM) + _NEW_GEN,
                return_values="ALL_OLD",
                old_on_failure=True,
                names=_REQ_NAMES,
                attr_values=attr_values,
            )
        except ConditionFailedError as failed:
            return _as_before(failed.item) if written_by(failed.item, token) else None
        return None if attrs is None else _record(attrs)

    def start_trial(self, name: str, now_ms: int, cutoff_ms: int) -> StartTrialResult:
        token = request_token()
        try:
            attrs = self._update(
                name,
                # Open long enough, or half-open whose last slot lease ran out. Only one caller
                # can make this write: afterwards the item is half_open with a fresh
                # trial_started_ms, which fails both branches for everyone else.
                condition=(
                    "(#st = :open AND opened_at_ms <= :cutoff) OR "
                    "(#st = :half AND trial_started_ms <= :cutoff)"
                ),
                update=(
                    "SET #st = :half, trial_calls = :one, successes = :zero, "
                    "trial_started_ms = :now, updated_ms = :now, #req = :req "
                    "ADD trial_round :one"
                ),
                return_values="ALL_NEW",
                old_on_failure=True,
                names={"#req": REQUEST_TOKEN},
                attr_values=values(
                    req=token,
                    open=_OPEN,
                    half=_HALF,
                    cutoff=cutoff_ms,
                    now=now_ms,
                    one=1,
                    zero=0,
                ),
            )
        except ConditionFailedError as failed:
            if written_by(failed.item, token):
                # A retry of this very write whose first response was lost: the slot is ours.
                return StartTrialResult(BreakerRecord.from_item(failed.item))
            return StartTrialResult(None, BreakerRecord.from_item(failed.item))
        return StartTrialResult(_record(attrs))

    def join_trial(
        self, name: str, trial_round: int, now_ms: int, cutoff_ms: int, max_calls: int
    ) -> BreakerRecord | None:
        # a slot is a count (trial_calls + 1): a counting token makes a retry take it once
        token = CountingToken(now_ms, self._key(name)["pk"]["S"])
        try:
            attrs = self._update(
                name,
                condition=(
                    "#st = :half AND trial_round = :round AND trial_calls < :max "
                    "AND trial_started_ms > :cutoff"
                ),
                update="SET trial_started_ms = :now, updated_ms = :now ADD trial_calls :one",
                return_values="ALL_NEW",
                old_on_failure=True,
                attr_values=values(
                    half=_HALF,
                    round=trial_round,
                    max=max_calls,
                    cutoff=cutoff_ms,
                    now=now_ms,
                    one=1,
                ),
                token=token,
                now_ms=now_ms,
            )
        except ConditionFailedError as failed:
            # this very join, applied, its answer lost: the slot is the caller's
            return BreakerRecord.from_item(failed.item) if token.applied(failed.raw) else None
        return None if attrs is None else _record(attrs)

    def trial_success(self, name: str, trial_round: int, now_ms: int) -> BreakerRecord | None:
        # counted once, also when the answer was lost
        token = CountingToken(now_ms, self._key(name)["pk"]["S"])
        try:
            attrs = self._update(
                name,
                condition="#st = :half AND trial_round = :round",
                update="SET updated_ms = :now ADD successes :one, trial_calls :minus",
                return_values="ALL_NEW",
                old_on_failure=True,
                attr_values=values(half=_HALF, round=trial_round, now=now_ms, one=1, minus=-1),
                token=token,
                now_ms=now_ms,
            )
        except ConditionFailedError as failed:
            return BreakerRecord.from_item(failed.item) if token.applied(failed.raw) else None
        return None if attrs is None else _record(attrs)

    def _end_round(
        self, name: str, trial_round: int, now_ms: int, update: str, **state: str
    ) -> bool:
        """Close or reopen a breaker still half-open in ``trial_round``: False when a later round
        or another process's transition came first; True for this very write, also when its
        answer was lost (the retry finds its own token)."""
        token = request_token()
        try:
            self._update(
                name,
                condition="#st = :half AND trial_round = :round",
                update=update.format(extra=""),
                old_on_failure=True,
                names=_REQ_NAMES,
                attr_values=values(
                    half=_HALF,
                    round=trial_round,
                    now=now_ms,
                    zero=0,
                    req=token,
                    **state,  # :closed or :open, the state it writes
                ),
            )
        except ConditionFailedError as failed:
            return written_by(failed.item, token)
        return True

    def close(self, name: str, trial_round: int, now_ms: int) -> bool:
        return self._end_round(name, trial_round, now_ms, _CLOSED_UPDATE, closed=_CLOSED)

    def reopen(self, name: str, trial_round: int, now_ms: int) -> bool:
        return self._end_round(name, trial_round, now_ms, _OPEN_UPDATE, open=_OPEN)

    def reset(self, name: str, now_ms: int) -> BreakerRecord | None:
        # Not a delete: trial_round is kept, so the next trial starts round N+1 and any outcome
        # still to come from a round started before the reset fails its round condition.
        token = request_token()
        try:
            attrs = self._update(
                name,
                # an absent breaker is already closed: write nothing
                condition=f"attribute_exists(pk) AND {_NOT_MINE}",
                update=_CLOSED_UPDATE.format(extra=_FROM) + _NEW_GEN,
                return_values="ALL_OLD",
                old_on_failure=True,
                names=_REQ_NAMES,
                attr_values=values(closed=_CLOSED, zero=0, now=now_ms, req=token, one=1),
            )
        except ConditionFailedError as failed:
            # this very reset, applied, its answer lost: answer with the state it left
            return _as_before(failed.item) if written_by(failed.item, token) else None
        return _record(attrs) if attrs else None
