"""Workflow-run state and the stalled-run reconciler.

A run is one item holding its status (running, completed, failed), a context map that steps read
and update, the result or error once it ended, and its last update time. Every write moves the
run's gsi1 sort key to the new update time, so the index partition ``RUN#{ns}#running`` is ordered
by "last sign of life": the runs that stalled (a worker crashed, a message was lost) are the oldest
entries there and :meth:`Runs.stalled` finds them with one paginated Query, never a Scan.

:meth:`Runs.reconcile` hands each stalled run to a callback (re-enqueue it, fail it, page someone)
while holding a short per-run lock, after re-reading the run, so two reconcilers running at once
never handle the same run twice::

    R1: query -> [r]    lock r: ok   re-read: stalled   handler(r)   touch r   unlock
    R2: query -> [r]    lock r: held by R1 -> skip
    R3: query -> [r] (the index lags)            lock r: ok   re-read: not stalled -> skip

After a successful handler the run's update time is touched (and ``reconciles`` counted), so the
run is not stalled again until ``older_than`` passes once more without a sign of life.

Finished runs get a TTL (``ttl_after_end``, default 7 days) and then count as absent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import codec, keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import StrEnum
from ._items import is_live, member_reader, optional_int, optional_str
from ._validate import (
    check_int,
    check_iterable,
    check_str,
    check_utf8,
    non_negative_seconds,
    ttl_to_ms,
)
from .errors import InvalidValueError, RunError, RunNotFoundError, RunNotRunningError
from .metrics import NO_SCOPE, MetricsScope

if TYPE_CHECKING:
    from .locks import Locks

__all__ = [
    "DEFAULT_TTL_AFTER_END",
    "MAX_CONTEXT_FIELD_BYTES",
    "MAX_PATCH_FIELDS",
    "ReconcileStats",
    "Run",
    "RunPage",
    "RunStatus",
    "RunStore",
    "Runs",
]

logger = logging.getLogger(__name__)

#: How long a finished run stays readable (seconds): 7 days.
DEFAULT_TTL_AFTER_END = 7 * 24 * 3600
#: Context field names are map keys of the stored item.
MAX_CONTEXT_FIELD_BYTES = 255
#: Fields one patch may set or remove (each is a clause of one update expression, which DynamoDB
#: limits to 4 KB).
MAX_PATCH_FIELDS = 100
#: Default number of runs one index Query page returns.
DEFAULT_PAGE_SIZE = 100


class RunStatus(StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


_status = member_reader(RunStatus)


@dataclass(frozen=True, slots=True)
class Run:
    """A snapshot of one workflow run."""

    run_id: str
    status: RunStatus
    context: dict[str, Any]
    created_at_ms: int
    updated_at_ms: int
    result: Any = None
    error: str | None = None
    ended_at_ms: int | None = None
    expires_at_ms: int | None = None
    #: how often the reconciler handed this run to a handler successfully
    reconciles: int = 0

    @property
    def created_at(self) -> float:
        return self.created_at_ms / 1000

    @property
    def updated_at(self) -> float:
        """Epoch seconds of the last write (start, context update, heartbeat, end)."""
        return self.updated_at_ms / 1000

    @property
    def ended_at(self) -> float | None:
        return None if self.ended_at_ms is None else self.ended_at_ms / 1000

    @property
    def running(self) -> bool:
        return self.status is RunStatus.RUNNING

    @classmethod
    def from_item(cls, item: Mapping[str, Any], context: Mapping[str, Any]) -> Run:
        """The run a stored item holds (the same field names on every backend).

        ``context`` maps each context field name to its codec text; backends store it
        differently (a map, escaped names, prefixed hash fields), so they pass it unpacked.
        """
        get = item.get
        result = get("result")
        return cls(
            str(item["run_id"]),
            _status(item["status"]),
            {str(name): codec.decode(str(text)) for name, text in context.items()}
            if context
            else {},
            int(item["created_ms"]),
            int(item["updated_ms"]),
            None if result is None else codec.decode(str(result)),
            optional_str(item, "error"),
            optional_int(item, "ended_ms"),
            optional_int(item, "expires_at_ms"),
            int(get("reconciles", 0)),
        )


def _new_run(
    run_id: str,
    status: RunStatus,
    context: dict[str, Any],
    created_at_ms: int,
    updated_at_ms: int,
    result: Any,
    error: str | None,
    ended_at_ms: int | None,
    expires_at_ms: int | None,
    reconciles: int,
) -> Run:
    """``Run(...)`` of every field, given by position (the DynamoDB store's readers call it)."""
    return Run(
        run_id,
        status,
        context,
        created_at_ms,
        updated_at_ms,
        result,
        error,
        ended_at_ms,
        expires_at_ms,
        reconciles,
    )


@dataclass(frozen=True, slots=True)
class RunPage:
    """One page of an index query: the runs and an opaque cursor for the next page (or None)."""

    runs: list[Run]
    cursor: Any = None


@dataclass(slots=True)
class ReconcileStats:
    """What one :meth:`Runs.reconcile` pass did.

    ``scanned``: runs the index listed as stalled; ``stalled``: those still stalled on a
    consistent re-read while this reconciler held their lock (the handler was called);
    ``reconciled``: handlers that returned; ``failed``: handlers that raised.
    """

    scanned: int = 0
    stalled: int = 0
    reconciled: int = 0
    failed: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)


class RunStore(Protocol):
    """Storage for runs. Every method is one request to the store.

    Writes raise :class:`~dynacoord.errors.RunNotFoundError` for a missing (or expired) run and
    :class:`~dynacoord.errors.RunNotRunningError` for a run that already ended.
    """

    def create(
        self, run_id: str, context: Mapping[str, Any], ttl_after_end_ms: int, now_ms: int
    ) -> Run:
        """Create a running run; raise RunExistsError if a live one exists."""
        ...

    def get(self, run_id: str, now_ms: int) -> Run | None:
        """The run, read consistently; None if missing or expired."""
        ...

    def update(
        self,
        run_id: str,
        now_ms: int,
        *,
        set_fields: Mapping[str, Any] | None = None,
        remove_fields: Sequence[str] = (),
        reconciled: bool = False,
    ) -> Run:
        """Update the context of a running run and touch its update time."""
        ...

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> Run:
        """End a running run with ``status``; it expires ``ttl_after_end`` later."""
        ...

    def query(
        self, status: RunStatus, before_ms: int | None, page_size: int, cursor: Any, now_ms: int
    ) -> RunPage:
        """One index page of runs in ``status`` last updated before ``before_ms`` (oldest first)."""
        ...


def new_run_fields(run_id: str, ttl_after_end_ms: int, now_ms: int) -> dict[str, Any]:
    """The stored fields (keys and context aside) of a run that starts now: the same field names
    on every backend, read back by :meth:`Run.from_item`."""
    return {
        "run_id": run_id,
        "status": RunStatus.RUNNING.value,
        "created_ms": now_ms,
        "updated_ms": now_ms,
        "end_ttl_ms": ttl_after_end_ms,
        "reconciles": 0,
    }


def write_refused(run_id: str, item: Mapping[str, Any] | None, now_ms: int) -> RunError:
    """The error of a store write refused because the run is not running, from the stored item
    (as the refusal returned it or as read right after): not found when it is missing or expired,
    else not running."""
    if not is_live(item, now_ms):
        return RunNotFoundError(f"run {run_id!r} not found", run_id=run_id)
    assert item is not None
    status = str(item.get("status", ""))
    return RunNotRunningError(
        f"run {run_id!r} is {status}, not running", run_id=run_id, status=status
    )


def _check_field(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidValueError(f"context field names must be non-empty str, got {name!r}")
    size = len(check_utf8(name, "context field name").encode("utf-8"))
    if size > MAX_CONTEXT_FIELD_BYTES:
        raise InvalidValueError(
            f"context field name is {size} bytes, the limit is {MAX_CONTEXT_FIELD_BYTES}"
        )
    return name


class CheckedFields(dict[str, Any]):
    """Context fields :class:`Runs` checked before a write: the values as given, and ``texts``,
    the codec text of each. Checking a value is encoding it, so a store that stores the text
    takes it from ``texts`` rather than encoding every value a second time."""

    __slots__ = ("texts",)
    texts: dict[str, str]


def _check_context(context: Any, what: str) -> CheckedFields:
    checked = CheckedFields()
    checked.texts = texts = {}
    if context is None:
        return checked
    if not isinstance(context, Mapping):
        raise TypeError(f"{what} must be a mapping of field names to values")
    for name, value in context.items():
        text = codec.encode(value)  # refuses unsupported values before anything is written
        _check_field(name)
        checked[name] = value
        texts[name] = text
    return checked


class Runs:
    """Workflow runs over a :class:`RunStore`. Reached as ``backend.runs``.

    ``locks`` (the backend's :class:`~dynacoord.locks.Locks`) is needed by :meth:`reconcile`.
    """

    def __init__(
        self,
        store: RunStore,
        *,
        locks: Locks | None = None,
        clock: Clock | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        metrics: MetricsScope | None = None,
    ) -> None:
        self._store = store
        self._locks = locks
        self._metrics = metrics if metrics is not None else NO_SCOPE
        self.clock: Clock = clock or SystemClock()
        self.page_size = check_int(page_size, "page_size", minimum=1, maximum=1000)

    def start(
        self,
        run_id: str,
        *,
        context: Mapping[str, Any] | None = None,
        ttl_after_end: float = DEFAULT_TTL_AFTER_END,
    ) -> Run:
        """Create a running run. Raises RunExistsError if one with this id exists (a finished run
        whose TTL ran out counts as absent and is replaced)."""
        keys.validate_key(run_id, "run id")
        ctx = _check_context(context, "context")
        ttl_ms = ttl_to_ms(ttl_after_end, "ttl_after_end")
        return self._store.create(run_id, ctx, ttl_ms, now_ms(self.clock))

    def get(self, run_id: str) -> Run | None:
        """The run, or None if it does not exist or expired after its end."""
        keys.validate_key(run_id, "run id")
        return self._store.get(run_id, now_ms(self.clock))

    def set(self, run_id: str, key: str, value: Any) -> Run:
        """Set one context field of a running run (one request): ``patch(run_id, set={key:
        value})``, without the checks of a removal list it does not have."""
        keys.validate_key(run_id, "run id")
        checked = _check_context({key: value}, "set")
        return self._store.update(run_id, now_ms(self.clock), set_fields=checked)

    def patch(
        self,
        run_id: str,
        *,
        set: Mapping[str, Any] | None = None,
        remove: Sequence[str] = (),
    ) -> Run:
        """Set and remove context fields of a running run in one request; touches the run."""
        keys.validate_key(run_id, "run id")
        fields = _check_context(set, "set")
        removed = [_check_field(name) for name in check_iterable(remove, "remove", "field names")]
        both = sorted(fields.keys() & removed)
        if both:
            raise InvalidValueError(f"fields both set and removed: {both}")
        if len(fields) + len(removed) > MAX_PATCH_FIELDS:
            raise InvalidValueError(f"a patch may change at most {MAX_PATCH_FIELDS} fields")
        return self._store.update(
            run_id, now_ms(self.clock), set_fields=fields, remove_fields=removed
        )

    def heartbeat(self, run_id: str) -> Run:
        """Record a sign of life: the run is not stalled for another ``older_than``."""
        keys.validate_key(run_id, "run id")
        return self._store.update(run_id, now_ms(self.clock))

    def complete(self, run_id: str, result: Any = None) -> Run:
        """End a running run successfully (RunNotRunningError if it already ended)."""
        keys.validate_key(run_id, "run id")
        # every store encodes the result before it writes: an unstorable one raises there
        return self._store.finish(run_id, RunStatus.COMPLETED, now_ms(self.clock), result=result)

    def fail(self, run_id: str, reason: str) -> Run:
        """End a running run as failed with ``reason`` (RunNotRunningError if it already ended)."""
        keys.validate_key(run_id, "run id")
        check_str(reason, "reason")
        return self._store.finish(run_id, RunStatus.FAILED, now_ms(self.clock), error=reason)

    def list(self, status: RunStatus | str, *, limit: int | None = None) -> Iterator[Run]:
        """Runs in ``status``, least recently updated first (paginated index Query)."""
        return self._iterate(RunStatus(status), None, limit)

    def stalled(self, older_than: float, *, limit: int | None = None) -> Iterator[Run]:
        """Running runs with no update for ``older_than`` seconds, oldest first.

        Reads the index (eventually consistent on DynamoDB): a run that just got a heartbeat may
        still be listed; :meth:`reconcile` re-reads each one before acting.
        """
        cutoff = now_ms(self.clock) - round(non_negative_seconds(older_than, "older_than") * 1000)
        return self._iterate(RunStatus.RUNNING, cutoff, limit)

    def _iterate(
        self, status: RunStatus, before_ms: int | None, limit: int | None
    ) -> Iterator[Run]:
        if limit is not None:
            check_int(limit, "limit", minimum=1)

        def generate() -> Iterator[Run]:
            left = limit  # runs still wanted, None for all
            cursor: Any = None
            while True:
                size = self.page_size if left is None else min(self.page_size, left)
                page = self._store.query(status, before_ms, size, cursor, now_ms(self.clock))
                runs = page.runs
                # a page at a time (yield from), not a run at a time: a page holds up to 1000
                if left is not None:
                    if len(runs) >= left:
                        yield from runs[:left]
                        return
                    left -= len(runs)
                yield from runs
                if page.cursor is None:
                    return
                cursor = page.cursor

        return generate()

    def reconcile(
        self,
        older_than: float,
        handler: Callable[[Run], Any],
        *,
        limit: int | None = None,
        lock_ttl: float = 60.0,
    ) -> ReconcileStats:
        """Call ``handler(run)`` once for each run stalled for ``older_than`` seconds.

        Each run is handled under the lock ``reconcile:{run_id}`` (``lock_ttl`` seconds, renewed
        every ``lock_ttl/3`` while the handler runs, so a slow handler keeps it) after a
        consistent re-read confirms it is still running and stalled; a run locked by another
        reconciler is skipped. After the handler
        returns, the run is touched (its ``reconciles`` count grows), so it is reported again only
        if it stays silent for another ``older_than``. A handler that raises is logged and counted
        in ``failed``; the pass continues and the run stays stalled for the next pass.
        """
        if self._locks is None:
            raise TypeError("reconcile needs the backend's locks: use backend.runs")
        older_ms = round(non_negative_seconds(older_than, "older_than") * 1000)
        if not callable(handler):
            raise TypeError("handler must be callable")
        ttl_to_ms(lock_ttl, "lock_ttl")
        stats = ReconcileStats()
        for candidate in self.stalled(older_than, limit=limit):
            stats.scanned += 1
            lease = self._locks.acquire(f"reconcile:{candidate.run_id}", lock_ttl, timeout=0)
            if lease is None:
                logger.debug("run %r is being reconciled elsewhere", candidate.run_id)
                continue
            # The heartbeat keeps the lock while a handler overruns lock_ttl: without it a second
            # reconciler would take the lock, re-read the still-stalled run and handle it too.
            try:
                with self._locks.keep_alive(lease):
                    self._reconcile_one(candidate.run_id, older_ms, handler, stats)
            finally:
                lease.release()
        logger.info(
            "reconcile: scanned=%r stalled=%r reconciled=%r failed=%r",
            stats.scanned,
            stats.stalled,
            stats.reconciled,
            stats.failed,
        )
        return stats

    def _reconcile_one(
        self,
        run_id: str,
        older_ms: int,
        handler: Callable[[Run], Any],
        stats: ReconcileStats,
    ) -> None:
        run = self._store.get(run_id, now_ms(self.clock))
        if run is None or not run.running or run.updated_at_ms >= now_ms(self.clock) - older_ms:
            return  # finished, or showed a sign of life since the index was read
        stats.stalled += 1
        self._metrics.count("RunStalled")
        try:
            handler(run)
        except Exception as exc:
            stats.failed += 1
            self._metrics.count("RunReconcileFailed")
            stats.failures.append((run.run_id, f"{type(exc).__name__}: {exc}"))
            logger.exception("reconcile handler failed for run %r", run.run_id)
            return
        stats.reconciled += 1
        self._metrics.count("RunReconciled")
        self._touch_reconciled(run.run_id)

    def _touch_reconciled(self, run_id: str) -> None:
        # The handler may have ended the run (or it was deleted): then there is nothing to touch.
        # A store error here must not end the pass: the handler already ran, and the worst case
        # is that the run is reported once more on a later pass.
        try:
            self._store.update(run_id, now_ms(self.clock), reconciled=True)
        except RunError:
            pass
        except Exception:
            logger.exception("could not record the reconcile of run %r", run_id)
