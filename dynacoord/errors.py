"""The dynacoord error tree.

Every error raised on purpose by dynacoord derives from :class:`DynacoordError`. Errors carry the
context a caller needs to act (key, owner, expiry, ...) as attributes, and chain the underlying
botocore / redis / pymongo exception with ``raise ... from``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "BackendError",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CircuitOpenError",
    "ConfigurationError",
    "CounterTypeError",
    "CredentialsError",
    "DuplicateEventError",
    "DynacoordError",
    "FenceRejectedError",
    "GlobalTableError",
    "IdempotencyError",
    "IdempotencyInProgressError",
    "IdempotencyKeyMismatchError",
    "IdempotencyValueError",
    "InvalidKeyError",
    "InvalidValueError",
    "JobQueueError",
    "JobSendError",
    "JoinMismatchError",
    "LockError",
    "LockLostError",
    "LockNotAcquiredError",
    "NotSupportedError",
    "OutboxError",
    "RateLimitError",
    "RateLimitedError",
    "RelayError",
    "RunError",
    "RunExistsError",
    "RunNotFoundError",
    "RunNotRunningError",
    "SemaphoreError",
    "SemaphoreFullError",
    "StackDeploymentError",
    "TableNotReadyError",
    "TransactionCancelledError",
    "TransactionTooLargeError",
    "ValueTooLargeError",
]


class DynacoordError(Exception):
    """Root of every error dynacoord raises on purpose."""


class ConfigurationError(DynacoordError, ValueError):
    """A backend or primitive was configured with an invalid setting."""


class InvalidKeyError(DynacoordError, ValueError):
    """A key or namespace cannot be stored (empty, ``#`` in a namespace, too long, not a str)."""

    def __init__(self, message: str, *, key: object = None) -> None:
        super().__init__(message)
        self.key = key


class InvalidValueError(DynacoordError, ValueError):
    """A value cannot be stored or used: not encodable (not JSON-compatible, NaN, recursive, ...),
    or an argument of the right type out of its range (a TTL of 0, NaN or 20 years, a count
    below its minimum, ...). Also a ``ValueError``, so ``except ValueError`` keeps working."""


class ValueTooLargeError(InvalidValueError):
    """The encoded item would exceed the backend's item size limit (DynamoDB: 400 KB)."""

    def __init__(self, message: str, *, size: int, limit: int, key: object = None) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit
        self.key = key


class BackendError(DynacoordError):
    """The store answered with an error dynacoord does not translate into a domain error."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class CredentialsError(BackendError):
    """The AWS client has no credentials (botocore's ``NoCredentialsError``, chained as the
    cause): nothing was sent. ``region`` is the client's."""

    def __init__(self, message: str, *, region: str | None = None) -> None:
        super().__init__(message, code="NoCredentials")
        self.region = region


class TableNotReadyError(BackendError):
    """The table does not exist, is not ACTIVE, or does not have the expected schema."""

    def __init__(self, message: str, *, table_name: str | None = None) -> None:
        super().__init__(message, code="TableNotReady")
        self.table_name = table_name


class GlobalTableError(ConfigurationError):
    """A write refused before it was sent because the table is a DynamoDB global table that
    cannot keep its promise: on an eventually consistent one (MREC) a condition is checked
    against the writer's own Region only, so two Regions could both win a lock, a claim or a
    count; a strongly consistent one (MRSC) runs no transactions. ``table_name``,
    ``consistency`` (``"EVENTUAL"`` or ``"STRONG"``), ``regions`` (the replicas' Regions) and
    ``operation`` (the DynamoDB operation refused) say which; the message names the choices."""

    def __init__(
        self,
        message: str,
        *,
        table_name: str,
        consistency: str,
        regions: Sequence[str],
        operation: str,
    ) -> None:
        super().__init__(message)
        self.table_name = table_name
        self.consistency = consistency
        self.regions = tuple(regions)
        self.operation = operation


class NotSupportedError(DynacoordError):
    """The backend cannot offer this operation with the promised guarantees."""


class TransactionTooLargeError(DynacoordError, ValueError):
    """A transaction would hold more items than the store allows (DynamoDB: 100)."""

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class TransactionCancelledError(BackendError):
    """A transaction was cancelled; ``reasons`` holds one entry per item (code or None)."""

    def __init__(self, message: str, *, reasons: Sequence[dict[str, Any]]) -> None:
        super().__init__(message, code="TransactionCanceledException")
        self.reasons = list(reasons)


class StackDeploymentError(DynacoordError):
    """A CloudFormation deployment failed; ``events`` lists the failed resource events."""

    def __init__(self, message: str, *, stack_name: str, events: Sequence[dict[str, Any]]) -> None:
        super().__init__(message)
        self.stack_name = stack_name
        self.events = list(events)


# --- locks -----------------------------------------------------------------------------------


class LockError(DynacoordError):
    """Base of lock errors; carries the lock key and owner."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        owner: str | None = None,
        expires_at: float | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.owner = owner
        self.expires_at = expires_at


class LockNotAcquiredError(LockError):
    """The lock is held by someone else and the timeout ran out."""


class FenceRejectedError(LockError):
    """A write carrying a lease's fence was refused where it lands: the resource holds a larger
    fence (a later holder wrote it), so this lease is stale and its write was not applied.

    ``fence`` is the fence the write carried; ``stored_fence`` the one found at the resource
    (None when not known); ``resource`` names the item (table or collection and key, or the
    Redis key)."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        owner: str | None,
        fence: int,
        stored_fence: int | None = None,
        resource: str | None = None,
    ) -> None:
        super().__init__(message, key=key, owner=owner)
        self.fence = fence
        self.stored_fence = stored_fence
        self.resource = resource


class LockLostError(FenceRejectedError, TransactionCancelledError):
    """A transaction guarded by ``lease.guard(tx)`` was cancelled because the lease no longer
    holds the lock (released, expired, or taken over with a larger fence): nothing in the
    transaction was written. Also a :class:`TransactionCancelledError` (``reasons`` as there);
    ``holder`` and ``stored_fence`` are the lock's owner and fence as the refusal saw them
    (None when the lock item was free or gone)."""

    def __init__(
        self,
        message: str,
        *,
        key: str,
        owner: str | None,
        fence: int,
        holder: str | None = None,
        stored_fence: int | None = None,
        reasons: Sequence[dict[str, Any]] = (),
    ) -> None:
        # The two bases take different keywords, so each part is set here rather than through
        # a cooperative super() chain.
        Exception.__init__(self, message)
        self.key = key
        self.owner = owner
        self.expires_at = None
        self.fence = fence
        self.stored_fence = stored_fence
        self.resource = None
        self.code = "TransactionCanceledException"
        self.reasons = list(reasons)
        self.holder = holder


# --- semaphores --------------------------------------------------------------------------------


class SemaphoreError(DynacoordError):
    """Base of semaphore errors; carries the semaphore's name, its limit and the holders seen."""

    def __init__(self, message: str, *, name: str, limit: int, holders: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.limit = limit
        #: the live permits (:class:`~dynacoord.PermitInfo`) at the last look, oldest fence first
        self.holders = tuple(holders)


class SemaphoreFullError(SemaphoreError):
    """Every permit of the semaphore is held and the timeout ran out (or the call did not block)."""


# --- rate limiters ------------------------------------------------------------------------------


class RateLimitError(DynacoordError):
    """Base of rate limiter errors; carries the limiter's name."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class RateLimitedError(RateLimitError):
    """``RateLimiter.acquire`` was not admitted within its timeout. ``retry_after``: seconds
    until the call would have been admitted, as the limiter last answered (an HTTP
    ``Retry-After``)."""

    def __init__(self, message: str, *, name: str, retry_after: float) -> None:
        super().__init__(message, name=name)
        self.retry_after = retry_after


# --- circuit breaker ----------------------------------------------------------------------------


class CircuitOpenError(DynacoordError):
    """The circuit is open (or half-open with every trial slot taken); the call was not made."""

    def __init__(
        self, message: str, *, name: str, retry_after: float, opened_at: float | None
    ) -> None:
        super().__init__(message)
        self.name = name
        #: seconds until the breaker may let a trial call through
        self.retry_after = retry_after
        self.opened_at = opened_at


# --- checkpoints -----------------------------------------------------------------------------


class CheckpointExistsError(DynacoordError):
    """A checkpoint with this sequence already exists; it was not overwritten."""

    def __init__(self, message: str, *, task_id: str, sequence: int) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.sequence = sequence


class CheckpointNotFoundError(DynacoordError, KeyError):
    """No checkpoint with this id exists (or it expired)."""

    def __init__(self, message: str, *, checkpoint_id: str) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


# --- idempotency -----------------------------------------------------------------------------


class IdempotencyError(DynacoordError):
    """Base of idempotency errors; carries the idempotency key."""

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class IdempotencyInProgressError(IdempotencyError):
    """Another call with the same key is running now."""

    def __init__(self, message: str, *, key: str, expires_at: float | None = None) -> None:
        super().__init__(message, key=key)
        self.expires_at = expires_at


class IdempotencyKeyMismatchError(IdempotencyError):
    """The same key was used with a different payload."""


class IdempotencyValueError(IdempotencyError, InvalidValueError):
    """The function's result cannot be stored (not JSON-compatible or too large)."""


# --- outbox ------------------------------------------------------------------------------------


class OutboxError(DynacoordError):
    """Base of outbox errors."""


# --- workflow runs -----------------------------------------------------------------------------


class RunError(DynacoordError):
    """Base of workflow-run errors; carries the run id."""

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


class RunExistsError(RunError):
    """A run with this id already exists."""


class RunNotFoundError(RunError, KeyError):
    """No run with this id exists (or it expired)."""

    def __str__(self) -> str:
        return str(self.args[0])


# --- counters, joins, workflow runs (continued), job queue ------------------------------------


class CounterTypeError(DynacoordError, TypeError):
    """The key holds another kind of item (a flag, a join or a counter) than the call needs."""

    def __init__(self, message: str, *, key: str, kind: str) -> None:
        super().__init__(message)
        self.key = key
        #: the kind of the stored item: "counter", "flag" or "join"
        self.kind = kind


class JoinMismatchError(DynacoordError, ValueError):
    """A join was arrived at with an ``expected`` count other than the one it was created with."""

    def __init__(self, message: str, *, key: str, expected: int, stored_expected: int) -> None:
        super().__init__(message)
        self.key = key
        self.expected = expected
        self.stored_expected = stored_expected


class RunNotRunningError(RunError):
    """The run exists but has ended (completed or failed): it can no longer be changed."""

    def __init__(self, message: str, *, run_id: str, status: str) -> None:
        super().__init__(message, run_id=run_id)
        self.status = status


class JobQueueError(DynacoordError):
    """Base of job-queue errors."""


class JobSendError(JobQueueError):
    """Some jobs could not be sent; ``failed`` lists (index, code, message) per unsent job."""

    def __init__(self, message: str, *, failed: Sequence[tuple[int, str, str]]) -> None:
        super().__init__(message)
        self.failed = list(failed)


# --- outbox (publishing and relays) -------------------------------------------------------------


class DuplicateEventError(TransactionCancelledError, OutboxError):
    """An event with the same id but different content is already stored; nothing was written.

    ``event_ids`` lists the conflicting ids. A subclass of :class:`TransactionCancelledError`
    because inside ``backend.transaction()`` the whole transaction (business writes too) was
    cancelled; ``reasons`` then holds the per-item reasons.
    """

    def __init__(
        self,
        message: str,
        *,
        event_ids: Sequence[str],
        reasons: Sequence[dict[str, Any]] = (),
    ) -> None:
        super().__init__(message, reasons=reasons)
        self.event_ids = list(event_ids)


class RelayError(OutboxError):
    """A relay could not send some events; ``failed`` lists (event_id, code, message) per event."""

    def __init__(self, message: str, *, failed: Sequence[tuple[str, str, str]]) -> None:
        super().__init__(message)
        self.failed = list(failed)
