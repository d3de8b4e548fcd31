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
from typing import Any

from ... import codec
from ..._items import is_live
from ...errors import RunExistsError
from ...keys import RUN_SK, run_index_pk, run_index_sk, run_key, run_pk, time_sk_bound
from ...runs import Run, RunPage, RunStatus, _status, new_run_fields, write_refused
from ._table import (
    REQUEST_TOKEN,
    ConditionFailedError,
    DynamoTable,
    primary,
    request_token,
    unmarshal_only,
    values,
    written_by,
)

__all__ = ["DynamoDBRunStore"]

_INDEX = "gsi1"


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


def _listed(raw_item: Mapping[str, Any]) -> Run:
    """``_run(_read(raw_item))`` straight from the attribute values (a listed page holds up to
    100 runs, and every write reads its run back); anything but the attribute types runs are
    written with takes the general path."""
    get = raw_item.get
    try:
        ctx = raw_item["ctx"]["M"] if "ctx" in raw_item else {}
        result, error = get("result"), get("error")
        ended, expires, reconciles = get("ended_ms"), get("expires_at_ms"), get("reconciles")
        return Run(
            raw_item["run_id"]["S"],
            _status(raw_item["status"]["S"]),
            {name: codec.decode(text["S"]) for name, text in ctx.items()},
            _int(raw_item["created_ms"]),
            _int(raw_item["updated_ms"]),
            None if result is None else codec.decode(result["S"]),
            None if error is None else error["S"],
            None if ended is None else _int(ended),
            None if expires is None else _int(expires),
            0 if reconciles is None else _int(reconciles),
        )
    except KeyError:
        return _run(_read(raw_item))


def _read(raw_item: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of a marshalled run item that :func:`_run` reads."""
    return unmarshal_only(raw_item, _RUN_ATTRIBUTES)


class DynamoDBRunStore:
    def __init__(self, table: DynamoTable, namespace: str) -> None:
        self._table = table
        self._ns = namespace

    def _primary(self, run_id: str) -> dict[str, Any]:
        return primary(run_pk(self._ns, run_id), RUN_SK)

    def create(
        self, run_id: str, context: Mapping[str, Any], ttl_after_end_ms: int, now_ms: int
    ) -> Run:
        key = run_key(self._ns, run_id, status=RunStatus.RUNNING.value, updated_ms=now_ms)
        item: dict[str, Any] = {
            **key.as_dict(),
            **new_run_fields(run_id, ttl_after_end_ms, now_ms),
            "ctx": {name: codec.encode(value) for name, value in context.items()},
            "end_ttl_s": math.ceil(ttl_after_end_ms / 1000),
        }
        ctx = item["ctx"]
        # The run id is in pk and gsi1sk, the namespace in pk and gsi1pk; at most 4 bytes of
        # UTF-8 a character, and the other attributes take far less than 512 bytes: a run within
        # that bound fits and needs no estimate.
        chars = 2 * (len(run_id) + len(self._ns)) + sum(len(k) + len(v) for k, v in ctx.items())
        if 4 * chars + 3 * len(ctx) + 512 > codec.DYNAMODB_ITEM_LIMIT:
            codec.check_item_size(item, key=run_id)
        # A finished run past its TTL is absent even if the sweeper has not removed it.
        if not self._table.put_if_free(item, now_ms):
            raise RunExistsError(f"run {run_id!r} already exists", run_id=run_id)
        # what _run(item) reads back, without reading it: a new run has only these fields
        return Run(
            run_id,
            RunStatus.RUNNING,
            {name: codec.decode(text) for name, text in ctx.items()} if ctx else {},
            now_ms,
            now_ms,
        )

    def get(self, run_id: str, now_ms: int) -> Run | None:
        raw = self._table.get_item(self._primary(run_id))
        return _run(raw) if raw and is_live(raw, now_ms) else None

    def _write(
        self,
        run_id: str,
        now_ms: int,
        update: str,
        names: dict[str, str],
        vals: dict[str, Any],
    ) -> Run:
        # Every transition carries a request token: a retry of an applied write (its response
        # lost) is refused by it and returns the run that write made.
        token = request_token()
        assert update.startswith("SET ")
        try:
            response = self._table.call(
                "update_item",
                Key=self._primary(run_id),
                ConditionExpression=(
                    "attribute_exists(pk) AND #status = :running AND "
                    "(attribute_not_exists(#req) OR #req <> :req)"
                ),
                UpdateExpression="SET #req = :req, " + update[4:],
                ExpressionAttributeNames={"#status": "status", "#req": REQUEST_TOKEN, **names},
                ExpressionAttributeValues=values(
                    running=RunStatus.RUNNING.value, req=token, **vals
                ),
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
        sets = ["updated_ms = :now", "gsi1sk = :gsk"]
        names: dict[str, str] = {}
        vals: dict[str, Any] = {"now": now_ms, "gsk": run_index_sk(now_ms, run_id)}
        # Field names go through placeholders, so any str is a safe map key.
        for i, (name, value) in enumerate((set_fields or {}).items()):
            names[f"#s{i}"] = name
            vals[f"s{i}"] = codec.encode(value)
            sets.append(f"ctx.#s{i} = :s{i}")
        update = "SET " + ", ".join(sets)
        if reconciled:
            update += " ADD reconciles :one"
            vals["one"] = 1
        if remove_fields:
            removes = []
            for i, name in enumerate(remove_fields):
                names[f"#r{i}"] = name
                removes.append(f"ctx.#r{i}")
            update += " REMOVE " + ", ".join(removes)
        return self._write(run_id, now_ms, update, names, vals)

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> Run:
        # The TTL after the end was stored at start: DynamoDB adds it to now in the same write.
        update = (
            "SET #status = :status, gsi1pk = :gpk, gsi1sk = :gsk, updated_ms = :now, "
            "ended_ms = :now, expires_at_ms = end_ttl_ms + :now, #ttl = end_ttl_s + :now_s"
        )
        vals: dict[str, Any] = {
            "status": status.value,
            "gpk": run_index_pk(self._ns, status.value),
            "gsk": run_index_sk(now_ms, run_id),
            "now": now_ms,
            "now_s": math.ceil(now_ms / 1000),
        }
        names = {"#ttl": "ttl"}
        if status is RunStatus.COMPLETED:
            update += ", #result = :result"
            names["#result"] = "result"
            vals["result"] = codec.encode(result)
        else:
            update += ", #error = :error"
            names["#error"] = "error"
            vals["error"] = error or ""
        return self._write(run_id, now_ms, update, names, vals)

    def query(
        self, status: RunStatus, before_ms: int | None, page_size: int, cursor: Any, now_ms: int
    ) -> RunPage:
        condition = "gsi1pk = :pk"
        vals: dict[str, Any] = {"pk": run_index_pk(self._ns, status.value)}
        if before_ms is not None:
            # gsi1sk is "{updated_ms:015d}#{run_id}": every run updated at before_ms or later
            # sorts at or above the bare padded number, so "<" keeps exactly updated < before.
            condition += " AND gsi1sk < :before"
            vals["before"] = time_sk_bound(max(before_ms, 0))
        kwargs: dict[str, Any] = {
            "IndexName": _INDEX,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": values(**vals),
            "Limit": page_size,
            "ScanIndexForward": True,
        }
        if cursor is not None:
            kwargs["ExclusiveStartKey"] = cursor
        page = self._table.call("query", **kwargs)
        runs = []
        wanted = {"S": status.value}
        for raw_item in page.get("Items", []):
            # The index item carries the whole run (projection ALL); drop runs that expired.
            expires = raw_item.get("expires_at_ms")
            if raw_item.get("status") != wanted or (
                expires is not None and _int(expires) <= now_ms
            ):
                continue
            runs.append(_listed(raw_item))
        return RunPage(runs, page.get("LastEvaluatedKey") or None)
