"""The DynamoDB table session: one table through one client, and the one request path every
DynamoDB store sends through.

:meth:`DynamoTable.call` runs the stages of a request in order, each a method a reader can point
at (docs/architecture.md, "One request path on DynamoDB"):

1. the **guards** (:attr:`DynamoTable.guards`): the first-use check (``_verify.FirstUseCheck``,
   which removes itself once the table passed) and, on a global table, the gate that refuses the
   writes it could not keep (``_global_tables.Gate``); none on a checked table in one Region;
2. the **translation** to a :class:`~dynacoord.TableLayout`'s names and back (``_layout.py``;
   none for dynacoord's own schema);
3. the **request** itself;
4. the **errors**: botocore's (a ``ClientError``, missing credentials) to dynacoord's, in one
   place (:meth:`DynamoTable.translate`);
5. the **metrics** (latency, errors, consumed capacity), when a listener is set.

What the process learns of the table (checked, PartiQL or not, join generations) is
:attr:`DynamoTable.state`, shared by every backend on the same client and table. Marshalling is
``_marshal.py``, the counting slots ``_counting.py``, the retry window ``_retry_window.py``; no
boto3/botocore import at module level (the cold-start path; see ``_marshal.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard, cast

from ..._table_schema import DEFAULT_LAYOUT, TableLayout
from ..._table_state import TableState, table_state
from ...errors import (
    BackendError,
    CredentialsError,
    InvalidValueError,
    TableNotReadyError,
    TransactionCancelledError,
    TransactionTooLargeError,
    ValueTooLargeError,
)
from ...metrics import NO_METRICS, Metrics, measure_request
from ._limits import MAX_TRANSACTION_BYTES
from ._marshal import marshal, unmarshal
from ._retry_window import client_window_ms

if TYPE_CHECKING:
    from ._layout import Translator

__all__ = [
    "FREE",
    "LIVE",
    "REQUEST_TOKEN",
    "ConditionFailedError",
    "DynamoTable",
    "Guard",
    "Send",
    "request_token",
    "written_by",
]

#: the rest of the request path after a guard: ``send(operation, kwargs)`` -> the answer
Send = Callable[[str, dict[str, Any]], dict[str, Any]]
#: a guard of :meth:`DynamoTable.call` (stage 1): ``guard(operation, kwargs, send)`` refuses the
#: request (raises) or passes it on with ``send`` and returns the answer
Guard = Callable[[str, dict[str, Any], Send], dict[str, Any]]

#: operations that can report their consumed capacity, and the metric name of each operation
_CAPACITY_OPERATIONS = frozenset(
    {
        "get_item",
        "put_item",
        "update_item",
        "delete_item",
        "query",
        "scan",
        "batch_get_item",
        "batch_write_item",
        "transact_write_items",
        "transact_get_items",
        "batch_execute_statement",
    }
)
_OPERATION_NAMES = {
    name: "".join(p.title() for p in name.split("_")) for name in _CAPACITY_OPERATIONS
}

#: The condition of a write that creates an item: no item, or an expired one (DynamoDB's TTL
#: sweeper may lag by days, so an expired item counts as absent). Needs ``:now``.
FREE = "attribute_not_exists(pk) OR expires_at_ms <= :now"
#: The attribute holding the request token of the write that last created or changed an item:
#: a retried write whose refusal shows its own token knows its first attempt applied.
REQUEST_TOKEN = "req"


def written_by(item: Mapping[str, Any] | None, token: str) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``item`` (a refusal's ALL_OLD) was written by the request carrying ``token``: a
    retry of an applied write whose first response was lost."""
    return item is not None and item.get(REQUEST_TOKEN) == token


def request_token() -> str:
    """A fresh per-call request token (64 random bits)."""
    return os.urandom(8).hex()  # secrets.token_hex(8), without its two Python frames


#: The item (if any) has not expired: no expiry, or one still ahead of ``:now``.
LIVE = "(attribute_not_exists(expires_at_ms) OR expires_at_ms > :now)"


class ConditionFailedError(Exception):
    """Internal: a condition expression was false. ``raw`` is the item as it was, if returned
    (attribute values), and ``item`` the same as Python values, converted on first use: many
    refusals are decided by one attribute (a request token) and need no conversion at all."""

    def __init__(self, raw: dict[str, Any] | None) -> None:
        super().__init__("conditional check failed")
        self.raw = raw
        self._item: dict[str, Any] | None = None

    @property
    def item(self) -> dict[str, Any] | None:
        if self._item is None and self.raw:
            self._item = unmarshal(self.raw)
        return self._item


#: operations whose request names its tables inside (no ``TableName`` of their own)
_MULTI_TABLE_OPERATIONS = frozenset(
    {"transact_write_items", "batch_get_item", "batch_write_item", "batch_execute_statement"}
)


_AS_IS = "_dynacoord_as_is"  # DynamoTable.call_as_is's mark, taken off by the translation


class DynamoTable:
    """The table session: one table through one client, as every store of a backend sends to it,
    with request helpers that each make exactly one request.

    ``layout`` (not the default) is translated on every request and answer at one point, the
    :class:`~._layout.Translator`; the stores write dynacoord's own schema. ``state`` is what
    this process knows of the table through ``client``, shared with every other session on the
    same client and table (:func:`dynacoord._table_state.table_state`)."""

    def __init__(
        self,
        client: Any,
        table_name: str,
        *,
        metrics: Metrics = NO_METRICS,
        layout: TableLayout = DEFAULT_LAYOUT,
    ) -> None:
        # boto3 is loaded: the client exists
        from botocore.exceptions import ClientError, NoCredentialsError, PartialCredentialsError

        self.client = client
        self.name = table_name
        self.layout = layout
        #: the layout's translation (None for the default layout: no translation at all)
        self.translator: Translator | None = None
        if not layout.is_default:
            from ._layout import Translator

            self.translator = Translator(layout, table_name)
        self.state: TableState = table_state(client, table_name)
        #: how long botocore may re-send a counting write after its call started
        #: (``_retry_window.retry_window_ms`` of the client's configuration)
        self.count_window_ms = client_window_ms(client)
        self._client_error: type[Exception] = ClientError
        #: what the error stage translates: botocore's answer, and no credentials to sign with
        self._botocore_errors: tuple[type[Exception], ...] = (
            ClientError,
            NoCredentialsError,
            PartialCredentialsError,
        )
        self._credentials_errors = (NoCredentialsError, PartialCredentialsError)
        self.metrics = metrics
        #: the guards every request passes first, in order (see :meth:`call`); a guard that is
        #: passed for good removes itself, so a checked table in one Region has none and a
        #: request pays one empty tuple's test (measured: +11 ns of CPU per call)
        self.guards: tuple[Guard, ...] = ()

    # -- the request path -----------------------------------------------------------------------

    def call(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """Call ``client.<operation>(TableName=..., **kwargs)``, kwargs in dynacoord's names.

        The stages, in this order (docs/architecture.md):

        1. the guards (:attr:`guards`, :meth:`_guarded`): the first-use check, then a global
           table's gate, each passing the request on or raising;
        2. the layout's translation, request and answer (:meth:`_translated`; none for the
           default layout);
        3. the request (:meth:`_send`);
        4. its errors translated (:meth:`translate`);
        5. the metrics (:meth:`_measured`, when a listener is set).

        Raises :class:`ConditionFailedError` (internal) for a false condition, carrying the old item
        when ``ReturnValuesOnConditionCheckFailure=ALL_OLD`` was asked for.
        """
        if operation not in _MULTI_TABLE_OPERATIONS:
            kwargs.setdefault("TableName", self.name)
        guards = self.guards
        if guards:
            return self._guarded(guards, operation, kwargs)
        if self.translator is not None:
            return self._translated(operation, kwargs)
        return self._send(operation, kwargs)

    def call_as_is(self, operation: str, **kwargs: Any) -> dict[str, Any]:
        """:meth:`call` on the application's own items (any table, its own names: a fenced write)
        without stage 2; marked, as a guard may send on through :meth:`call` (first-use check)."""
        if self.translator is not None:
            kwargs[_AS_IS] = True
        return self.call(operation, **kwargs)

    def _guarded(
        self, guards: tuple[Guard, ...], operation: str, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """Stage 1: the first of ``guards`` passes the request on to the others and the rest of
        the path, or raises. A guard's own request (the first-use check's DescribeTable) made
        without credentials is said by the error stage too (:meth:`translate`)."""
        rest = guards[1:]
        send: Send = self._unguarded if not rest else (lambda o, k: self._guarded(rest, o, k))
        try:
            return guards[0](operation, kwargs, send)
        except self._credentials_errors as exc:
            raise self.translate(exc) from exc

    def _unguarded(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Stages 2 to 5: the path after the guards."""
        if self.translator is not None:
            return self._translated(operation, kwargs)
        return self._send(operation, kwargs)

    def _send(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Stages 3 and 4 (and 5, through :meth:`_measured`): the request as it is, its errors
        translated."""
        if self.metrics.enabled:
            return self._measured(operation, kwargs)
        try:
            response: dict[str, Any] = getattr(self.client, operation)(**kwargs)
        except self._botocore_errors as exc:
            raise self.translate(exc) from exc
        return response

    def _translated(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """:meth:`call` on a table with a layout: the request in the layout's names, the answer
        and the items of a refusal back in dynacoord's."""
        translator = self.translator
        assert translator is not None
        request = None if kwargs.pop(_AS_IS, None) else translator.request_for(operation, kwargs)
        if request is None:  # already in the layout's names: call_as_is, a caller's transaction
            return self._send(operation, kwargs)
        try:
            response = self._send(operation, request)
        except ConditionFailedError as failed:
            if failed.raw:
                failed.raw = translator.item_in(failed.raw)
            raise
        except TransactionCancelledError as cancelled:
            cancelled.reasons = translator.reasons_in(cancelled.reasons)
            raise
        return translator.answer(response)

    def statement(self, action: str, op: Mapping[str, Any]) -> dict[str, Any]:
        """The PartiQL statement of a transaction item's ``Update``/``Delete`` (dynacoord's
        names), in the table's names (``_partiql.statement``; its refused items come back
        translated with the answer of :meth:`call`)."""
        from . import _partiql

        translator = self.translator
        return _partiql.statement(action, op if translator is None else translator.request(op))

    def statements_supported(self, probe_key: Mapping[str, Any]) -> bool:
        """Whether this endpoint runs conditional PartiQL batches on the table (asked once per
        client and table: ``_partiql.supported``); ``probe_key`` is a key that never exists."""
        from . import _partiql

        known = self.state.partiql
        if known is not None and known[0]:
            return True
        probe = self.statement("Update", _partiql.probe_op(self.name, probe_key))
        return _partiql.supported(self.state, self.client, probe)

    def stream_image(self, image: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """A stream record's image (DynamoDB JSON, in the table's names) in dynacoord's names, or
        None for an item of the application's sharing the table with a layout (not read
        through the client, so :meth:`call` never saw it)."""
        translator = self.translator
        if translator is None:
            return image
        return translator.item_in(image) if translator.owns(image) else None

    def _measured(self, operation: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """:meth:`call` reporting latency, errors and consumed capacity (dynacoord.metrics)."""
        if self.metrics.consumed_capacity and operation in _CAPACITY_OPERATIONS:
            kwargs.setdefault("ReturnConsumedCapacity", "TOTAL")
        dimensions = {
            "Backend": "dynamodb",
            "Operation": _OPERATION_NAMES.get(operation, operation),
        }
        start = time.perf_counter()
        try:
            response: dict[str, Any] = getattr(self.client, operation)(**kwargs)
        except self._botocore_errors as exc:
            translated = self.translate(exc)
            measure_request(
                self.metrics,
                dimensions,
                start,
                failed=not isinstance(translated, ConditionFailedError),
            )
            raise translated from exc
        except Exception:
            measure_request(self.metrics, dimensions, start, failed=True)
            raise
        capacity = response.get("ConsumedCapacity")
        if isinstance(capacity, dict):
            capacity = [capacity]
        units = sum(float(c.get("CapacityUnits", 0)) for c in capacity or ())
        measure_request(self.metrics, dimensions, start, capacity=units if capacity else None)
        return response

    def translate(self, exc: Any) -> Exception:
        """Stage 4: map a botocore ``ClientError``, or botocore's ``NoCredentialsError`` or
        ``PartialCredentialsError`` (raised before anything is sent), to the exception dynacoord
        raises for it."""
        if isinstance(exc, self._credentials_errors):
            return self._no_credentials()
        error = exc.response.get("Error", {})
        code = error.get("Code", "")
        message = error.get("Message", str(exc))
        if code == "ConditionalCheckFailedException":
            raw = cast("dict[str, Any] | None", exc.response.get("Item"))
            return ConditionFailedError(raw or None)
        if code == "ResourceNotFoundException":
            return TableNotReadyError(
                f"DynamoDB table {self.name!r} not found or not active: create it with "
                f"`dynacoord table create --table {self.name}` ({message})",
                table_name=self.name,
            )
        if code == "TransactionCanceledException":
            reasons = cast("list[dict[str, Any]]", exc.response.get("CancellationReasons", []))
            summary = ", ".join(
                f"{i}:{r.get('Code')}" for i, r in enumerate(reasons) if r.get("Code") != "None"
            )
            return TransactionCancelledError(
                f"transaction cancelled ({summary or message})", reasons=reasons
            )
        if code == "ValidationException" and "multiple operations on one item" in message:
            # Two operations on one item the Transaction could not see (Puts into a table
            # whose key it does not know): DynamoDB refused the whole request.
            return InvalidValueError(
                f"one item appears twice in one transaction, nothing was written: {message}"
            )
        if code == "ValidationException" and "transaction payload size" in message.lower():
            return TransactionTooLargeError(
                f"DynamoDB refused the transaction, nothing was written: {message}",
                size=-1,
                limit=MAX_TRANSACTION_BYTES,
            )
        if (
            code == "ValidationException"
            and "size" in message.lower()
            and "item" in message.lower()
        ):
            # imported here: a rare error, and the codec stays off a Lambda's cold path
            from ...codec import DYNAMODB_ITEM_LIMIT

            return ValueTooLargeError(
                f"DynamoDB refused the item as too large: {message}",
                size=-1,
                limit=DYNAMODB_ITEM_LIMIT,
            )
        return BackendError(f"DynamoDB {code}: {message}", code=code)

    def _no_credentials(self) -> CredentialsError:
        """The error of a request botocore could not sign: it says what to configure (botocore's
        own is a bare ``Unable to locate credentials``)."""
        region = getattr(getattr(self.client, "meta", None), "region_name", None)
        return CredentialsError(
            f"no AWS credentials for the DynamoDB client (region {region}): configure them "
            "(AWS_PROFILE, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or an instance, container "
            "or Lambda role; DynamoDB Local takes any pair, e.g. "
            "dynacoord.testing.DUMMY_CREDENTIALS) or pass a client that has them; nothing was sent",
            region=region,
        )

    # -- one-request helpers ----------------------------------------------------------------

    def get(self, key: Mapping[str, str], *, consistent: bool = True) -> dict[str, Any] | None:
        return self.get_item(marshal(key), consistent=consistent)

    def get_item(self, key: dict[str, Any], *, consistent: bool = True) -> dict[str, Any] | None:
        """:meth:`get` of a key already marshalled (:func:`primary`)."""
        raw = self.get_raw(key, consistent=consistent)
        return unmarshal(raw) if raw else None

    def get_raw(self, key: dict[str, Any], *, consistent: bool = True) -> dict[str, Any] | None:
        """:meth:`get_item` without the unmarshal: the item as attribute values (or None), for
        a store that reads the few attributes it needs straight from them."""
        item: dict[str, Any] | None = self.call("get_item", Key=key, ConsistentRead=consistent).get(
            "Item"
        )
        return item

    def put_if_free(self, item: Mapping[str, Any], now_ms: int) -> bool:
        """PutItem of ``item`` on condition :data:`FREE`; False (nothing written) when a live
        item holds its key.

        The item carries a fresh request token (:data:`REQUEST_TOKEN`): when botocore retries
        the put after its first response was lost, the refusal shows the item as it is, and
        that item carrying this call's token means the first attempt applied: True, as the
        lost response would have said.
        """
        return self.put_item_if_free(marshal(item), now_ms)

    def put_free(self, item: dict[str, Any], now_ms: int) -> None:
        """PutItem of ``item`` (marshalled) on condition :data:`FREE`: no item at its key, or
        only an expired one (past its TTL, not swept yet). A refusal raises
        :class:`ConditionFailedError` holding the live item that refused it (ALL_OLD)."""
        self.call(
            "put_item",
            Item=item,
            ConditionExpression=FREE,
            ExpressionAttributeValues={":now": {"N": str(now_ms)}},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def put_item_if_free(self, item: dict[str, Any], now_ms: int) -> bool:
        """:meth:`put_if_free` of an item already marshalled (``item`` gains the token)."""
        token = request_token()
        item[REQUEST_TOKEN] = {"S": token}
        try:
            self.put_free(item, now_ms)
        except ConditionFailedError as failed:
            # written_by on the one attribute it reads, without converting the whole item
            return failed.raw is not None and failed.raw.get(REQUEST_TOKEN) == {"S": token}
        return True

    def query_pages(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Yield every page of a Query (each page is one request), following LastEvaluatedKey."""
        while True:
            page = self.call("query", **kwargs)
            yield page
            last = page.get("LastEvaluatedKey")
            if not last:
                return
            kwargs["ExclusiveStartKey"] = last
