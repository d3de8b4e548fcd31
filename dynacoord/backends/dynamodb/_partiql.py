"""Conditional writes sent many to a request at plain-write prices: a transaction item
(``Update`` / ``Delete`` with a condition) rewritten as a PartiQL statement for
``BatchExecuteStatement``.

Why: ``TransactWriteItems`` is the only other way to send many conditional writes in one
request, and it bills every item twice. ``BatchExecuteStatement`` runs up to 25 statements,
each alone (one refused does not cancel the others) and billed as the plain write it is, and it
reports each refusal with the item as it was (``ReturnValuesOnConditionCheckFailure``).

Only the small expression grammar dynacoord's own writes use is translated: ``SET`` of paths
to values, sums and differences, ``REMOVE`` of paths, and conditions made of comparisons,
``AND``/``OR``/``NOT``, parentheses and ``attribute_exists``/``attribute_not_exists``. Anything
else raises :class:`NotTranslatableError`, and the caller sends the item the transactional way.

Where the endpoint cannot run it (moto's PartiQL does not), :func:`supported` says so once per
client and table (the table session's state), from one probe statement whose answer must be
exactly a refused condition.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping
from typing import Any

from ..._table_state import TableState

__all__ = [
    "ASK_AGAIN_AFTER",
    "NotTranslatableError",
    "probe_op",
    "refused",
    "statement",
    "supported",
]

_TOKEN = re.compile(
    r"\s*(?:(?P<value>:[A-Za-z0-9_]+)|(?P<name>#[A-Za-z0-9_]+)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<op><=|>=|<>|[=<>(),+-]))"
)
_KEYWORDS = {"AND", "OR", "NOT", "BETWEEN", "IN"}
_EXISTS = {"attribute_exists": "IS NOT MISSING", "attribute_not_exists": "IS MISSING"}


class NotTranslatableError(ValueError):
    """The write uses something outside the translated grammar: send it another way."""


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.rstrip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise NotTranslatableError(f"cannot translate {text[position:]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


class _Writer:
    """Renders expression tokens as PartiQL, collecting where each parameter comes from, in
    order: a ``:value`` name, or ``("key", attribute)``."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self._names = names
        self.parameters: list[str | tuple[str, str]] = []

    def path(self, kind: str, text: str) -> str:
        if kind == "name":
            try:
                text = self._names[text]
            except KeyError:
                raise NotTranslatableError(f"no attribute name for {text}") from None
        elif kind != "word":
            raise NotTranslatableError(f"expected an attribute, got {text!r}")
        if '"' in text:
            raise NotTranslatableError(f"attribute name {text!r} holds a quote")
        return f'"{text}"'

    def value(self, text: str) -> str:
        self.parameters.append(text)
        return "?"

    def operand(self, kind: str, text: str) -> str:
        return self.value(text) if kind == "value" else self.path(kind, text)

    def expression(self, tokens: list[tuple[str, str]]) -> str:
        """A condition or a SET's right-hand side."""
        out: list[str] = []
        i = 0
        while i < len(tokens):
            kind, text = tokens[i]
            if kind == "word" and text in _EXISTS:
                # attribute_exists(path) -> path IS NOT MISSING
                if (
                    i + 3 >= len(tokens)
                    or tokens[i + 1] != ("op", "(")
                    or tokens[i + 3] != ("op", ")")
                ):
                    raise NotTranslatableError(f"unexpected use of {text}")
                out.append(f"{self.path(*tokens[i + 2])} {_EXISTS[text]}")
                i += 4
                continue
            if kind == "word" and text.upper() in _KEYWORDS:
                out.append(text.upper())
            elif kind == "op":
                out.append(text)
            elif kind == "word" and i + 1 < len(tokens) and tokens[i + 1] == ("op", "("):
                raise NotTranslatableError(f"function {text} is not translated")
            else:
                out.append(self.operand(kind, text))
            i += 1
        return " ".join(out)


def _split(tokens: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """``tokens`` split at the commas outside parentheses."""
    parts: list[list[tuple[str, str]]] = [[]]
    depth = 0
    for token in tokens:
        if token == ("op", "("):
            depth += 1
        elif token == ("op", ")"):
            depth -= 1
        if token == ("op", ",") and depth == 0:
            parts.append([])
        else:
            parts[-1].append(token)
    return parts


def _update_clauses(writer: _Writer, expression: str) -> str:
    tokens = _tokens(expression)
    clauses: list[str] = []
    sections: list[tuple[str, list[tuple[str, str]]]] = []
    for token in tokens:
        if token[0] == "word" and token[1].upper() in ("SET", "REMOVE"):
            sections.append((token[1].upper(), []))
        elif not sections:
            raise NotTranslatableError(f"update expression {expression!r} has no SET or REMOVE")
        else:
            sections[-1][1].append(token)
    for action, body in sections:
        for part in _split(body):
            if action == "REMOVE":
                if len(part) != 1:
                    raise NotTranslatableError(f"REMOVE of {part!r}")
                clauses.append(f"REMOVE {writer.path(*part[0])}")
                continue
            if len(part) < 3 or part[1] != ("op", "="):
                raise NotTranslatableError(f"SET of {part!r}")
            target = writer.path(*part[0])
            clauses.append(f"SET {target} = {writer.expression(part[2:])}")
    return " ".join(clauses)


def statement(action: str, op: Mapping[str, Any]) -> dict[str, Any]:
    """The ``BatchExecuteStatement`` statement of a transaction item's ``Update`` or ``Delete``
    operation (the same write, condition and values), refusals answered with the old item."""
    if action not in ("Update", "Delete"):
        raise NotTranslatableError(f"{action} items are not translated")
    if set(op) - _KNOWN_FIELDS:
        raise NotTranslatableError(f"fields {sorted(set(op) - _KNOWN_FIELDS)} are not translated")
    key = op["Key"]
    names = op.get("ExpressionAttributeNames") or {}
    text, sources = _template(
        action,
        op["TableName"],
        op.get("UpdateExpression"),
        op.get("ConditionExpression"),
        tuple(sorted(names.items())),
        tuple(key),
    )
    values = op.get("ExpressionAttributeValues") or {}
    parameters: list[Any] = []
    for source in sources:
        if isinstance(source, tuple):
            parameters.append(key[source[1]])
        elif source in values:
            parameters.append(values[source])
        else:
            raise NotTranslatableError(f"no value for {source}")
    return {
        "Statement": text,
        "Parameters": parameters,
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


_KNOWN_FIELDS = frozenset(
    {
        "TableName",
        "Key",
        "ConditionExpression",
        "UpdateExpression",
        "ExpressionAttributeNames",
        "ExpressionAttributeValues",
        "ReturnValuesOnConditionCheckFailure",
    }
)


@functools.lru_cache(maxsize=512)
def _template(
    action: str,
    table: str,
    update: str | None,
    condition: str | None,
    names: tuple[tuple[str, str], ...],
    key_names: tuple[str, ...],
) -> tuple[str, tuple[str | tuple[str, str], ...]]:
    """A statement's text and where its parameters come from (dynacoord sends a handful of
    expression shapes with changing values: each is translated once)."""
    if '"' in table:
        raise NotTranslatableError("table name holds a quote")
    writer = _Writer(dict(names))
    if action == "Update":
        if update is None:
            raise NotTranslatableError("an Update without an UpdateExpression")
        head = f'UPDATE "{table}" {_update_clauses(writer, update)}'
    else:
        head = f'DELETE FROM "{table}"'
    where: list[str] = []
    for name in key_names:
        where.append(f"{writer.path('word', name)} = ?")
        writer.parameters.append(("key", name))
    if condition:
        where.append(f"({writer.expression(_tokens(condition))})")
    return f"{head} WHERE {' AND '.join(where)}", tuple(writer.parameters)


_TRANSIENT = {
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
}

#: Statement errors of the probe that say nothing about PartiQL (the probe's item was
#: throttled or in a transaction's way): transactions this time, the endpoint asked again next.
_STATEMENT_TRANSIENT = {
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
    "RequestLimitExceeded",
    "InternalServerError",
    "TransactionConflict",
}
#: How long a "no" is kept (seconds) before the endpoint is asked again: a role granted
#: ``dynamodb:PartiQLUpdate`` later (or a policy rolled back) is noticed by warm processes too.
ASK_AGAIN_AFTER = 300.0
#: The clock of that wait (a module attribute, so a test can move it).
_monotonic = time.monotonic


def refused(state: TableState) -> None:
    """PartiQL was denied on the table after a probe said yes (a policy taken back, an SCP):
    batches go the transactional way from now on, and the endpoint is asked again after
    :data:`ASK_AGAIN_AFTER` seconds."""
    state.partiql = (False, _monotonic())


def probe_op(table: str, probe_key: Mapping[str, Any]) -> dict[str, Any]:
    """The probe's conditional update of ``probe_key`` (which must not exist), using every form
    the translation produces; in dynacoord's names (the table session translates it)."""
    return {
        "TableName": table,
        "Key": dict(probe_key),
        "ConditionExpression": "#p = :one AND attribute_not_exists(x) AND (n <= :one OR NOT n > :one)",
        "UpdateExpression": "SET #p = :one, n = n + :one, m = :one - :one REMOVE gone, gone2",
        "ExpressionAttributeNames": {"#p": "probe"},
        "ExpressionAttributeValues": {":one": {"N": "1"}},
    }


def supported(state: TableState, client: Any, probe: dict[str, Any]) -> bool:
    """Whether ``client``'s endpoint runs conditional PartiQL batches as DynamoDB does: the
    ``probe`` statement (of :func:`probe_op`) must come back refused with
    ``ConditionalCheckFailed``. The answer is kept in ``state`` (the table's, per client): a
    "yes" for good, a "no" for :data:`ASK_AGAIN_AFTER` seconds; an answer that says nothing (a
    throttled or conflicting probe statement) is not kept. One request and one write unit per
    probe."""
    known = state.partiql
    if known is not None and (known[0] or _monotonic() - known[1] < ASK_AGAIN_AFTER):
        return known[0]
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        answer = client.batch_execute_statement(Statements=[probe])
        (response,) = answer["Responses"]
        code = response.get("Error", {}).get("Code")
        if code in _STATEMENT_TRANSIENT:
            return False  # no answer about PartiQL: transactions now, ask again next time
        ok = bool(code == "ConditionalCheckFailed")
    except (BotoCoreError, ClientError) as error:
        code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
        if not isinstance(error, ClientError) or code in _TRANSIENT:
            raise  # no answer about PartiQL: ask again next time
        ok = False
    except Exception:  # an endpoint whose PartiQL breaks on it (moto's): transactions
        ok = False
    state.partiql = (ok, _monotonic())
    return ok
