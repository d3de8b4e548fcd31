"""dynacoord: coordination primitives for services on AWS, on one DynamoDB table.

``import dynacoord`` is cheap (it does not import boto3): the backends are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._clock import Clock, ManualClock, SystemClock
from .breaker import BreakerStatus, CircuitBreaker
from .breaker import State as BreakerState
from .cache import Cache
from .checkpoints import Checkpoint, Checkpoints, CheckpointTask
from .counters import CounterItem, Counters, JoinResult
from .errors import (
    BackendError,
    CheckpointExistsError,
    CheckpointNotFoundError,
    CircuitOpenError,
    ConfigurationError,
    CounterTypeError,
    DuplicateEventError,
    DynacoordError,
    EventNotFoundError,
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
    LockNotOwnedError,
    NotSupportedError,
    OutboxError,
    RelayError,
    RunError,
    RunExistsError,
    RunNotFoundError,
    RunNotRunningError,
    StackDeploymentError,
    TableNotReadyError,
    TransactionCancelledError,
    TransactionTooLargeError,
    ValueTooLargeError,
)
from .idempotency import Claim, ClaimResult, Idempotency, IdempotencyRecord, IdempotencyStatus
from .jobs import ConsumeStats, SQSJobQueue
from .locks import Lease, LockInfo, Locks
from .outbox import Event, EventRecord, EventStatus, Outbox, OutboxStats, OutboxWorker, RetryReport
from .relays import EventBridgeRelay, SNSRelay, SQSRelay
from .runs import ReconcileStats, Run, Runs, RunStatus
from .transaction import Transaction

if TYPE_CHECKING:
    from .backends.dynamodb import DynamoDBBackend

__version__ = "0.1.0"

__all__ = [
    "BackendError",
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
    "DuplicateEventError",
    "DynacoordError",
    "DynamoDBBackend",
    "Event",
    "EventBridgeRelay",
    "EventNotFoundError",
    "EventRecord",
    "EventStatus",
    "Idempotency",
    "IdempotencyError",
    "IdempotencyInProgressError",
    "IdempotencyKeyMismatchError",
    "IdempotencyRecord",
    "IdempotencyStatus",
    "IdempotencyValueError",
    "InvalidKeyError",
    "InvalidValueError",
    "JobQueueError",
    "JobSendError",
    "JoinMismatchError",
    "JoinResult",
    "Lease",
    "LockError",
    "LockInfo",
    "LockLostError",
    "LockNotAcquiredError",
    "LockNotOwnedError",
    "Locks",
    "ManualClock",
    "NotSupportedError",
    "Outbox",
    "OutboxError",
    "OutboxStats",
    "OutboxWorker",
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
    "StackDeploymentError",
    "SystemClock",
    "TableNotReadyError",
    "Transaction",
    "TransactionCancelledError",
    "TransactionTooLargeError",
    "ValueTooLargeError",
    "__version__",
]

# Loaded on first attribute access so that `import dynacoord` does not pay for boto3.
_LAZY = {"DynamoDBBackend": "dynacoord.backends.dynamodb"}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'dynacoord' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value
