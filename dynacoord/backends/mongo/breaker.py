"""The circuit-breaker store on MongoDB.

Document: ``pk=CB#{ns}#{name}``, ``sk=CB``, ``state``, ``failures``, ``successes``,
``opened_at_ms``, ``trial_round``, ``trial_calls``, ``trial_started_ms``, ``updated_ms``; no
expiry. Absent means closed with no failures; ``reset`` closes the document in place (never
deletes it) so that ``trial_round`` never goes back.

Every transition is one ``find_one_and_update``/``update_one`` whose filter is the state it
leaves (the DynamoDB store's conditions), and counters use ``$inc``. ``record_failure`` upserts:
when two first failures race on a breaker that has no document yet, one insert wins and the other
gets ``DuplicateKeyError``; it then retries as a plain update, so both failures are counted.
"""

from __future__ import annotations

from typing import Any

from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from ...breaker import BreakerRecord, StartTrialResult, State
from ...keys import breaker_key
from ._collection import (
    COUNT_TOKENS_KEPT,
    MongoCollection,
    counted,
    counting_token,
    request_token,
    translate_errors,
)

__all__ = ["MongoBreakerStore"]

_UPSERT_ATTEMPTS = 3
_CLOSED, _OPEN, _HALF = State.CLOSED.value, State.OPEN.value, State.HALF_OPEN.value


def _open(now_ms: int) -> dict[str, Any]:
    """The update that opens the breaker now (trip and a failed trial round)."""
    return {
        "$set": {
            "state": _OPEN,
            "opened_at_ms": now_ms,
            "successes": 0,
            "trial_calls": 0,
            "updated_ms": now_ms,
        },
        "$unset": {"trial_started_ms": ""},
    }


def _close(now_ms: int) -> dict[str, Any]:
    """The update that closes the breaker with no failures (a successful trial round and reset);
    ``trial_round`` is kept."""
    return {
        "$set": {
            "state": _CLOSED,
            "failures": 0,
            "successes": 0,
            "trial_calls": 0,
            "updated_ms": now_ms,
        },
        "$unset": {"opened_at_ms": "", "trial_started_ms": ""},
    }


class MongoBreakerStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._c = coll.collection
        self._ns = namespace

    def _key(self, name: str) -> dict[str, Any]:
        return breaker_key(self._ns, name).primary

    def _modify(
        self,
        name: str,
        condition: dict[str, Any],
        update: dict[str, Any],
        what: str,
        *,
        after: bool = True,
        upsert: bool = False,
    ) -> dict[str, Any] | None:
        """One find_one_and_update; with ``upsert`` a duplicate-key race is retried."""
        for attempt in range(_UPSERT_ATTEMPTS):
            try:
                with translate_errors(what):
                    doc: dict[str, Any] | None = self._c.find_one_and_update(
                        {**self._key(name), **condition},
                        update,
                        upsert=upsert,
                        return_document=ReturnDocument.AFTER if after else ReturnDocument.BEFORE,
                    )
                return doc
            except DuplicateKeyError:
                # The document exists but did not match: either it is in another state (the
                # answer is "no"), or it was inserted by a racing upsert a moment ago (try again
                # as an update).
                if attempt == _UPSERT_ATTEMPTS - 1:
                    return None
        return None

    def get(self, name: str) -> BreakerRecord:
        with translate_errors("breaker get"):
            return BreakerRecord.from_item(self._c.find_one(self._key(name)))

    def record_failure(self, name: str, now_ms: int) -> BreakerRecord | None:
        # The request token makes a retried failure (its first response lost) count once.
        token = counting_token()
        doc = self._modify(
            name,
            {"state": _CLOSED, "rq": {"$ne": token}},
            {
                "$set": {"updated_ms": now_ms},
                "$inc": {"failures": 1},
                "$push": {"rq": {"$each": [token], "$slice": -COUNT_TOKENS_KEPT}},
            },
            "breaker record_failure",
            upsert=True,
        )
        if doc is None:
            current = self._c.find_one(self._key(name))
            return BreakerRecord.from_item(current) if counted(current, token) else None
        return BreakerRecord.from_item(doc)

    def reset_failures(self, name: str, now_ms: int) -> bool:
        with translate_errors("breaker reset_failures"):
            result = self._c.update_one(
                {**self._key(name), "state": _CLOSED, "failures": {"$gt": 0}},
                {"$set": {"failures": 0, "updated_ms": now_ms}},
            )
        return bool(result.matched_count == 1)

    def trip(self, name: str, now_ms: int, min_failures: int | None) -> BreakerRecord | None:
        update = _open(now_ms)
        if min_failures is None:
            # Unconditional (operator action): creates the document if there is none.
            old = self._modify(name, {}, update, "breaker trip", after=False, upsert=True)
            return BreakerRecord.from_item(old)
        condition = {"state": _CLOSED, "failures": {"$gte": min_failures}}
        old = self._modify(name, condition, update, "breaker trip", after=False)
        return None if old is None else BreakerRecord.from_item(old)

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
        with translate_errors("breaker get"):
            current = self._c.find_one(self._key(name))
        if current is not None and current.get("state") == _HALF and current.get("req") == token:
            # A retry of this very start whose first response was lost: the slot is ours.
            return StartTrialResult(BreakerRecord.from_item(current))
        return StartTrialResult(None, BreakerRecord.from_item(current))

    def join_trial(
        self, name: str, trial_round: int, now_ms: int, cutoff_ms: int, max_calls: int
    ) -> BreakerRecord | None:
        doc = self._modify(
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
        )
        return None if doc is None else BreakerRecord.from_item(doc)

    def trial_success(self, name: str, trial_round: int, now_ms: int) -> BreakerRecord | None:
        doc = self._modify(
            name,
            {"state": _HALF, "trial_round": trial_round},
            {"$set": {"updated_ms": now_ms}, "$inc": {"successes": 1, "trial_calls": -1}},
            "breaker trial_success",
        )
        return None if doc is None else BreakerRecord.from_item(doc)

    def close(self, name: str, trial_round: int, now_ms: int) -> bool:
        with translate_errors("breaker close"):
            result = self._c.update_one(
                {**self._key(name), "state": _HALF, "trial_round": trial_round}, _close(now_ms)
            )
        return bool(result.matched_count == 1)

    def reopen(self, name: str, trial_round: int, now_ms: int) -> bool:
        with translate_errors("breaker reopen"):
            result = self._c.update_one(
                {**self._key(name), "state": _HALF, "trial_round": trial_round},
                _open(now_ms),
            )
        return bool(result.matched_count == 1)

    def reset(self, name: str, now_ms: int) -> BreakerRecord | None:
        # Not a delete: trial_round is kept, so the next trial starts a new round and any outcome
        # still to come from a round started before the reset fails its round filter. No upsert:
        # an absent breaker is already closed.
        with translate_errors("breaker reset"):
            old: dict[str, Any] | None = self._c.find_one_and_update(
                self._key(name), _close(now_ms), return_document=ReturnDocument.BEFORE
            )
        return None if old is None else BreakerRecord.from_item(old)
