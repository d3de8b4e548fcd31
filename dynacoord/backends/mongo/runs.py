"""The workflow-run store on MongoDB.

Document: ``pk=RUN#{ns}#{run_id}``, ``sk=RUN``, ``gsi1pk=RUN#{ns}#{status}``,
``gsi1sk={updated_ms:015d}#{run_id}``, ``run_id``, ``status``, ``ctx`` (field name -> codec text),
``created_ms``, ``updated_ms``, ``end_ttl_ms``, ``reconciles``, and once ended ``ended_ms``,
``result`` or ``error``, ``expires_at_ms`` and ``expires_at`` (TTL monitor only).

Context field names may be any string, but MongoDB reads ``.`` as a path separator and ``$`` as
an operator, so names are stored percent-escaped (``%`` -> ``%25``, ``.`` -> ``%2E``, ``$`` ->
``%24``, NUL -> ``%00``) and unescaped on read.

Every write is one ``find_one_and_update`` filtered on "running" that moves ``gsi1pk``/``gsi1sk``
with the change, so the (gsi1pk, gsi1sk) index lists a run under its current status. ``finish``
computes ``expires_at_ms = end_ttl_ms + now`` in the same atomic write (a pipeline update); the
TTL-monitor date is then set by a second, unconditional write on the ended run (garbage
collection only: if it is lost the run is still treated as expired at ``expires_at_ms``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pymongo
from pymongo import ReturnDocument

from ... import codec
from ..._items import is_live
from ...errors import RunExistsError
from ...keys import run_index_pk, run_index_sk, run_key, time_sk_bound
from ...runs import Run, RunPage, RunStatus, new_run_fields, write_refused
from ._collection import MongoCollection, literal, request_token

__all__ = ["MongoRunStore"]

_ESCAPES = (("%", "%25"), (".", "%2E"), ("$", "%24"), ("\x00", "%00"))


def _escape(name: str) -> str:
    for raw, escaped in _ESCAPES:
        name = name.replace(raw, escaped)
    return name


def _unescape(name: str) -> str:
    for raw, escaped in reversed(_ESCAPES):
        name = name.replace(escaped, raw)
    return name


def _run(doc: Mapping[str, Any]) -> Run:
    ctx = doc.get("ctx") or {}
    return Run.from_item(doc, {_unescape(str(name)): text for name, text in ctx.items()})


class MongoRunStore:
    def __init__(self, coll: MongoCollection, namespace: str) -> None:
        self._coll = coll
        self._ns = namespace

    def _key(self, run_id: str) -> dict[str, Any]:
        return run_key(self._ns, run_id, status="running", updated_ms=0).primary

    def _refused(self, run_id: str, now_ms: int, what: str) -> Exception:
        doc = self._coll.call(what, "find_one", self._key(run_id))
        return write_refused(run_id, doc, now_ms)

    def create(
        self, run_id: str, context: Mapping[str, Any], ttl_after_end_ms: int, now_ms: int
    ) -> Run:
        key = run_key(self._ns, run_id, status=RunStatus.RUNNING.value, updated_ms=now_ms)
        ctx = {name: codec.encode(value) for name, value in context.items()}
        # Same size limit as the DynamoDB item, so a run fits every backend.
        codec.check_item_size({**key.as_dict(), "run_id": run_id, "ctx": ctx}, key=run_id)
        doc: dict[str, Any] = {
            **key.as_dict(),
            **new_run_fields(run_id, ttl_after_end_ms, now_ms),
            "ctx": {_escape(name): text for name, text in ctx.items()},
        }
        # A finished run past its TTL is absent even if the TTL monitor has not run.
        if not self._coll.replace_if_free(key.primary, doc, now_ms, "run start"):
            raise RunExistsError(f"run {run_id!r} already exists", run_id=run_id)
        return _run(doc)

    def get(self, run_id: str, now_ms: int) -> Run | None:
        doc = self._coll.call("run get", "find_one", self._key(run_id))
        return _run(doc) if doc and is_live(doc, now_ms) else None

    def _applied(self, run_id: str, token: str, what: str) -> dict[str, Any] | None:
        """The run as this very write left it, if the write applied before (its response lost
        and retried: the retry matched nothing), else None."""
        doc: dict[str, Any] | None = self._coll.call(
            what, "find_one", {**self._key(run_id), "req": token}
        )
        return doc

    def update(
        self,
        run_id: str,
        now_ms: int,
        *,
        set_fields: Mapping[str, Any] | None = None,
        remove_fields: Sequence[str] = (),
        reconciled: bool = False,
    ) -> Run:
        sets: dict[str, Any] = {"updated_ms": now_ms, "gsi1sk": run_index_sk(now_ms, run_id)}
        for name, value in (set_fields or {}).items():
            sets[f"ctx.{_escape(name)}"] = codec.encode(value)
        update: dict[str, Any] = {"$set": sets}
        if remove_fields:
            update["$unset"] = {f"ctx.{_escape(name)}": "" for name in remove_fields}
        if reconciled:
            update["$inc"] = {"reconciles": 1}
        token = sets["req"] = request_token()
        doc = self._coll.call(
            "run update",
            "find_one_and_update",
            {**self._key(run_id), "status": RunStatus.RUNNING.value, "req": {"$ne": token}},
            update,
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            doc = self._applied(run_id, token, "run update")
        if doc is None:
            raise self._refused(run_id, now_ms, "run update")
        return _run(doc)

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> Run:
        stage: dict[str, Any] = {
            "status": literal(status.value),
            "gsi1pk": literal(run_index_pk(self._ns, status.value)),
            "gsi1sk": literal(run_index_sk(now_ms, run_id)),
            "updated_ms": literal(now_ms),
            "ended_ms": literal(now_ms),
            "expires_at_ms": {"$add": [{"$ifNull": ["$end_ttl_ms", 0]}, literal(now_ms)]},
        }
        if status is RunStatus.COMPLETED:
            stage["result"] = literal(codec.encode(result))
        else:
            stage["error"] = literal(error or "")
        token = request_token()
        stage["req"] = literal(token)
        doc = self._coll.call(
            "run finish",
            "find_one_and_update",
            {**self._key(run_id), "status": RunStatus.RUNNING.value},
            [{"$set": stage}],
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            doc = self._applied(run_id, token, "run finish")
        if doc is None:
            raise self._refused(run_id, now_ms, "run finish")
        expires = int(doc["expires_at_ms"])
        self._coll.call(
            "run finish",
            "update_one",
            {**self._key(run_id), "ended_ms": now_ms},
            {"$set": {"expires_at": self._coll.gc_date(expires, now_ms)}},
        )
        return _run(doc)

    def query(
        self, status: RunStatus, before_ms: int | None, page_size: int, cursor: Any, now_ms: int
    ) -> RunPage:
        sk: dict[str, Any] = {}
        if before_ms is not None:
            # Every run updated at before_ms or later sorts at or above the bare padded number.
            sk["$lt"] = time_sk_bound(max(before_ms, 0))
        if cursor is not None:
            sk["$gt"] = str(cursor)
        query: dict[str, Any] = {"gsi1pk": run_index_pk(self._ns, status.value)}
        if sk:
            query["gsi1sk"] = sk
        docs = self._coll.find(
            "run query", query, sort=("gsi1sk", pymongo.ASCENDING), limit=page_size + 1
        )
        more = len(docs) > page_size
        docs = docs[:page_size]
        runs = [_run(d) for d in docs if is_live(d, now_ms) and d.get("status") == status.value]
        return RunPage(runs, str(docs[-1]["gsi1sk"]) if more else None)
