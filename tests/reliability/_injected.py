"""Faults the delivery fault model injects into one actor's DynamoDB requests (issue 36), with
botocore event hooks on the client, never by changing library code; and skewed clocks.

What :class:`Injector` does to the requests an actor sends while it is *acting* (the model's
gated store runs each store call of an actor, and of its lease keeper, inside
:meth:`Injector.acting`):

* **per-request throttles** (``ThrottlingException``, ``ProvisionedThroughputExceededException``,
  ``RequestLimitExceeded``, ``InternalServerError``): a ``before-send`` hook answers the next
  request (of one operation, or any) ``count`` times with the error instead of sending it;
  botocore's own retry sends it again (a ``needs-retry`` hook makes the retry immediate: the
  model's time is a ManualClock, and real backoff would only slow the run). Nothing is applied
  until the request goes through.
* **per-statement errors inside a** ``BatchExecuteStatement`` (``ThrottlingError``,
  ``ProvisionedThroughputExceeded``, ``TransactionConflict``, ``InternalServerError``,
  ``RequestLimitExceeded``): a ``provide-client-params`` hook drops the chosen statements from
  the request (they are *not* applied), and an ``after-call`` hook splices an error response in
  at each one's index, as DynamoDB answers a statement it did not run. A request all of whose
  statements are refused (the one-statement PartiQL probe) is not sent: a ``before-call`` hook
  answers it.
* **transactions cancelled by** ``TransactionConflict``: a ``before-call`` hook answers the next
  ``rounds`` ``TransactWriteItems`` with ``TransactionCanceledException`` (one item conflicting,
  the others ``None``), nothing applied.
* **a permission that changes**: while :attr:`Injector.partiql_denied`, every
  ``BatchExecuteStatement`` on the client (any caller: a policy is the account's) is answered
  ``AccessDeniedException``.

Requests sent outside :meth:`Injector.acting` (the model's own publishers and readers) are never
touched, except by the permission.
"""

from __future__ import annotations

import contextlib
import json
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "STATEMENT_CODES",
    "THROTTLE_CODES",
    "Injector",
    "Plan",
    "SkewedClock",
    "forget_partiql",
]

#: per-request errors botocore retries (throttles, and a 500)
THROTTLE_CODES = (
    "ThrottlingException",
    "ProvisionedThroughputExceededException",
    "RequestLimitExceeded",
    "InternalServerError",
)
#: per-statement errors of a BatchExecuteStatement for a statement DynamoDB did not apply
STATEMENT_CODES = (
    "ThrottlingError",
    "ProvisionedThroughputExceeded",
    "TransactionConflict",
    "InternalServerError",
    "RequestLimitExceeded",
)

_MARK = "x-dynacoord-injected"
_PREFIX = "com.amazonaws.dynamodb.v20120810#"


class _Body:
    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


@dataclass
class Plan:
    """What to do to one actor's next requests (consumed as they are sent)."""

    #: (operation or None for any, answers left, error code): the next matching request is
    #: answered with the error that many times before it goes through
    throttles: list[list[Any]] = field(default_factory=list)
    #: per BatchExecuteStatement to come: (positions, taken modulo its length; error code)
    statements: list[tuple[list[int], str]] = field(default_factory=list)
    #: the next this many TransactWriteItems are cancelled with TransactionConflict
    conflicts: int = 0
    #: which item of a cancelled transaction conflicts (modulo its length)
    conflict_at: int = 0
    #: only transactions that store outcomes (an ordered group's outcomes with its gate)
    conflict_outcomes: bool = False
    #: what was injected, for the history's log
    done: dict[str, int] = field(default_factory=dict)

    def clear(self) -> None:
        self.throttles.clear()
        self.statements.clear()
        self.conflicts = 0

    def count(self, what: str) -> None:
        self.done[what] = self.done.get(what, 0) + 1


class Injector:
    """The hooks on one DynamoDB client (made once per client: :meth:`of`)."""

    _by_client: weakref.WeakKeyDictionary[Any, Injector] = weakref.WeakKeyDictionary()
    _guard = threading.Lock()

    def __init__(self, client: Any) -> None:
        self.partiql_denied = False
        self.denials = 0
        self._local = threading.local()
        events = client.meta.events
        events.register_first("before-send.dynamodb", self._before_send)
        events.register_first("needs-retry.dynamodb", self._needs_retry)
        events.register_first("before-call.dynamodb", self._before_call)
        events.register(
            "provide-client-params.dynamodb.BatchExecuteStatement", self._drop_statements
        )
        events.register("after-call.dynamodb.BatchExecuteStatement", self._splice)

    @classmethod
    def of(cls, client: Any) -> Injector:
        with cls._guard:
            injector = cls._by_client.get(client)
            if injector is None:
                injector = cls._by_client[client] = cls(client)
            return injector

    @contextlib.contextmanager
    def acting(self, plan: Plan | None) -> Iterator[None]:
        """Requests sent by this thread meanwhile are ``plan``'s."""
        previous = getattr(self._local, "plan", None)
        self._local.plan = plan
        try:
            yield
        finally:
            self._local.plan = previous

    def _plan(self) -> Plan | None:
        return getattr(self._local, "plan", None)

    # -- per-request throttles -----------------------------------------------------------------

    def _before_send(self, request: Any, event_name: str, **_: Any) -> Any:
        plan = self._plan()
        if plan is None or not plan.throttles:
            return None
        operation = event_name.rsplit(".", 1)[-1]
        for slot in plan.throttles:
            wanted, left, code = slot
            if wanted in (None, operation) and left > 0:
                slot[1] -= 1
                if slot[1] <= 0:
                    plan.throttles.remove(slot)
                plan.count(f"{operation} {code}")
                status = 500 if code == "InternalServerError" else 400
                return _response(
                    request.url, status, {"__type": _PREFIX + code, "message": "injected"}
                )
        return None

    def _needs_retry(self, response: Any = None, **_: Any) -> Any:
        if response is not None and response[0] is not None and _MARK in response[0].headers:
            return 0  # retried at once (botocore's own handler decides nothing else here)
        return None

    # -- answers without sending: permission, conflicts, a probe refused -------------------------

    def _before_call(self, model: Any, params: Any, **_: Any) -> Any:
        operation = model.name
        if operation == "BatchExecuteStatement" and self.partiql_denied:
            self.denials += 1
            return _error(400, "AccessDeniedException", "injected: PartiQL permission withdrawn")
        plan = self._plan()
        if plan is None:
            return None
        body_text = params.get("body")
        if (
            operation == "TransactWriteItems"
            and plan.conflicts > 0
            and (not plan.conflict_outcomes or b"finished_by" in _bytes(body_text))
        ):
            plan.conflicts -= 1
            plan.count("TransactionConflict")
            body = json.loads(body_text) if isinstance(body_text, (bytes, str)) else {}
            count = max(1, len(body.get("TransactItems", [])))
            at = plan.conflict_at % count
            reasons = [
                {"Code": "TransactionConflict", "Message": "Transaction is ongoing for the item"}
                if i == at
                else {"Code": "None"}
                for i in range(count)
            ]
            parsed = _error(
                400,
                "TransactionCanceledException",
                "Transaction cancelled, please refer cancellation reasons for specific reasons "
                f"[{', '.join(r['Code'] for r in reasons)}]",
            )
            parsed[1]["CancellationReasons"] = reasons
            return parsed
        if operation == "BatchExecuteStatement":
            everything = getattr(self._local, "refuse_all", None)
            if everything is not None:
                self._local.refuse_all = None
                answers = [{"Error": {"Code": code, "Message": "injected"}} for code in everything]
                http = _response("https://injected", 200, {})
                return http, {"Responses": answers, "ResponseMetadata": {"HTTPStatusCode": 200}}
        return None

    # -- statements of a batch that are not applied ---------------------------------------------

    def _drop_statements(self, params: Any, **_: Any) -> Any:
        self._local.splice = None
        self._local.refuse_all = None
        plan = self._plan()
        if plan is None or not plan.statements or self.partiql_denied:
            return None
        positions, code = plan.statements.pop(0)
        statements = list(params.get("Statements", []))
        refused = sorted({p % len(statements) for p in positions}) if statements else []
        if not refused:
            return None
        plan.count(f"statement {code} x{len(refused)}/{len(statements)}")
        if len(refused) == len(statements):
            self._local.refuse_all = [code] * len(statements)
            return None
        self._local.splice = (refused, code)
        kept = [s for i, s in enumerate(statements) if i not in refused]
        return {**params, "Statements": kept}

    def _splice(self, parsed: Any, **_: Any) -> None:
        splice = getattr(self._local, "splice", None)
        self._local.splice = None
        if splice is None or not isinstance(parsed, dict) or "Responses" not in parsed:
            return
        refused, code = splice
        responses = list(parsed["Responses"])
        for index in refused:
            responses.insert(index, {"Error": {"Code": code, "Message": "injected"}})
        parsed["Responses"] = responses


def _bytes(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    return body.encode() if isinstance(body, str) else b""


def _response(url: str, status: int, body: dict[str, Any]) -> Any:
    from botocore.awsrequest import AWSResponse

    headers = {
        "content-type": "application/x-amz-json-1.0",
        "x-amzn-requestid": "injected",
        _MARK: "1",
    }
    return AWSResponse(url, status, headers, _Body(json.dumps(body).encode()))


def _error(status: int, code: str, message: str) -> tuple[Any, dict[str, Any]]:
    http = _response("https://injected", status, {"__type": _PREFIX + code, "message": message})
    parsed = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return http, parsed


def forget_partiql(client: Any) -> None:
    """Forget what the library learned of ``client``'s PartiQL (a fresh process: its first batch
    probes again), so a history's faults meet the probe. Test-side: the library keeps the answer
    per client, and the session's client outlives each history."""
    from dynacoord._table_state import table_states

    for state in table_states(client):
        state.partiql = None


class SkewedClock:
    """A view of the model's ManualClock ``offset_ms`` off (a host clock that differs)."""

    def __init__(self, base: Any, offset_ms: int = 0) -> None:
        self.base = base
        self.offset_ms = offset_ms

    def time(self) -> float:
        return self.base.time() + self.offset_ms / 1000

    def monotonic(self) -> float:
        return float(self.base.monotonic())

    def sleep(self, seconds: float) -> None:
        self.base.sleep(seconds)

    def __repr__(self) -> str:
        return f"SkewedClock({self.offset_ms:+d} ms)"
