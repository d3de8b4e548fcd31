"""The circuit-breaker store on MongoDB.

Document: ``pk=CB#{ns}#{name}``, ``sk=CB``, ``state``, ``failures``, ``successes``,
``opened_at_ms``, ``trial_round``, ``trial_calls``, ``trial_started_ms``, ``updated_ms``, ``req``,
``req_from``, ``rq``; no expiry. Absent means closed with no failures; ``reset`` closes the
document in place (never deletes it) so that ``trial_round`` never goes back.

Every transition is one ``find_one_and_update``/``update_one`` whose filter is the state it
leaves (the DynamoDB store's conditions), and counters use ``$inc``. ``record_failure`` upserts:
when two first failures race on a breaker that has no document yet, one insert wins and the other
gets ``DuplicateKeyError``; it then writes once more as a plain update, so both failures are
counted.

Lost responses (pymongo re-sends a write whose response was lost after it applied): every
transition (``start_trial``, ``trip``, ``reset``, ``close``, ``reopen``) stores its call's fresh
request token ``req``, and its retry is refused (by the state filter, or by ``req`` ``$ne`` the
token, which makes the otherwise unconditional ``trip()`` and ``reset`` apply once). ``trip`` and
``reset`` also store ``req_from``, the state they left (closed when there was no document),
taken from the document in the same write (a pipeline update). A refused transition reads the
document once: when ``req`` is its own token the write was its own, and it answers as the first
response would have (``trip``/``reset``: the stored record in state ``req_from``).
``record_failure``, ``join_trial`` and ``trial_success`` carry a counting token kept in ``rq``
(one slot per writer in ``w``, see ``_collection.CountingToken``), so a retry counts once
and answers with the stored record.

The failure-rate policy's window: ``wgen`` (its generation, one more at every trip and reset)
and ``c:{gen}:{bucket}``/``f:{gen}:{bucket}`` (calls and failures of one bucket), added with
``$inc`` by ``add_window`` (a counting write too), which also ``$unset``s the pairs the last
window write showed that no window needs any more (another generation, or aged out).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ...breaker import (
    BreakerRecord,
    BreakerWindow,
    StartTrialResult,
    State,
    WindowWrite,
    stale_window_names,
    window_field,
    window_from_fields,
)
from ...keys import breaker_key
from ._collection import (
    COUNT_WINDOW_MS,
    CountingToken,
    MongoCollection,
    literal,
    request_token,
)

__all__ = ["MongoBreakerStore"]

_CLOSED, _OPEN, _HALF = State.CLOSED.value, State.OPEN.value, State.HALF_OPEN.value


def _held_token(write: WindowWrite, now_ms: int) -> CountingToken:
    """A counting token carrying the slot and token ``write`` holds across its sends (no slot of
    its own: :meth:`CountingToken.release` gives nothing back, the breaker does)."""
    return CountingToken(now_ms, held=write.take(now_ms, COUNT_WINDOW_MS))


def _stamped(
    fields: dict[str, Any], removed: tuple[str, ...], token: str, note_prior: bool
) -> list[dict[str, Any]]:
    """A pipeline update: set ``fields``, remove ``removed``, store the request token ``req``
    and, with ``note_prior``, ``req_from``. A pipeline because ``req_from`` is read from the
    document in the same write (``$state`` is evaluated on the document as it was)."""
    stage = {field: literal(value) for field, value in fields.items()}
    stage["req"] = literal(token)
    if note_prior:
        stage["req_from"] = {"$ifNull": ["$state", literal(_CLOSED)]}
        # a trip or reset starts a new window generation (the failure-rate policy's counts)
        stage["wgen"] = {"$add": [{"$ifNull": ["$wgen", 0]}, 1]}
    # $project, not the $unset stage: the same in MongoDB, and mongomock only knows $project.
    return [{"$set": stage}, {"$project": dict.fromkeys(removed, 0)}]


def _open(now_ms: int, token: str, *, note_prior: bool = False) -> list[dict[str, Any]]:
    """The update that opens the breaker now (trip and a failed trial round)."""
    fields = {
        "state": _OPEN,
        "opened_at_ms": now_ms,
        "successes": 0,
        "trial_calls": 0,
        "updated_ms": now_ms,
    }
    return _stamped(fields, ("trial_started_ms",), token, note_prior)


def _close(now_ms: int, token: str, *, note_prior: bool = False) -> list[dict[str, Any]]:
    """The update that closes the breaker with no failures (a successful trial round and reset);
    ``trial_round`` is kept."""
    fields = {
        "state": _CLOSED,
        "failures": 0,
        "successes": 0,
        "trial_calls": 0,
        "updated_ms": now_ms,
    }
    return _stamped(fields, ("opened_at_ms", "trial_started_ms"), token, note_prior)


class MongoBreakerStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace
        #: the window counts each name's document held at the last window write seen
        self._window_names: dict[str, tuple[str, ...]] = {}

    def _key(self, name: str) -> dict[str, Any]:
        return breaker_key(self._ns, name).primary

    def _stored(self, name: str, what: str) -> dict[str, Any] | None:
        doc: dict[str, Any] | None = self._coll.call(what, "find_one", self._key(name))
        return doc

    def _own(self, name: str, token: str, what: str) -> dict[str, Any] | None:
        """The stored document if its last transition carries ``token``: this call's write,
        applied by an attempt whose response was lost (read only on a refusal)."""
        doc = self._stored(name, what)
        return doc if doc is not None and doc.get("req") == token else None

    def _find_and_update(
        self,
        query: dict[str, Any],
        update: dict[str, Any] | list[dict[str, Any]],
        what: str,
        *,
        upsert: bool,
        document: bool,  # ReturnDocument.BEFORE or AFTER
    ) -> tuple[bool, dict[str, Any] | None]:
        """One find_one_and_update: (applied, the document ``document`` names). With ``upsert``,
        a duplicate-key refusal is tried once more as a plain update."""
        for insert in (upsert, False):
            try:
                doc: dict[str, Any] | None = self._coll.call(
                    what,
                    "find_one_and_update",
                    query,
                    update,
                    upsert=insert,
                    return_document=document,
                )
            except DuplicateKeyError:
                # The document exists but did not match: either it is in another state (the
                # answer is "no"), or a racing upsert inserted it a moment ago. It exists now,
                # so a plain filtered update tells which.
                continue
            # an upsert that raised nothing matched or inserted (BEFORE an insert is None)
            return doc is not None or insert, doc
        return False, None

    def _modify(
        self,
        name: str,
        condition: dict[str, Any],
        update: dict[str, Any],
        what: str,
        *,
        upsert: bool = False,
    ) -> dict[str, Any] | None:
        """The document after the write (None: refused)."""
        _, doc = self._find_and_update(
            {**self._key(name), **condition},
            update,
            what,
            upsert=upsert,
            document=ReturnDocument.AFTER,
        )
        return doc

    def _count(
        self,
        name: str,
        condition: dict[str, Any],
        update: dict[str, Any],
        what: str,
        *,
        now_ms: int,
        upsert: bool = False,
    ) -> BreakerRecord | None:
        """A counting write: its token in ``rq`` makes a retry (its first response lost) count
        once; the record after the write, or as stored when the retry is recognised."""
        token = CountingToken(now_ms)
        sets = {**update.get("$set", {}), token.field: token.token}
        try:
            doc = self._modify(
                name,
                {**condition, **token.unapplied},
                {**update, "$set": sets},
                what,
                upsert=upsert,
            )
        finally:
            token.release()
        if doc is None:
            current = self._stored(name, what)
            return BreakerRecord.from_item(current) if token.applied(current) else None
        self._coll.drop_stale_slots(self._key(name), doc, now_ms, what)
        return BreakerRecord.from_item(doc)

    def _transition(
        self,
        name: str,
        condition: dict[str, Any],
        update: list[dict[str, Any]],
        token: str,
        what: str,
        *,
        upsert: bool = False,
    ) -> BreakerRecord | None:
        """A trip or reset stamped with ``token``: the record as it was before (with ``upsert``,
        closed when there was no document), or None when refused. A refusal by this call's own
        write (applied by an attempt whose response was lost) answers what that attempt would
        have: the stored record in the state it left (``req_from``)."""
        applied, old = self._find_and_update(
            {**self._key(name), **condition, "req": {"$ne": token}},
            update,
            what,
            upsert=upsert,
            document=ReturnDocument.BEFORE,
        )
        if applied:
            return BreakerRecord.from_item(old)
        own = self._own(name, token, what)
        if own is None:
            return None
        # as it was: the state it left, the window generation before the one it started
        before = {"state": own.get("req_from", _CLOSED), "wgen": max(0, own.get("wgen", 1) - 1)}
        return BreakerRecord.from_item({**own, **before})

    def _outcome(
        self, name: str, trial_round: int, update: list[dict[str, Any]], token: str, what: str
    ) -> bool:
        """A trial round's close or reopen stamped with ``token``: True when it applied, also
        when the refusal shows this call's own write (applied, its first response lost)."""
        result = self._coll.call(
            what,
            "update_one",
            {
                **self._key(name),
                "state": _HALF,
                "trial_round": trial_round,
                "req": {"$ne": token},
            },
            update,
        )
        return result.matched_count == 1 or self._own(name, token, what) is not None

    def get(self, name: str, *, consistent: bool = True) -> BreakerRecord:
        # reads here are always consistent: ``consistent`` changes nothing
        return BreakerRecord.from_item(self._stored(name, "breaker get"))

    def record_failure(self, name: str, now_ms: int) -> BreakerRecord | None:
        return self._count(
            name,
            {"state": _CLOSED},
            {"$set": {"updated_ms": now_ms}, "$inc": {"failures": 1}},
            "breaker record_failure",
            upsert=True,
            now_ms=now_ms,
        )

    def reset_failures(self, name: str, now_ms: int) -> bool:
        result = self._coll.call(
            "breaker reset_failures",
            "update_one",
            {**self._key(name), "state": _CLOSED, "failures": {"$gt": 0}},
            {"$set": {"failures": 0, "updated_ms": now_ms}},
        )
        return bool(result.matched_count == 1)

    def trip(self, name: str, now_ms: int, min_failures: int | None) -> BreakerRecord | None:
        token = request_token()
        update = _open(now_ms, token, note_prior=True)
        if min_failures is None:
            # Unconditional (operator action): creates the document if there is none.
            return self._transition(name, {}, update, token, "breaker trip", upsert=True)
        condition = {"state": _CLOSED, "failures": {"$gte": min_failures}}
        return self._transition(name, condition, update, token, "breaker trip")

    def start_trial(self, name: str, now_ms: int, cutoff_ms: int) -> StartTrialResult:
        token = request_token()
        condition = {
            "$or": [
                {"state": _OPEN, "opened_at_ms": {"$lte": cutoff_ms}},
                {"state": _HALF, "trial_started_ms": {"$lte": cutoff_ms}},
            ]
        }
        update = {
            "$set": {
                "state": _HALF,
                "trial_calls": 1,
                "successes": 0,
                "trial_started_ms": now_ms,
                "updated_ms": now_ms,
                "req": token,
            },
            "$inc": {"trial_round": 1},
        }
        doc = self._modify(name, condition, update, "breaker start_trial")
        if doc is not None:
            return StartTrialResult(BreakerRecord.from_item(doc))
        current = self._coll.call("breaker get", "find_one", self._key(name))
        if current is not None and current.get("state") == _HALF and current.get("req") == token:
            # A retry of this very start whose first response was lost: the slot is ours.
            return StartTrialResult(BreakerRecord.from_item(current))
        return StartTrialResult(None, BreakerRecord.from_item(current))

    def join_trial(
        self, name: str, trial_round: int, now_ms: int, cutoff_ms: int, max_calls: int
    ) -> BreakerRecord | None:
        return self._count(
            name,
            {
                "state": _HALF,
                "trial_round": trial_round,
                "trial_calls": {"$lt": max_calls},
                "trial_started_ms": {"$gt": cutoff_ms},
            },
            {
                "$set": {"trial_started_ms": now_ms, "updated_ms": now_ms},
                "$inc": {"trial_calls": 1},
            },
            "breaker join_trial",
            now_ms=now_ms,
        )

    def trial_success(self, name: str, trial_round: int, now_ms: int) -> BreakerRecord | None:
        return self._count(
            name,
            {"state": _HALF, "trial_round": trial_round},
            {"$set": {"updated_ms": now_ms}, "$inc": {"successes": 1, "trial_calls": -1}},
            "breaker trial_success",
            now_ms=now_ms,
        )

    def close(self, name: str, trial_round: int, now_ms: int) -> bool:
        token = request_token()
        return self._outcome(name, trial_round, _close(now_ms, token), token, "breaker close")

    def reopen(self, name: str, trial_round: int, now_ms: int) -> bool:
        token = request_token()
        return self._outcome(name, trial_round, _open(now_ms, token), token, "breaker reopen")

    def reset(self, name: str, now_ms: int) -> BreakerRecord | None:
        # Not a delete: trial_round is kept, so the next trial starts a new round and any outcome
        # still to come from a round started before the reset fails its round filter. No upsert:
        # an absent breaker is already closed.
        token = request_token()
        update = _close(now_ms, token, note_prior=True)
        return self._transition(name, {}, update, token, "breaker reset")

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
        inc: dict[str, int] = {}
        for bucket, (calls, failures) in counts.items():
            inc[window_field("c", gen, bucket)] = calls
            if failures:
                inc[window_field("f", gen, bucket)] = failures
        update: dict[str, Any] = {"$set": {}, "$inc": inc}
        stale = [
            n
            for n in stale_window_names(self._window_names.get(name, ()), gen, oldest)
            if n not in inc
        ]
        if stale:
            update["$unset"] = dict.fromkeys(stale, "")
        # generation 0 is a document that no trip or reset has touched: no ``wgen`` yet
        in_gen: dict[str, Any] = {"wgen": gen} if gen else {"wgen": {"$exists": False}}
        token = CountingToken(now_ms) if write is None else _held_token(write, now_ms)
        try:
            doc = self._modify(
                name,
                {"state": _CLOSED, **in_gen, **token.unapplied},
                {**update, "$set": {token.field: token.token}},
                "breaker add_window",
                upsert=True,
            )
        finally:
            token.release()
        if doc is None:
            current = self._stored(name, "breaker add_window")
            window = window_from_fields(current or {}, gen)
            self._remember(name, window)
            return window if token.applied(current) else None
        self._coll.drop_stale_slots(self._key(name), doc, now_ms, "breaker add_window")
        window = window_from_fields(doc, gen)
        self._remember(name, window)
        return window

    def _remember(self, name: str, window: BreakerWindow) -> None:
        """Keep the window counts a document holds, to drop the stale ones on the next write."""
        if len(self._window_names) < 64 or name in self._window_names:
            self._window_names[name] = window.names

    def trip_window(self, name: str, now_ms: int, gen: int) -> BreakerRecord | None:
        token = request_token()
        in_gen: dict[str, Any] = {"wgen": gen} if gen else {"wgen": {"$exists": False}}
        update = _open(now_ms, token, note_prior=True)
        return self._transition(
            name, {"state": _CLOSED, **in_gen}, update, token, "breaker trip_window"
        )
