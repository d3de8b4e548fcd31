"""dynacoord: coordination primitives for services on AWS, on one DynamoDB table.

``import dynacoord`` is cheap: it does not import boto3, and each primitive module is loaded on
first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._clock import MANUAL_CLOCK_START, Clock, ManualClock, SystemClock
from .errors import (
    BackendError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CircuitOpenError,
    ConfigurationError,
    CounterTypeError,
    CredentialsError,
    DuplicateEventError,
    DynacoordError,
    FenceRejectedError,
    GlobalTableError,
    IdempotencyError,
    IdempotencyInProgressError,
    IdempotencyKeyMismatchError,
    IdempotencyValueError,
    InvalidKeyError,
    InvalidValueError,
    JobQueueError,
    JobSendError,
    JoinMismatchError,
    LockError,
    LockLostError,
    LockNotAcquiredError,
    NotSupportedError,
    OutboxError,
    RateLimitedError,
    RateLimitError,
    RelayError,
    RunError,
    RunExistsError,
    RunNotFoundError,
    RunNotRunningError,
    SemaphoreError,
    SemaphoreFullError,
    StackDeploymentError,
    TableNotReadyError,
    TransactionCancelledError,
    TransactionTooLargeError,
    ValueTooLargeError,
)

if TYPE_CHECKING:
    from ._table_schema import TableLayout
    from .aws_lambda import process_sqs_batch, process_stream_batch
    from .backends.dynamodb import DynamoDBBackend
    from .backends.dynamodb.transaction import Transaction
    from .breaker import BreakerOptions, BreakerStatus, CircuitBreaker, FailureRate
    from .breaker import State as BreakerState
    from .cache import Cache
    from .checkpoints import Checkpoint, Checkpoints, CheckpointTask
    from .counters import CounterItem, Counters, JoinResult
    from .fencing import FenceCondition, fence_condition
    from .idempotency import (
        Claim,
        ClaimResult,
        Idempotency,
        IdempotencyOptions,
        IdempotencyRecord,
        IdempotencyStatus,
        register_lambda_context,
    )
    from .jobs import ConsumeStats, SQSJobQueue
    from .leader import Leader, LeaderInfo
    from .locks import Lease, LockInfo, Locks
    from .metrics import EMFMetrics, LoggingMetrics, Metrics
    from .outbox import (
        Event,
        EventRecord,
        EventStatus,
        Outbox,
        OutboxStats,
        OutboxWorker,
        RetryReport,
    )
    from .ratelimit import RateDecision, RateLimiter
    from .relays import EventBridgeRelay, SNSRelay, SQSRelay
    from .runs import ReconcileStats, Run, Runs, RunStatus
    from .semaphore import Permit, PermitInfo, Semaphore, StoredSemaphore

__version__ = "0.1.0"

__all__ = [
    "MANUAL_CLOCK_START",
    "BackendError",
    "BreakerOptions",
    "BreakerState",
    "BreakerStatus",
    "Cache",
    "Checkpoint",
    "CheckpointExistsError",
    "CheckpointNotFoundError",
    "CheckpointTask",
    "Checkpoints",
    "CircuitBreaker",
    "CircuitOpenError",
    "Claim",
    "ClaimResult",
    "Clock",
    "ConfigurationError",
    "ConsumeStats",
    "CounterItem",
    "CounterTypeError",
    "Counters",
    "CredentialsError",
    "DuplicateEventError",
    "DynacoordError",
    "DynamoDBBackend",
    "EMFMetrics",
    "Event",
    "EventBridgeRelay",
    "EventRecord",
    "EventStatus",
    "FailureRate",
    "FenceCondition",
    "FenceRejectedError",
    "GlobalTableError",
    "Idempotency",
    "IdempotencyError",
    "IdempotencyInProgressError",
    "IdempotencyKeyMismatchError",
    "IdempotencyOptions",
    "IdempotencyRecord",
    "IdempotencyStatus",
    "IdempotencyValueError",
    "InvalidKeyError",
    "InvalidValueError",
    "JobQueueError",
    "JobSendError",
    "JoinMismatchError",
    "JoinResult",
    "Leader",
    "LeaderInfo",
    "Lease",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockNotAcquiredError",
    "Locks",
    "LoggingMetrics",
    "ManualClock",
    "Metrics",
    "NotSupportedError",
    "Outbox",
    "OutboxError",
    "OutboxStats",
    "OutboxWorker",
    "Permit",
    "PermitInfo",
    "RateDecision",
    "RateLimitError",
    "RateLimitedError",
    "RateLimiter",
    "ReconcileStats",
    "RelayError",
    "RetryReport",
    "Run",
    "RunError",
    "RunExistsError",
    "RunNotFoundError",
    "RunNotRunningError",
    "RunStatus",
    "Runs",
    "SNSRelay",
    "SQSJobQueue",
    "SQSRelay",
    "Semaphore",
    "SemaphoreError",
    "SemaphoreFullError",
    "StackDeploymentError",
    "StoredSemaphore",
    "SystemClock",
    "TableLayout",
    "TableNotReadyError",
    "Transaction",
    "TransactionCancelledError",
    "TransactionTooLargeError",
    "ValueTooLargeError",
    "__version__",
    "fence_condition",
    "process_sqs_batch",
    "process_stream_batch",
    "register_lambda_context",
]

# Everything but the errors and clocks is loaded on first attribute access: `import dynacoord`
# in a Lambda cold start then costs only what the handler uses (and never boto3 by itself).
_LAZY: dict[str, tuple[str, str]] = {
    "DynamoDBBackend": ("dynacoord.backends.dynamodb", "DynamoDBBackend"),
    "BreakerOptions": ("dynacoord.breaker", "BreakerOptions"),
    "BreakerState": ("dynacoord.breaker", "State"),
    "BreakerStatus": ("dynacoord.breaker", "BreakerStatus"),
    "Cache": ("dynacoord.cache", "Cache"),
    "Checkpoint": ("dynacoord.checkpoints", "Checkpoint"),
    "CheckpointTask": ("dynacoord.checkpoints", "CheckpointTask"),
    "Checkpoints": ("dynacoord.checkpoints", "Checkpoints"),
    "CircuitBreaker": ("dynacoord.breaker", "CircuitBreaker"),
    "FailureRate": ("dynacoord.breaker", "FailureRate"),
    "FenceCondition": ("dynacoord.fencing", "FenceCondition"),
    "fence_condition": ("dynacoord.fencing", "fence_condition"),
    "Claim": ("dynacoord.idempotency", "Claim"),
    "ClaimResult": ("dynacoord.idempotency", "ClaimResult"),
    "ConsumeStats": ("dynacoord.jobs", "ConsumeStats"),
    "CounterItem": ("dynacoord.counters", "CounterItem"),
    "Counters": ("dynacoord.counters", "Counters"),
    "Event": ("dynacoord.outbox", "Event"),
    "EventBridgeRelay": ("dynacoord.relays", "EventBridgeRelay"),
    "EventRecord": ("dynacoord.outbox", "EventRecord"),
    "EventStatus": ("dynacoord.outbox", "EventStatus"),
    "Idempotency": ("dynacoord.idempotency", "Idempotency"),
    "IdempotencyOptions": ("dynacoord.idempotency", "IdempotencyOptions"),
    "IdempotencyRecord": ("dynacoord.idempotency", "IdempotencyRecord"),
    "IdempotencyStatus": ("dynacoord.idempotency", "IdempotencyStatus"),
    "JoinResult": ("dynacoord.counters", "JoinResult"),
    "Leader": ("dynacoord.leader", "Leader"),
    "LeaderInfo": ("dynacoord.leader", "LeaderInfo"),
    "Lease": ("dynacoord.locks", "Lease"),
    "LockInfo": ("dynacoord.locks", "LockInfo"),
    "Locks": ("dynacoord.locks", "Locks"),
    "Outbox": ("dynacoord.outbox", "Outbox"),
    "OutboxStats": ("dynacoord.outbox", "OutboxStats"),
    "OutboxWorker": ("dynacoord.outbox", "OutboxWorker"),
    "Permit": ("dynacoord.semaphore", "Permit"),
    "PermitInfo": ("dynacoord.semaphore", "PermitInfo"),
    "RateDecision": ("dynacoord.ratelimit", "RateDecision"),
    "RateLimiter": ("dynacoord.ratelimit", "RateLimiter"),
    "ReconcileStats": ("dynacoord.runs", "ReconcileStats"),
    "RetryReport": ("dynacoord.outbox", "RetryReport"),
    "Run": ("dynacoord.runs", "Run"),
    "RunStatus": ("dynacoord.runs", "RunStatus"),
    "Runs": ("dynacoord.runs", "Runs"),
    "SNSRelay": ("dynacoord.relays", "SNSRelay"),
    "SQSJobQueue": ("dynacoord.jobs", "SQSJobQueue"),
    "SQSRelay": ("dynacoord.relays", "SQSRelay"),
    "Semaphore": ("dynacoord.semaphore", "Semaphore"),
    "StoredSemaphore": ("dynacoord.semaphore", "StoredSemaphore"),
    "Transaction": ("dynacoord.backends.dynamodb.transaction", "Transaction"),
    "TableLayout": ("dynacoord._table_schema", "TableLayout"),
    "EMFMetrics": ("dynacoord.metrics", "EMFMetrics"),
    "LoggingMetrics": ("dynacoord.metrics", "LoggingMetrics"),
    "Metrics": ("dynacoord.metrics", "Metrics"),
    "process_sqs_batch": ("dynacoord.aws_lambda", "process_sqs_batch"),
    "process_stream_batch": ("dynacoord.aws_lambda", "process_stream_batch"),
    "register_lambda_context": ("dynacoord.idempotency", "register_lambda_context"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'dynacoord' has no attribute {name!r}")
    import importlib

    module_name, attribute = target
    value = getattr(importlib.import_module(module_name), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
