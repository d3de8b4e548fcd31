"""The one batch-write engine of the outbox's conditional writes on DynamoDB: claims, outcomes,
lease extensions, the relay's settlements.

Independent writes (no other entry tied to them) travel as PartiQL statements, up to 25 in one
``BatchExecuteStatement``, each billed as the plain write it is and each answered on its own;
tied ones (an ordered group's events with its gate) in transactions of at most 100 items. Every
entry's fate is told to an :class:`Answers` as soon as it is known: written, refused for its
condition (with the item as it was), or rejected for its own item (too large, say), never the
batch's. Entries that came back throttled or in another transaction's way are sent again after
a jittered pause, round after round; what is still unsent then raises.

Where the endpoint runs no conditional PartiQL batch (moto), or IAM denies it, every entry goes
the transactional way (see :mod:`._partiql`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ...errors import BackendError, DynacoordError, TransactionCancelledError, ValueTooLargeError
from ...outbox import EventRecord
from . import _partiql
from ._limits import MAX_STATEMENTS, MAX_TRANSACTION_ITEMS
from ._marshal import unmarshal
from ._table import ConditionFailedError, DynamoTable

__all__ = ["Answers", "BatchWriter", "Entry", "chunks", "tied"]

logger = logging.getLogger(__name__)

#: Rounds of a batched write (claims, outcomes, lease extensions): a cancelled transaction is
#: sent again without the items that refused, throttled statements again; after this many
#: rounds of the whole rest, each group of tied items goes alone for LAST_ROUNDS more. Between
#: rounds a jittered pause from ROUND_PAUSE_FIRST seconds, doubling up to ROUND_PAUSE_MAX:
#: without it, writers conflicting on a hot gate retry in lockstep and give up together.
BATCH_ROUNDS = 3
LAST_ROUNDS = 8
ROUND_PAUSE_FIRST = 0.01
ROUND_PAUSE_MAX = 1.0
#: How the pauses wait (a module attribute, so a test can replace it).
_sleep = time.sleep

#: A transaction item's action and the plain request that writes it alone.
_SINGLE_OPERATIONS = {"Update": "update_item", "Delete": "delete_item"}


#: statement errors of a BatchExecuteStatement that are no fault of the write: send it again
_STATEMENT_AGAIN = frozenset(
    {
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
        "InternalServerError",
    }
)


@dataclasses.dataclass(slots=True)
class Entry:
    """One item of a batched request and what it stands for."""

    item: dict[str, Any]
    record: EventRecord | None = None
    token: str = ""
    group: str | None = None
    index: int | None = None
    #: the name of the entries this one travels with in one transaction (None: on its own)
    tie: str | None = None


@dataclasses.dataclass(slots=True)
class Answers:
    """What became of each entry of a batched write, told as soon as it is known."""

    #: its condition was false; the item as it was (``ALL_OLD``), or None where it is gone
    refused: Callable[[Entry, dict[str, Any] | None], None]
    written: Callable[[Entry], None]
    #: refused for its own item, not for its condition (too large, say): that entry's answer
    rejected: Callable[[Entry, str], None]
    #: entries sent again only while this says so (None: always)
    still_wanted: Callable[[Entry], bool] | None = None

    def wanted(self, entries: list[Entry]) -> list[Entry]:
        if self.still_wanted is None:
            return entries
        return [entry for entry in entries if self.still_wanted(entry)]


class Pause:
    """The pauses between rounds of a batched write: jittered, doubling up to a cap."""

    def __init__(self) -> None:
        self._delay = ROUND_PAUSE_FIRST

    def wait(self) -> None:
        _sleep(random.uniform(self._delay / 2, self._delay))
        self._delay = min(ROUND_PAUSE_MAX, self._delay * 2)


def denied(code: str | None) -> bool:
    """An IAM refusal (of PartiQL: the statement actions are authorised apart)."""
    return code is not None and code.startswith("AccessDenied")


class BatchWriter:
    """Sends batches of conditional writes to one table (see the module docstring), through its
    session (which translates a table layout's names both ways, statements included);
    ``probe_key`` is the key of the PartiQL probe (one that never exists)."""

    def __init__(self, table: DynamoTable, *, probe_key: Mapping[str, Any]) -> None:
        self._table = table
        self._probe_key = dict(probe_key)

    def statements_supported(self) -> bool:
        """Whether this endpoint runs conditional PartiQL batches (DynamoDB and DynamoDB Local
        do, moto does not); asked once per client and table."""
        return self._table.statements_supported(self._probe_key)

    def write(
        self,
        entries: list[Entry],
        answers: Answers,
        *,
        must_write: bool = True,
    ) -> None:
        """Send ``entries``: the ones tied to no other (``tie`` None) as independent
        conditional writes, up to 25 a request at plain-write prices (``BatchExecuteStatement``,
        where the endpoint runs it); the rest in transactions of at most 100 items (the items
        of one ``tie`` stay in one). ``answers`` hears what became of each entry.

        Entries that came back throttled or in another transaction's way (no fault of theirs)
        are sent again after a jittered pause that doubles each round: ``BATCH_ROUNDS`` rounds
        of the whole rest, then ``LAST_ROUNDS`` more for each group of tied entries alone.
        What is still unsent then raises :class:`BackendError` when ``must_write`` (an outcome
        that was not stored must never be mistaken for a lease taken over); a claim leaves it
        unclaimed."""
        pending = entries
        pause = Pause()
        for round_ in range(BATCH_ROUNDS):
            pending = answers.wanted(pending)
            if not pending:
                return
            if round_:
                pause.wait()
            again: list[Entry] = []
            transactional = pending
            alone = [e for e in pending if e.tie is None]
            if len(alone) > 1 and self.statements_supported():
                statements = self._statement_entries(alone)
                sent: set[int] = set()
                try:
                    for start in range(0, len(statements), MAX_STATEMENTS):
                        batch = statements[start : start + MAX_STATEMENTS]
                        again.extend(self._send_statements(batch, answers))
                        sent.update(id(entry) for entry, _ in batch)
                except BackendError as error:
                    if not denied(error.code):
                        raise
                    self._partiql_denied(error.code)  # the rest goes the transactional way
                transactional = [e for e in pending if id(e) not in sent]
            for chunk in chunks(transactional):
                again.extend(self._send(chunk, answers))
            pending = again
        unsent = 0
        for group in tied(answers.wanted(pending)):
            leftover = list(group)
            for _ in range(LAST_ROUNDS):
                leftover = answers.wanted(leftover)
                if not leftover:
                    break
                pause.wait()
                leftover = self._send(leftover, answers)
            unsent += len(answers.wanted(leftover))
        if unsent and must_write:
            raise BackendError(
                f"outbox: {unsent} conditional write(s) kept meeting throttling or other "
                f"transactions after {BATCH_ROUNDS + LAST_ROUNDS} rounds and were not written; "
                "the events stay as they were (held ones until their lease ends)",
                code="TransactionConflict",
            )

    def _partiql_denied(self, code: str | None) -> None:
        """PartiQL was denied after the probe said yes (a policy or SCP changed): transactions
        from now on, the endpoint asked again later (see ``_partiql.supported``)."""
        logger.warning(
            "outbox: DynamoDB denied PartiQL on table %r (%s); sending the batch's conditional "
            "writes as transactions (twice the write units) and asking again in %d s: grant "
            "dynamodb:PartiQLUpdate and dynamodb:PartiQLDelete (see `dynacoord iam-policy`)",
            self._table.name,
            code,
            int(_partiql.ASK_AGAIN_AFTER),
        )
        _partiql.refused(self._table.state)

    def _statement_entries(self, entries: list[Entry]) -> list[tuple[Entry, dict[str, Any]]]:
        """The entries that translate to PartiQL statements, each with its statement."""
        out: list[tuple[Entry, dict[str, Any]]] = []
        for entry in entries:
            ((action, op),) = entry.item.items()
            try:
                out.append((entry, self._table.statement(action, op)))
            except _partiql.NotTranslatableError:
                continue  # sent the transactional way
        return out

    def _send_statements(
        self, chunk: list[tuple[Entry, dict[str, Any]]], answers: Answers
    ) -> list[Entry]:
        """One ``BatchExecuteStatement`` of independent conditional writes; the entries to send
        again (throttled or in another transaction's way, no fault of theirs). Every statement's
        answer is heard before anything is raised: a statement refused for its own item (too
        large, say) is that entry's, never the batch's."""
        if len(chunk) == 1:
            return self._send([chunk[0][0]], answers)
        answer = self._table.call(
            "batch_execute_statement", Statements=[statement for _, statement in chunk]
        )
        responses = answer.get("Responses", [])
        if len(responses) != len(chunk):
            raise DynacoordError(
                f"BatchExecuteStatement answered {len(responses)} of {len(chunk)} statements"
            )
        again: list[Entry] = []
        denied_code: str | None = None
        for (entry, _), response in zip(chunk, responses, strict=True):
            error = response.get("Error")
            if not error:
                answers.written(entry)
                continue
            code = error.get("Code")
            if code == "ConditionalCheckFailed":
                raw = error.get("Item")
                answers.refused(entry, unmarshal(raw) if raw else None)
            elif code in _STATEMENT_AGAIN:
                again.append(entry)
            elif denied(code):
                denied_code = code
                again.append(entry)  # the next round sends it as a transaction
            else:
                answers.rejected(entry, f"{code}: {error.get('Message', '')}")
        if denied_code is not None:
            self._partiql_denied(denied_code)
        return again

    def _send(self, chunk: list[Entry], answers: Answers) -> list[Entry]:
        """One request for ``chunk``; the entries to send again (cancelled, no fault of theirs)."""
        if not chunk:
            return []
        single = _SINGLE_OPERATIONS.keys() & chunk[0].item.keys() if len(chunk) == 1 else None
        if single:
            # One item: the plain write (half the write units of a transaction).
            (action,) = single
            op = dict(chunk[0].item[action])
            op.pop("TableName", None)
            try:
                self._table.call(_SINGLE_OPERATIONS[action], **op)
            except ConditionFailedError as failed:
                answers.refused(chunk[0], failed.item)
                return []
            except ValueTooLargeError as too_large:
                answers.rejected(chunk[0], str(too_large))
                return []
            answers.written(chunk[0])
            return []
        try:
            self._table.call("transact_write_items", TransactItems=[e.item for e in chunk])
        except TransactionCancelledError as cancelled:
            again = []
            reasons = cancelled.reasons
            if len(reasons) != len(chunk):
                raise
            failed_any = False
            for entry, reason in zip(chunk, reasons, strict=True):
                code = reason.get("Code")
                if code == "ConditionalCheckFailed":
                    raw = reason.get("Item")
                    answers.refused(entry, unmarshal(raw) if raw else None)
                    failed_any = True
                elif code in (None, "None", "TransactionConflict"):
                    again.append(entry)
                elif code == "ValidationError":  # refused for its own item (too large, say)
                    answers.rejected(entry, f"{code}: {reason.get('Message', '')}")
                    failed_any = True
                else:
                    raise
            if not failed_any and not any(r.get("Code") == "TransactionConflict" for r in reasons):
                raise
            return again
        for entry in chunk:
            answers.written(entry)
        return []


def tied(entries: Iterable[Entry]) -> list[list[Entry]]:
    """``entries`` in groups that must travel together (each untied entry alone)."""
    tied: dict[str, list[Entry]] = {}
    groups: list[list[Entry]] = []
    for entry in entries:
        name = entry.tie
        if name is None:
            groups.append([entry])
        elif name in tied:
            tied[name].append(entry)
        else:
            tied[name] = [entry]
            groups.append(tied[name])
    return groups


def chunks(entries: list[Entry]) -> list[list[Entry]]:
    """Transactions of at most 100 items, tied entries never split."""
    chunks: list[list[Entry]] = []
    current: list[Entry] = []
    for group in tied(entries):
        if current and len(current) + len(group) > MAX_TRANSACTION_ITEMS:
            chunks.append(current)
            current = []
        current.extend(group)
    if current:
        chunks.append(current)
    return chunks
