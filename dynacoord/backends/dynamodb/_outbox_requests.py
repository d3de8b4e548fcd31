"""The outbox's conditional writes on the single table, built as transaction items (``{"Update":
{...}}``): claims, lease extensions, outcomes, the relay's settlements, an ordered group's gate moves and redrives.
Pure: each method returns a request and sends nothing; the store decides what travels with
what (see :mod:`._batch`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...outbox import EventRecord, EventStatus, Outcome
from ...outbox._gates import gate_move
from ._marshal import values
from ._outbox_items import OutboxItems

__all__ = ["HOLDS_LEASE", "NAMES", "OutboxRequests", "still_as_seen"]

NAMES = {"#status": "status"}
#: Every state change after the claim: only while the worker's claim still holds the event.
HOLDS_LEASE = "#status = :in_flight AND lease_token = :token"


def still_as_seen(seen: EventRecord, now_ms: int) -> tuple[str, dict[str, Any]]:
    """The condition (and its values) that ``seen`` is still as it was seen and due: its status
    and lease token, and ``due_ms <= now`` (a pending event whose attempt has come, or an
    in-flight one whose lease ran out). Two writers racing for it: the first changes the status
    or token, the second's condition fails."""
    args: dict[str, Any] = {"expected": seen.status.value, "now": now_ms}
    condition = "#status = :expected AND due_ms <= :now AND "
    if seen.lease_token is None:
        condition += "attribute_not_exists(lease_token)"
    else:
        condition += "lease_token = :seen"
        args["seen"] = seen.lease_token
    return condition, args


class OutboxRequests:
    """The requests of one table's outbox items (``items``)."""

    def __init__(self, table_name: str, items: OutboxItems) -> None:
        self._table_name = table_name
        self._items = items

    def claim(
        self, seen: EventRecord, token: str, lease_until_ms: int, now_ms: int
    ) -> dict[str, Any]:
        """The conditional update that claims ``seen`` (still as seen: status, lease token and
        attempts; and due) as a transaction item."""
        gpk, gsk = self._items.record_index(seen.event, EventStatus.IN_FLIGHT, lease_until_ms)
        condition, args = still_as_seen(seen, now_ms)
        args.update(
            in_flight=EventStatus.IN_FLIGHT.value,
            token=token,
            until=lease_until_ms,
            gpk=gpk,
            gsk=gsk,
            attempts=seen.attempts,
            one=1,
        )
        # The attempts seen are the ones this claim counts: the returned record is built here.
        condition += " AND attempts = :attempts"
        if seen.seq is not None:
            # Still at the place seen: the gate check is for that place. A redriven event took
            # a new place at its group's tail; an old image of it (a replayed stream record,
            # a stale index entry) must not claim it ahead of the places before its new one.
            condition += " AND seq = :seq"
            args["seq"] = seen.seq
        return {
            "TableName": self._table_name,
            "Key": self._items.key(seen.id),
            "ConditionExpression": condition,
            "UpdateExpression": (
                "SET #status = :in_flight, lease_token = :token, due_ms = :until, "
                "attempts = :attempts + :one, gsi1pk = :gpk, gsi1sk = :gsk, updated_ms = :now"
            ),
            "ExpressionAttributeNames": NAMES,
            "ExpressionAttributeValues": values(**args),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def extend(self, held: EventRecord, lease_until_ms: int, now_ms: int) -> dict[str, Any]:
        """The conditional update that moves ``held``'s lease to ``lease_until_ms`` (its due
        time and index place with it), while the worker's claim still holds it."""
        _, gsk = self._items.record_index(held.event, EventStatus.IN_FLIGHT, lease_until_ms)
        return {
            "TableName": self._table_name,
            "Key": self._items.key(held.id),
            "ConditionExpression": HOLDS_LEASE,
            "UpdateExpression": "SET due_ms = :until, gsi1sk = :gsk, updated_ms = :now",
            "ExpressionAttributeNames": NAMES,
            "ExpressionAttributeValues": values(
                in_flight=EventStatus.IN_FLIGHT.value,
                token=held.lease_token or "",
                until=lease_until_ms,
                gsk=gsk,
                now=now_ms,
            ),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def unclaimed(
        self, seen: EventRecord, outcome: Outcome, now_ms: int, retention_ms: int | None
    ) -> dict[str, Any]:
        """:meth:`outcome`'s write, conditional on the event being still as ``seen`` instead
        of on a claim, and counting the attempt."""
        ((action, op),) = self.outcome(outcome, now_ms, retention_ms).items()
        op = dict(op)
        vals = dict(op["ExpressionAttributeValues"])
        vals.pop(":in_flight", None)
        vals.update(
            values(
                seen_status=EventStatus.PENDING.value,
                seen_attempts=seen.attempts,
                seen_due=seen.due_at_ms,
            )
        )
        op["ConditionExpression"] = (
            "#status = :seen_status AND attribute_not_exists(lease_token) "
            "AND attempts = :seen_attempts AND due_ms = :seen_due"
        )
        if action == "Update":
            vals.update(values(attempts_next=seen.attempts + 1))
            update = op["UpdateExpression"]
            assert update.startswith("SET ")
            op["UpdateExpression"] = "SET attempts = :attempts_next, " + update[4:]
        else:
            vals.pop(":token", None)  # a deletion leaves no trace to recognise
        op["ExpressionAttributeValues"] = vals
        return {action: op}

    def outcome(self, outcome: Outcome, now_ms: int, retention_ms: int | None) -> dict[str, Any]:
        record = outcome.record
        base: dict[str, Any] = {
            "TableName": self._table_name,
            "Key": self._items.key(record.id),
            "ConditionExpression": HOLDS_LEASE,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        args: dict[str, Any] = {
            "in_flight": EventStatus.IN_FLIGHT.value,
            "token": outcome.token,
            "now": now_ms,
        }
        names = dict(NAMES)
        if outcome.kind == "completed":
            if retention_ms is None:
                del args["now"]
                return {
                    "Delete": {
                        **base,
                        "ExpressionAttributeNames": names,
                        "ExpressionAttributeValues": values(**args),
                    }
                }
            expires = now_ms + retention_ms
            names["#ttl"] = "ttl"
            args.update(
                completed=EventStatus.COMPLETED.value, exp=expires, ttl=math.ceil(expires / 1000)
            )
            update = (
                "SET #status = :completed, completed_ms = :now, updated_ms = :now, "
                "expires_at_ms = :exp, #ttl = :ttl, finished_by = :token "
                "REMOVE gsi1pk, gsi1sk, lease_token, due_ms"
            )
        elif outcome.kind == "failed":
            gpk, gsk = self._items.record_index(record.event, EventStatus.FAILED, now_ms)
            args.update(failed=EventStatus.FAILED.value, gpk=gpk, gsk=gsk, err=outcome.error or "")
            update = (
                "SET #status = :failed, due_ms = :now, gsi1pk = :gpk, gsi1sk = :gsk, "
                "updated_ms = :now, failed_ms = :now, last_error = :err, finished_by = :token "
                "REMOVE lease_token"
            )
        else:
            gpk, gsk = self._items.record_index(record.event, EventStatus.PENDING, outcome.due_ms)
            args.update(pending=EventStatus.PENDING.value, due=outcome.due_ms, gpk=gpk, gsk=gsk)
            update = (
                "SET #status = :pending, due_ms = :due, gsi1pk = :gpk, gsi1sk = :gsk, "
                "updated_ms = :now, finished_by = :token"
            )
            if outcome.error is not None:
                update += ", last_error = :err"
                args["err"] = outcome.error
            if outcome.attempts_back:
                update += ", attempts = attempts - :back"
                args["back"] = outcome.attempts_back
            update += " REMOVE lease_token"
        return {
            "Update": {
                **base,
                "UpdateExpression": update,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values(**args),
            }
        }

    def gate_finish(self, group: str, outcomes: Sequence[Outcome]) -> dict[str, Any] | None:
        """The gate update for a group's outcomes in one batch (:mod:`dynacoord.outbox._gates`):
        ``next_seq`` moves past the finished events, never back; a retry of the head sets when
        the group may move again."""
        move = gate_move(outcomes)
        if move is None:
            return None
        key = self._items.gate_key(group)
        if move.after is not None:
            op: dict[str, Any] = {
                "TableName": self._table_name,
                "Key": key,
                "ConditionExpression": "next_seq < :after",
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
            if move.retry_at_head:
                op["UpdateExpression"] = "SET next_seq = :after, retry_due_ms = :due"
                op["ExpressionAttributeValues"] = values(after=move.after, due=move.retry_due_ms)
            else:
                op["UpdateExpression"] = "SET next_seq = :after REMOVE retry_due_ms"
                op["ExpressionAttributeValues"] = values(after=move.after)
            return op
        return {
            "TableName": self._table_name,
            "Key": key,
            "ConditionExpression": "next_seq = :head",
            "UpdateExpression": "SET retry_due_ms = :due",
            "ExpressionAttributeValues": values(head=move.retry_seq, due=move.retry_due_ms),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }

    def gate_publish(self, group: str, seen: int, published: int, now_ms: int) -> dict[str, Any]:
        args: dict[str, Any] = {"published": published, "one": 1, "now": now_ms}
        if seen:
            args["seen"] = seen
        return {
            "TableName": self._table_name,
            "Key": self._items.gate_key(group),
            "UpdateExpression": (
                "SET published = :published, next_seq = if_not_exists(next_seq, :one), "
                "published_ms = :now"
            ),
            "ConditionExpression": "published = :seen"
            if seen
            else "attribute_not_exists(published)",
            "ExpressionAttributeValues": values(**args),
        }

    def redrive(self, record: EventRecord, seq: int, now_ms: int, token: str) -> dict[str, Any]:
        """Back to pending at place ``seq``, while still failed in its group at its old place
        and not moved by this very retry already."""
        gpk, gsk = self._items.record_index(record.event, EventStatus.PENDING, now_ms)
        return {
            "TableName": self._table_name,
            "Key": self._items.key(record.id),
            "ConditionExpression": (
                "#status = :failed AND event_group = :group AND seq = :old AND "
                "(attribute_not_exists(retried_by) OR retried_by <> :token)"
            ),
            "UpdateExpression": (
                "SET #status = :pending, attempts = :zero, due_ms = :now, seq = :seq, "
                "gsi1pk = :gpk, gsi1sk = :gsk, updated_ms = :now, retried_by = :token, "
                "manual_retries = if_not_exists(manual_retries, :zero) + :one"
            ),
            "ExpressionAttributeNames": NAMES,
            "ExpressionAttributeValues": values(
                failed=EventStatus.FAILED.value,
                pending=EventStatus.PENDING.value,
                group=record.event.group or "",
                old=record.seq or 0,
                seq=seq,
                zero=0,
                one=1,
                now=now_ms,
                gpk=gpk,
                gsk=gsk,
                token=token,
            ),
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
