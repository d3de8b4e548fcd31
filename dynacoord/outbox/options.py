"""A worker's options as small objects: :class:`WorkerOptions` (how it polls, holds and retries)
and :class:`DeliveryHooks` (what it calls after an outcome). Each option's name, default and
check live here once; the worker, :meth:`Outbox.worker`, the stream relay's environment variable
and the bundled stack read them from here."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from typing_extensions import Unpack

from .._validate import (
    check_bool,
    check_int,
    non_negative_seconds,
    option_names,
    options_with,
    ttl_to_ms,
)
from ..errors import ConfigurationError
from .event import Event

__all__ = [
    "DEFAULT_RETENTION_SECONDS",
    "STACK_OPTIONS",
    "DeliveryHooks",
    "MissingHandlerPolicy",
    "WorkerOptions",
]

MissingHandlerPolicy = Literal["leave", "fail", "retry", "skip"]
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600

# Options the bundled stack's functions take from JSON (``OutboxOptions``): the rest shape a
# long-running poller (its poll interval, claim design, the relay's share), which the stack sets.
_STACK = {"stack": True}


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerOptions:
    """How a worker delivers (see :class:`~dynacoord.outbox.worker.OutboxWorker` for what each
    does). Checked when made: a wrong value raises at once, naming the option.

    ``Outbox.worker(handlers, batch_size=10)`` and
    ``Outbox.worker(handlers, WorkerOptions(batch_size=10))`` are the same worker."""

    #: events claimed by one poll (1-1000)
    batch_size: int = field(default=25, metadata=_STACK)
    #: seconds a claim holds an event before anyone else may claim it
    lease: float = field(default=30.0, metadata=_STACK)
    #: attempts before an event is ``failed``
    max_attempts: int = field(default=5, metadata=_STACK)
    #: first retry's wait (seconds), doubled per attempt, equal jitter
    backoff: float = field(default=1.0, metadata=_STACK)
    #: the longest wait between attempts (seconds)
    max_backoff: float = field(default=300.0, metadata=_STACK)
    #: seconds :meth:`OutboxWorker.run` sleeps after a poll that found nothing
    poll_interval: float = 1.0
    #: an event whose type has no handler: ``"leave"`` (for a worker that has it), ``"fail"``,
    #: ``"retry"`` or ``"skip"``
    on_missing_handler: MissingHandlerPolicy = field(default="leave", metadata=_STACK)
    #: seconds a completed event is kept (None: deleted at once)
    retention: float | None = field(default=DEFAULT_RETENTION_SECONDS, metadata=_STACK)
    #: extend the leases of held events while their handlers run
    heartbeat: bool = field(default=True, metadata=_STACK)
    #: claim and complete a batch per request (False: one event per request)
    batch_claim: bool = True
    #: seconds a new unordered event is left to the stream relay after it became due
    leave_new_for: float = 0.0

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", minimum=1, maximum=1000)
        ttl_to_ms(self.lease, "lease")
        check_int(self.max_attempts, "max_attempts", minimum=1)
        non_negative_seconds(self.backoff, "backoff")
        non_negative_seconds(self.max_backoff, "max_backoff")
        non_negative_seconds(self.poll_interval, "poll_interval")
        if self.on_missing_handler not in ("leave", "fail", "retry", "skip"):
            raise ConfigurationError(
                "on_missing_handler must be 'leave', 'fail', 'retry' or 'skip', got "
                f"{self.on_missing_handler!r}"
            )
        if self.retention is not None:
            ttl_to_ms(self.retention, "retention")
        check_bool(self.heartbeat, "heartbeat")
        check_bool(self.batch_claim, "batch_claim")
        non_negative_seconds(self.leave_new_for, "leave_new_for")

    @classmethod
    def of(
        cls, base: WorkerOptions | None = None, /, **values: Unpack[WorkerOptionValues]
    ) -> WorkerOptions:
        """``base`` (or the defaults) with ``values`` in place of its own; an unknown name is
        refused with the list of known ones."""
        return options_with(cls, base, values, what="worker")

    @property
    def lease_ms(self) -> int:
        return ttl_to_ms(self.lease, "lease")

    @property
    def retention_ms(self) -> int | None:
        return None if self.retention is None else ttl_to_ms(self.retention, "retention")

    @property
    def leave_new_ms(self) -> int:
        return int(non_negative_seconds(self.leave_new_for, "leave_new_for") * 1000)


#: every option's name, in declaration order
OPTION_NAMES = option_names(WorkerOptions)


class WorkerOptionValues(TypedDict, total=False):
    """:class:`WorkerOptions` by name, for the keyword shorthand
    (``outbox.worker(handlers, batch_size=10)``); mypy checks each name and type."""

    batch_size: int
    lease: float
    max_attempts: int
    backoff: float
    max_backoff: float
    poll_interval: float
    on_missing_handler: MissingHandlerPolicy
    retention: float | None
    heartbeat: bool
    batch_claim: bool
    leave_new_for: float


#: the options the bundled stack's functions take (``OutboxOptions`` / ``DYNACOORD_OUTBOX_OPTIONS``)
STACK_OPTIONS = tuple(f.name for f in dataclasses.fields(WorkerOptions) if f.metadata.get("stack"))


@dataclass(frozen=True, slots=True)
class DeliveryHooks:
    """Called with the event after its outcome; a hook's exception is logged, never raised.

    ``on_delivered(event)`` after a completion is stored, ``on_error(event, exc)`` when a
    handler raises (every attempt), ``on_failed(event)`` after the event is stored as failed."""

    on_delivered: Callable[[Event], Any] | None = None
    on_error: Callable[[Event, Exception], Any] | None = None
    on_failed: Callable[[Event], Any] | None = None

    def __post_init__(self) -> None:
        for name in ("on_delivered", "on_error", "on_failed"):
            hook = getattr(self, name)
            if hook is not None and not callable(hook):
                raise ConfigurationError(f"{name} must be callable, got {type(hook).__name__}")


def stack_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (a JSON object's) checked as the stack's worker options: known names only,
    and each value valid. Returned as given, for ``Outbox.worker(**values)``."""
    unknown = sorted(set(values) - set(STACK_OPTIONS))
    if unknown:
        raise ConfigurationError(
            f"unknown outbox option(s) {unknown}; the options are {', '.join(STACK_OPTIONS)}"
        )
    WorkerOptions(**values)
    return dict(values)


class WorkerKeywords(WorkerOptionValues, total=False):
    """What :meth:`Outbox.worker <dynacoord.outbox.Outbox.worker>` takes by name, for the
    handlers that make their worker with it (``stream_handler``, ``sweep_handler``)."""

    options: WorkerOptions | None
    name: str | None
    hooks: DeliveryHooks | None
