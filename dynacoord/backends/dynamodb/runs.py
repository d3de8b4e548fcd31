"""The workflow-run store on the single table.

Item: ``pk=RUN#{ns}#{run_id}``, ``sk=RUN``, ``gsi1pk=RUN#{ns}#{status}``,
``gsi1sk={updated_ms:015d}#{run_id}``, ``run_id``, ``status``, ``ctx`` (a map of field name to
codec-encoded JSON text, so floats, Decimals and bytes round-trip), ``created_ms``, ``updated_ms``,
``end_ttl_ms``/``end_ttl_s`` (the TTL after the end, kept from ``start``), and once ended
``ended_ms``, ``result`` (codec text) or ``error``, ``expires_at_ms`` and ``ttl``.

Every write sets ``updated_ms`` and ``gsi1sk`` together (and ``gsi1pk`` when the status changes),
so the index always lists a run under its current status, ordered by its last update. A running
run has no ``expires_at_ms``: it never expires while running.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from decimal import Decimal
from functools import lru_cache
from typing import Any

from ... import codec
from ..._items import is_live
from ...errors import RunExistsError
from ...keys import RUN_SK, run_index_pk, run_index_sk, run_key, run_pk, time_sk_bound
from ...runs import (
    CheckedFields,
    Run,
    RunPage,
    RunStatus,
    _new_run,
    _status,
    write_refused,
)
from ._marshal import unmarshal, unmarshal_only
from ._table import REQUEST_TOKEN, ConditionFailedError, DynamoTable, request_token, written_by

__all__ = ["DynamoDBRunStore"]

_INDEX = "gsi1"

#: each status as the plain str it is stored as (an enum's ``.value`` is a Python-level property)
_STATUS_TEXT = {status: status.value for status in RunStatus}
_STATUS_BY_TEXT = {text: status for status, text in _STATUS_TEXT.items()}
_RUNNING = _STATUS_TEXT[RunStatus.RUNNING]

#: what a Run is read from (the keys, index keys, request token and end TTLs are left as they are)
_RUN_ATTRIBUTES = (
    "run_id",
    "status",
    "ctx",
    "created_ms",
    "updated_ms",
    "result",
    "error",
    "ended_ms",
    "expires_at_ms",
    "reconciles",
)

#: The condition of every write: the run is running, and this request has not applied yet.
_WRITE_CONDITION = (
    "attribute_exists(pk) AND #status = :running AND (attribute_not_exists(#req) OR #req <> :req)"
)
#: The update of a context write or heartbeat: the request token and the update time.
_TOUCH = "SET #req = :req, updated_ms = :now, gsi1sk = :gsk"
#: The TTL after the end was stored at start: DynamoDB adds it to now in the same write.
_FINISH = (
    "SET #req = :req, #status = :status, gsi1pk = :gpk, gsi1sk = :gsk, updated_ms = :now, "
    "ended_ms = :now, expires_at_ms = end_ttl_ms + :now, #ttl = end_ttl_s + :now_s"
)
_COMPLETE = _FINISH + ", #result = :result"
_FAIL = _FINISH + ", #error = :error"


@lru_cache(maxsize=64)
def _update_expression(sets: int, removes: int, reconciled: bool) -> str:
    """The UpdateExpression of :meth:`DynamoDBRunStore.update` (the same few shapes recur)."""
    update = _TOUCH + "".join(f", ctx.#s{i} = :s{i}" for i in range(sets))
    if reconciled:
        update += " ADD reconciles :one"
    if removes:
        update += " REMOVE " + ", ".join(f"ctx.#r{i}" for i in range(removes))
    return update


def _run(raw: Mapping[str, Any]) -> Run:
    return Run.from_item(raw, raw.get("ctx") or {})


def _int(av: Mapping[str, Any]) -> int:
    """The int an N attribute holds (its plain digits as DynamoDB returns an integer, or any
    other form through Decimal)."""
    number = av["N"]
    try:
        return int(number)
    except ValueError:
        return int(Decimal(number))


def _listed(raw_item: Mapping[str, Any], status: RunStatus | None = None) -> Run:
    """``_run(_read(raw_item))`` straight from the attribute values (a listed page holds up to
    100 runs, and every read or write returns its run); anything but the attribute types runs
    are written with takes the general path. ``status`` is the run's, when the caller has
    already compared the item's with it."""
    get = raw_item.get
    try:
        if status is None:
            text = raw_item["status"]["S"]
            status = _STATUS_BY_TEXT.get(text) or _status(text)  # an unknown one raises
        ctx = raw_item["ctx"]["M"] if "ctx" in raw_item else None
        result, error = get("result"), get("error")
        ended, expires, reconciles = get("ended_ms"), get("expires_at_ms"), get("reconciles")
        # int() of the digits inline (a call per number adds up over a page): any other form
        # of a number raises ValueError, and the general path reads it through Decimal
        return _new_run(
            raw_item["run_id"]["S"],
            status,
            {name: codec.decode(text["S"]) for name, text in ctx.items()} if ctx else {},
            int(raw_item["created_ms"]["N"]),
            int(raw_item["updated_ms"]["N"]),
            None if result is None else codec.decode(result["S"]),
            None if error is None else error["S"],
            None if ended is None else int(ended["N"]),
            None if expires is None else int(expires["N"]),
            0 if reconciles is None else int(reconciles["N"]),
        )
    except (KeyError, ValueError):
        pass  # the general path runs outside the handler: an error of its own is not chained
    return _run(_read(raw_item))


def _read(raw_item: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of a marshalled run item that :func:`_run` reads."""
    return unmarshal_only(raw_item, _RUN_ATTRIBUTES)


def _live(raw_item: Mapping[str, Any], now_ms: int) -> bool:
    """:func:`is_live` of the unmarshalled item, from its attribute values."""
    expires = raw_item.get("expires_at_ms")
    if expires is None:
        return True
    if "N" in expires:
        return _int(expires) > now_ms
    return is_live(unmarshal(raw_item), now_ms)


#: context values whose codec text decodes to an equal value of the same type
_PLAIN = frozenset({str, int, float, bool, type(None)})


class DynamoDBRunStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace
        self._index_pks: dict[str, str] = {}

    def _primary(self, run_id: str) -> dict[str, Any]:
        # primary()'s dict, without its call
        return {"pk": {"S": run_pk(self._ns, run_id)}, "sk": {"S": RUN_SK}}

    def _index_pk(self, status: str) -> str:
        """The gsi1 partition of ``status`` (built and checked once per status)."""
        pk = self._index_pks.get(status)
        if pk is None:
            pk = self._index_pks[status] = run_index_pk(self._ns, status)
        return pk

    def create(
        self, run_id: str, context: Mapping[str, Any], ttl_after_end_ms: int, now_ms: int
    ) -> Run:
        key = run_key(self._ns, run_id, status=_RUNNING, updated_ms=now_ms)
        if isinstance(context, CheckedFields):
            ctx = context.texts
        else:
            ctx = {name: codec.encode(value) for name, value in context.items()}
        now = str(now_ms)
        # the fields of runs.new_run_fields, marshalled as they are built (no second pass)
        item: dict[str, Any] = {
            "pk": {"S": key.pk},
            "sk": {"S": key.sk},
            "gsi1pk": {"S": key.gsi1pk},
            "gsi1sk": {"S": key.gsi1sk},
            "run_id": {"S": run_id},
            "status": {"S": _RUNNING},
            "created_ms": {"N": now},
            "updated_ms": {"N": now},
            "end_ttl_ms": {"N": str(ttl_after_end_ms)},
            "reconciles": {"N": "0"},
            "ctx": {"M": {name: {"S": text} for name, text in ctx.items()}},
            "end_ttl_s": {"N": str(math.ceil(ttl_after_end_ms / 1000))},
        }
        # The run id is in pk and gsi1sk, the namespace in pk and gsi1pk; at most 4 bytes of
        # UTF-8 a character, and the other attributes take far less than 512 bytes: a run within
        # that bound fits and needs no estimate.
        names_and_texts = sum(map(len, ctx)) + sum(map(len, ctx.values()))
        chars = 2 * (len(run_id) + len(self._ns)) + names_and_texts
        if 4 * chars + 3 * len(ctx) + 512 > codec.DYNAMODB_ITEM_LIMIT:
            codec.check_item_size(unmarshal(item), key=run_id)
        # A finished run past its TTL is absent even if the sweeper has not removed it.
        if not self._table.put_item_if_free(item, now_ms):
            raise RunExistsError(f"run {run_id!r} already exists", run_id=run_id)
        # what _run(item) reads back, without reading it: a new run has only these fields, and
        # a plain value decodes to itself
        return _new_run(
            run_id,
            RunStatus.RUNNING,
            {
                name: value if type(value) in _PLAIN else codec.decode(ctx[name])
                for name, value in context.items()
            }
            if ctx
            else {},
            now_ms,
            now_ms,
            None,
            None,
            None,
            None,
            0,
        )

    def get(self, run_id: str, now_ms: int) -> Run | None:
        # the attribute values read as a Run directly (get_item would unmarshal every one)
        raw = self._table.get_raw(self._primary(run_id))
        return _listed(raw) if raw and _live(raw, now_ms) else None

    def _write(
        self,
        run_id: str,
        now_ms: int,
        update: str,
        names: dict[str, str],
        vals: dict[str, Any],
        token: str,
    ) -> Run:
        """UpdateItem of a running run. ``update`` is the whole UpdateExpression (it sets
        ``#req`` to ``:req``); ``names`` and ``vals`` (marshalled) hold its placeholders and
        those of :data:`_WRITE_CONDITION` (built whole by the caller: no merge of two dicts),
        ``:req`` being ``token``.

        Every transition carries a request token: a retry of an applied write (its response
        lost) is refused by it and returns the run that write made.
        """
        try:
            response = self._table.call(
                "update_item",
                Key=self._primary(run_id),
                ConditionExpression=_WRITE_CONDITION,
                UpdateExpression=update,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=vals,
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ConditionFailedError as failed:
            if written_by(failed.item, token):
                return _run(failed.item)
            raise write_refused(run_id, failed.item, now_ms) from None
        return _listed(response["Attributes"])

    def update(
        self,
        run_id: str,
        now_ms: int,
        *,
        set_fields: Mapping[str, Any] | None = None,
        remove_fields: Sequence[str] = (),
        reconciled: bool = False,
    ) -> Run:
        token = request_token()
        names = {"#status": "status", "#req": REQUEST_TOKEN}
        vals: dict[str, Any] = {
            ":running": {"S": _RUNNING},
            ":req": {"S": token},
            ":now": {"N": str(now_ms)},
            ":gsk": {"S": run_index_sk(now_ms, run_id)},
        }
        sets = 0
        if set_fields:
            texts = set_fields.texts if isinstance(set_fields, CheckedFields) else None
            # Field names go through placeholders, so any str is a safe map key.
            for name, value in set_fields.items():
                names[f"#s{sets}"] = name
                vals[f":s{sets}"] = {"S": codec.encode(value) if texts is None else texts[name]}
                sets += 1
        if reconciled:
            vals[":one"] = {"N": "1"}
        for i, name in enumerate(remove_fields):
            names[f"#r{i}"] = name
        update = _update_expression(sets, len(remove_fields), reconciled)
        return self._write(run_id, now_ms, update, names, vals, token)

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> Run:
        text = _STATUS_TEXT[status]
        token = request_token()
        vals: dict[str, Any] = {
            ":running": {"S": _RUNNING},
            ":req": {"S": token},
            ":status": {"S": text},
            ":gpk": {"S": self._index_pk(text)},
            ":gsk": {"S": run_index_sk(now_ms, run_id)},
            ":now": {"N": str(now_ms)},
            ":now_s": {"N": str(math.ceil(now_ms / 1000))},
        }
        if status is RunStatus.COMPLETED:
            vals[":result"] = {"S": codec.encode(result)}
            names = {"#status": "status", "#req": REQUEST_TOKEN, "#ttl": "ttl", "#result": "result"}
            return self._write(run_id, now_ms, _COMPLETE, names, vals, token)
        vals[":error"] = {"S": error or ""}
        names = {"#status": "status", "#req": REQUEST_TOKEN, "#ttl": "ttl", "#error": "error"}
        return self._write(run_id, now_ms, _FAIL, names, vals, token)

    def query(
        self, status: RunStatus, before_ms: int | None, page_size: int, cursor: Any, now_ms: int
    ) -> RunPage:
        text = _STATUS_TEXT[status]
        condition = "gsi1pk = :pk"
        vals: dict[str, Any] = {":pk": {"S": self._index_pk(text)}}
        if before_ms is not None:
            # gsi1sk is "{updated_ms:015d}#{run_id}": every run updated at before_ms or later
            # sorts at or above the bare padded number, so "<" keeps exactly updated < before.
            condition += " AND gsi1sk < :before"
            vals[":before"] = {"S": time_sk_bound(max(before_ms, 0))}
        kwargs: dict[str, Any] = {
            "IndexName": _INDEX,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": vals,
            "Limit": page_size,
            "ScanIndexForward": True,
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        page = self._table.call("query", **kwargs)
        runs = []
        wanted = {"S": text}
        for raw_item in page.get("Items", []):
            # The index item carries the whole run (projection ALL); drop runs that expired.
            expires = raw_item.get("expires_at_ms")
            if raw_item.get("status") != wanted or (
                expires is not None and _int(expires) <= now_ms
            ):
                continue
            runs.append(_listed(raw_item, status))
        return RunPage(runs, page.get("LastEvaluatedKey") or None)
