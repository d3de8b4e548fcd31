"""Task checkpoints: numbered snapshots of a long job's progress, so a restarted job resumes.

Policy lives here (sequence assignment, expiry, pagination, batched cleanup); a backend supplies a
:class:`CheckpointStore` whose methods are one round trip each, and may add :class:`CheckpointRows`
(the same requests, without a StoredCheckpoint per checkpoint written or read).

Every checkpoint of a task shares one partition (``CHECKPOINT#{ns}#{task_id}``) and has the sort
key ``SEQ#{sequence:020d}``, so string order is numeric order (9 < 10) and "the latest" is one
Query read newest first with ``Limit 1``. Nothing here ever scans the table.

How the next sequence is assigned (``save`` without ``sequence``)
--------------------------------------------------------------------
Optimistically: read the highest stored sequence of the task (one keys-only Query, expired
checkpoints included so a sequence is never reused while its item still exists), then insert
``highest + 1`` with a condition that refuses an existing live checkpoint. Two concurrent savers
that read the same highest sequence both try the same number; exactly one insert wins and the other
re-reads and retries (with jittered backoff). Uncontended that is two requests, the same as a
per-task counter item (atomic ``ADD`` and then the insert), and it was chosen over the counter
because it keeps the partition pure (only checkpoints, exactly the shared key schema that the Redis
and MongoDB backends follow), explicit ``sequence=`` saves need no second write to push a counter
past them, and ``delete_all`` leaves nothing behind. The cost is retries under contention, which is
rare for checkpoints: one task is normally written by one worker at a time.

Consequence worth knowing: once every checkpoint of a task is gone (``delete_all``, ``cleanup(keep=0)``
or swept after its TTL), numbering starts again at 1.
"""

from __future__ import annotations

import builtins
import logging
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Protocol, runtime_checkable

from . import codec, keys
from ._clock import Clock, SystemClock, now_ms
from ._items import optional_int, optional_str
from ._validate import check_bool, check_int, ttl_to_ms
from .errors import (
    CheckpointExistsError,
    CheckpointNotFoundError,
    DynacoordError,
    InvalidKeyError,
    InvalidValueError,
)

__all__ = [
    "Checkpoint",
    "CheckpointPage",
    "CheckpointStore",
    "CheckpointTask",
    "Checkpoints",
    "StoredCheckpoint",
    "format_checkpoint_id",
    "parse_checkpoint_id",
]

logger = logging.getLogger(__name__)

#: The largest page a store is asked for (DynamoDB returns at most 1 MB per page anyway).
MAX_PAGE_SIZE = 1000
#: Deletes per batch request (DynamoDB BatchWriteItem's limit).
DELETE_BATCH = 25


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as a store holds it: ``data`` is codec-encoded text (None in keys-only reads)."""

    task_id: str
    sequence: int
    data_text: str | None
    progress: float | None
    created_ms: int
    expires_at_ms: int | None

    def live(self, now_ms: int) -> bool:
        """False once expired (``now_ms >= expires_at_ms``), even if the item still exists."""
        return self.expires_at_ms is None or now_ms < self.expires_at_ms

    @classmethod
    def from_item(cls, task_id: str, item: Mapping[str, Any]) -> StoredCheckpoint:
        """The checkpoint a stored item holds (the same field names on every backend).

        ``data`` and ``progress`` may be missing (keys-only reads).
        """
        progress = item.get("progress")
        return cls(
            task_id=task_id,
            sequence=keys.parse_sk_sequence(str(item["sk"])),
            data_text=optional_str(item, "data"),
            progress=None if progress is None else float(progress),
            created_ms=optional_int(item, "created_ms") or 0,
            expires_at_ms=optional_int(item, "expires_at_ms"),
        )


@dataclass(frozen=True, slots=True)
class CheckpointPage:
    """One page of a task's checkpoints, expired ones included, and the cursor of the next page."""

    items: list[StoredCheckpoint]
    cursor: Any | None


class CheckpointStore(Protocol):
    """Storage for checkpoints. Every method is one request to the store."""

    def insert(self, checkpoint: StoredCheckpoint, now_ms: int) -> bool:
        """Write ``checkpoint`` unless a live one with the same (task, sequence) exists.

        Returns False (and writes nothing) when it exists; an expired one counts as absent.
        """
        ...

    def highest_sequence(self, task_id: str) -> int | None:
        """The highest sequence stored for the task (expired items included), or None."""
        ...

    def get(self, task_id: str, sequence: int) -> StoredCheckpoint | None:
        """One checkpoint, read consistently (expired ones too: the caller decides)."""
        ...

    def page(
        self,
        task_id: str,
        *,
        newest_first: bool,
        limit: int,
        cursor: Any | None,
        keys_only: bool = False,
    ) -> CheckpointPage:
        """Up to ``limit`` checkpoints of the task in sequence order, read consistently.

        ``keys_only`` may leave ``data_text`` and ``progress`` out (cleanup needs only keys).
        """
        ...

    def delete_batch(self, task_id: str, sequences: Sequence[int]) -> builtins.list[int]:
        """Delete up to :data:`DELETE_BATCH` checkpoints; return the sequences left unprocessed."""
        ...


#: A checkpoint's fields in :class:`StoredCheckpoint`'s order after the task id:
#: ``(sequence, data_text, progress, created_ms, expires_at_ms)``.
CheckpointFields = tuple[int, str | None, float | None, int, int | None]


@runtime_checkable
class CheckpointRows(Protocol):
    """Optional on a :class:`CheckpointStore`: the same requests without a StoredCheckpoint.

    ``insert_fields``, ``get_row`` and ``page_rows`` make the requests of ``insert``, ``get`` and
    ``page``; the rows read are the store's own, and ``live_checkpoint`` turns one into its
    :class:`Checkpoint` (None once expired). A store that has them (the DynamoDB store) spares
    each checkpoint written or read a StoredCheckpoint made only to be taken apart again; any
    other store is used through ``insert``, ``get`` and ``page``.
    """

    def insert_fields(self, task_id: str, fields: CheckpointFields, now_ms: int) -> bool:
        """:meth:`CheckpointStore.insert` of the checkpoint with these fields."""
        ...

    def get_row(self, task_id: str, sequence: int) -> Any | None:
        """The row of one checkpoint, read consistently, or None."""
        ...

    def page_rows(
        self, task_id: str, *, newest_first: bool, limit: int, cursor: Any | None
    ) -> tuple[Sequence[Any], Any | None]:
        """The rows of one page (each read as far as ``page`` would) and the next cursor."""
        ...

    def live_checkpoint(self, task_id: str, row: Any, now_ms: int) -> Checkpoint | None:
        """The checkpoint a row holds, or None if it has expired at ``now_ms``."""
        ...


class _StoredRows:
    """:class:`CheckpointRows` over a store that has only the CheckpointStore methods."""

    __slots__ = ("_store",)

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    def insert_fields(self, task_id: str, fields: CheckpointFields, now_ms: int) -> bool:
        return self._store.insert(StoredCheckpoint(task_id, *fields), now_ms)

    def get_row(self, task_id: str, sequence: int) -> StoredCheckpoint | None:
        return self._store.get(task_id, sequence)

    def page_rows(
        self, task_id: str, *, newest_first: bool, limit: int, cursor: Any | None
    ) -> tuple[Sequence[StoredCheckpoint], Any | None]:
        page = self._store.page(task_id, newest_first=newest_first, limit=limit, cursor=cursor)
        return page.items, page.cursor

    @staticmethod
    def live_checkpoint(task_id: str, row: StoredCheckpoint, now_ms: int) -> Checkpoint | None:
        if not row.live(now_ms):
            return None
        return _checkpoint(
            task_id, row.sequence, row.data_text, row.progress, row.created_ms, row.expires_at_ms
        )


def format_checkpoint_id(task_id: str, sequence: int) -> str:
    """The id of a checkpoint: ``"{task_id}@{sequence}"``."""
    return f"{task_id}@{sequence}"


def parse_checkpoint_id(checkpoint_id: str) -> tuple[str, int]:
    """Split ``"{task_id}@{sequence}"`` into its parts.

    Parsed from the right, so task ids may themselves contain ``@``. A malformed id, or one whose
    sequence is out of range, raises :class:`InvalidKeyError` (a ``ValueError``).
    """
    if not isinstance(checkpoint_id, str):
        raise TypeError(f"checkpoint id must be a str, got {type(checkpoint_id).__name__}")
    task_id, sep, number = checkpoint_id.rpartition("@")
    if not sep or not task_id or not number.isascii() or not number.isdigit():
        raise InvalidKeyError(
            f"not a checkpoint id: {checkpoint_id!r} (expected '<task_id>@<sequence>')",
            key=checkpoint_id,
        )
    digits = number.lstrip("0") or "0"
    if len(digits) > keys.SEQUENCE_WIDTH:  # above MAX_SEQUENCE (checked before int(): no huge ints)
        raise InvalidKeyError(
            f"not a checkpoint id: {checkpoint_id[:200]!r} (the sequence is above "
            f"{keys.MAX_SEQUENCE})",
            key=checkpoint_id,
        )
    return task_id, int(digits)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A saved checkpoint. ``id`` (``"{task_id}@{sequence}"``) is what :meth:`Checkpoints.load` takes."""

    task_id: str
    sequence: int
    data: Any
    progress: float | None
    #: epoch seconds (millisecond precision)
    created_at: float
    #: epoch seconds, or None for a checkpoint without TTL
    expires_at: float | None = None

    @property
    def id(self) -> str:
        return format_checkpoint_id(self.task_id, self.sequence)


def _check_progress(progress: Any) -> float | None:
    if progress is None:
        return None
    if isinstance(progress, bool) or not isinstance(progress, (int, float)):
        raise TypeError(f"progress must be a number 0..100 or None, got {type(progress).__name__}")
    value = float(progress)
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise InvalidValueError(f"progress must be between 0 and 100, got {progress!r}")
    if 0 < value < 1e-100:
        # A DynamoDB number cannot be below 1e-130 in magnitude (boto3 raises decimal.Underflow).
        raise InvalidValueError(
            f"progress {progress!r} is too small to store; use 0 for no progress"
        )
    return value


def _checkpoint(
    task_id: str,
    sequence: int,
    data_text: str | None,
    progress: float | None,
    created_ms: int,
    expires_ms: int | None,
) -> Checkpoint:
    """The Checkpoint of these stored fields: a save makes one, a listing one per checkpoint."""
    if data_text is None:  # pragma: no cover - keys-only reads never reach here
        raise DynacoordError("checkpoint was read without its data")
    return Checkpoint(
        task_id,
        sequence,
        codec.decode(data_text),
        progress,
        created_ms / 1000,
        None if expires_ms is None else expires_ms / 1000,
    )


def live_checkpoint(task_id: str, fields: CheckpointFields, now_ms: int) -> Checkpoint | None:
    """:meth:`CheckpointRows.live_checkpoint` of a store whose rows are :data:`CheckpointFields`:
    the checkpoint, or None once it has expired (as :meth:`StoredCheckpoint.live` decides)."""
    sequence, data_text, progress, created_ms, expires_ms = fields
    if expires_ms is not None and now_ms >= expires_ms:
        return None
    return _checkpoint(task_id, sequence, data_text, progress, created_ms, expires_ms)


def _new_fields(
    sequence: int, text: str, progress: float | None, ttl_ms: int | None, now: int
) -> CheckpointFields:
    """The fields of the checkpoint a save writes at ``now``."""
    return (sequence, text, progress, now, None if ttl_ms is None else now + ttl_ms)


def _size_item(task_id: str, text: str, progress: float | None) -> dict[str, Any]:
    """The item whose size a save checks: the key and bookkeeping attributes at their widest
    (namespace, sequence, times), so the check does not depend on which sequence is assigned."""
    return {
        "pk": f"CHECKPOINT#{'x' * keys.MAX_NAMESPACE_CHARS}#{task_id}",
        "sk": f"SEQ#{0:0{keys.SEQUENCE_WIDTH}d}",
        "data": text,
        "progress": progress,
        "created_ms": 10**15,
        "expires_at_ms": 10**15,
        "ttl": 10**12,
    }


#: A save whose task id and data have at most this many characters in all surely fits in an
#: item: a character is at most 4 bytes of UTF-8, and 24 bytes are left for a progress (the
#: longest repr of a float in 0..100 is 23 characters).
_FITS_CHARS = (
    codec.DYNAMODB_ITEM_LIMIT - codec.estimate_item_size(_size_item("", "", None)) - 24
) // 4


def _check_page_size(value: Any) -> int:
    return check_int(value, "page_size", minimum=1, maximum=MAX_PAGE_SIZE)


class Checkpoints:
    """Checkpoints over a :class:`CheckpointStore`. Reached as ``backend.checkpoints``."""

    #: first retry delay and cap of the backoff when concurrent savers race for a sequence
    backoff_initial = 0.005
    backoff_max = 0.25
    #: attempts to find a free sequence before giving up (only under heavy contention)
    max_attempts = 100

    def __init__(self, store: CheckpointStore, *, clock: Clock | None = None) -> None:
        self._store = store
        self._rows: CheckpointRows = (
            store if isinstance(store, CheckpointRows) else _StoredRows(store)
        )
        self.clock: Clock = clock or SystemClock()

    # -- writing ----------------------------------------------------------------------------------

    def save(
        self,
        task_id: str,
        data: Any,
        *,
        progress: float | None = None,
        sequence: int | None = None,
        ttl: float | None = None,
    ) -> Checkpoint:
        """Save a checkpoint of ``task_id`` and return it.

        Without ``sequence`` the next one (highest + 1, starting at 1) is assigned atomically: two
        concurrent savers never get the same one. With an explicit ``sequence`` that already exists
        (and has not expired), :class:`CheckpointExistsError` is raised; nothing is overwritten.
        ``data`` is any codec value (JSON-compatible, bytes, Decimal); ``progress`` is 0..100;
        ``ttl`` (seconds) makes the checkpoint expire. Oversize data raises
        :class:`~dynacoord.errors.ValueTooLargeError` before anything is written.

        Requests: two (read the highest sequence, conditional insert); one with ``sequence``.
        """
        keys.checkpoint_prefix("x", task_id)  # validates task_id (type, empty, length)
        text = codec.encode(data)
        pct = None if progress is None else _check_progress(progress)
        ttl_ms = None if ttl is None else ttl_to_ms(ttl)
        if sequence is not None:
            check_int(sequence, "sequence", minimum=0, maximum=keys.MAX_SEQUENCE)
        # Refuse oversize data before any request (the exact estimate only when the bound
        # does not already prove that the item fits).
        if len(task_id) + len(text) > _FITS_CHARS:
            codec.check_item_size(_size_item(task_id, text, pct), key=task_id)
        if sequence is not None:
            now = now_ms(self.clock)
            fields = _new_fields(sequence, text, pct, ttl_ms, now)
            if not self._rows.insert_fields(task_id, fields, now):
                raise CheckpointExistsError(
                    f"checkpoint {format_checkpoint_id(task_id, sequence)!r} already exists; "
                    "it was not overwritten",
                    task_id=task_id,
                    sequence=sequence,
                )
            return _checkpoint(task_id, *fields)
        delay = self.backoff_initial
        for attempt in range(1, self.max_attempts + 1):
            highest = self._store.highest_sequence(task_id)
            now = now_ms(self.clock)
            fields = _new_fields((highest or 0) + 1, text, pct, ttl_ms, now)
            if self._rows.insert_fields(task_id, fields, now):
                logger.debug("checkpoint %r saved (attempt %d)", task_id, attempt)
                return _checkpoint(task_id, *fields)
            # Another saver took that sequence between our read and our write: re-read, retry.
            self.clock.sleep(random.uniform(0, delay))
            delay = min(self.backoff_max, delay * 2)
        raise DynacoordError(
            f"could not assign a checkpoint sequence for task {task_id!r} after "
            f"{self.max_attempts} attempts (too many concurrent savers)"
        )

    # -- reading ----------------------------------------------------------------------------------

    def load(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint with this id (one consistent GetItem).

        Raises :class:`CheckpointNotFoundError` when it does not exist or has expired.
        """
        task_id, sequence = parse_checkpoint_id(checkpoint_id)
        keys.checkpoint_prefix("x", task_id)  # the parsed sequence is in range already
        rows = self._rows
        row = rows.get_row(task_id, sequence)
        checkpoint = None if row is None else rows.live_checkpoint(task_id, row, now_ms(self.clock))
        if checkpoint is None:
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id!r} not found", checkpoint_id=checkpoint_id
            )
        return checkpoint

    def load_latest(self, task_id: str) -> Checkpoint | None:
        """The newest live checkpoint of ``task_id``, or None.

        One Query (newest first, ``Limit 1``, consistent). If the newest has expired but was not
        swept yet, older pages are read until a live one is found (larger pages after the first).
        """
        keys.checkpoint_prefix("x", task_id)
        now = now_ms(self.clock)
        rows = self._rows
        live = rows.live_checkpoint
        cursor: Any | None = None
        limit = 1
        while True:
            page, cursor = rows.page_rows(task_id, newest_first=True, limit=limit, cursor=cursor)
            for row in page:
                checkpoint = live(task_id, row, now)
                if checkpoint is not None:
                    return checkpoint
            if cursor is None:
                return None
            limit = 100

    def iter(self, task_id: str, *, page_size: int = 100) -> Iterator[Checkpoint]:
        """Every live checkpoint of ``task_id`` in ascending sequence order, page by page."""
        keys.checkpoint_prefix("x", task_id)
        size = _check_page_size(page_size)
        return self._iter(task_id, size)

    def _iter(self, task_id: str, page_size: int) -> Iterator[Checkpoint]:
        rows = self._rows
        live = rows.live_checkpoint
        cursor: Any | None = None
        while True:
            page, cursor = rows.page_rows(
                task_id, newest_first=False, limit=page_size, cursor=cursor
            )
            now = now_ms(self.clock)
            for row in page:
                checkpoint = live(task_id, row, now)
                if checkpoint is not None:
                    yield checkpoint
            if cursor is None:
                return

    def list(
        self, task_id: str, *, page_size: int = 100, limit: int | None = None
    ) -> builtins.list[Checkpoint]:
        """The live checkpoints of ``task_id``, ascending; every page is followed.

        ``page_size`` is the number of items asked per request; ``limit`` caps the result (the
        oldest ``limit`` checkpoints).
        """
        keys.checkpoint_prefix("x", task_id)
        size = _check_page_size(page_size)
        cap = None if limit is None else check_int(limit, "limit", minimum=0)
        if cap == 0:
            return []
        checkpoints = self._iter(task_id, size if cap is None else min(size, cap))
        # taken whole (islice stops at the cap without asking for one more): no Python-level
        # step per checkpoint
        return builtins.list(checkpoints if cap is None else islice(checkpoints, cap))

    # -- deleting ---------------------------------------------------------------------------------

    def cleanup(self, task_id: str, keep: int) -> int:
        """Delete all but the newest ``keep`` live checkpoints (``keep=0`` deletes all).

        Expired checkpoints that were not swept yet are removed too, but only live ones are
        counted. Deletes go in batches of 25; unprocessed items are retried. Returns the number
        of live checkpoints deleted.
        """
        keys.checkpoint_prefix("x", task_id)
        kept_target = check_int(keep, "keep", minimum=0)
        now = now_ms(self.clock)
        kept = 0
        deleted = 0
        doomed: builtins.list[int] = []
        cursor: Any | None = None
        while True:
            page = self._store.page(
                task_id, newest_first=True, limit=MAX_PAGE_SIZE, cursor=cursor, keys_only=True
            )
            for stored in page.items:
                live = stored.live(now)
                if live and kept < kept_target:
                    kept += 1
                    continue
                doomed.append(stored.sequence)
                deleted += int(live)
                if len(doomed) >= DELETE_BATCH:
                    self._delete(task_id, doomed)
                    doomed = []
            if page.cursor is None:
                break
            cursor = page.cursor
        if doomed:
            self._delete(task_id, doomed)
        if deleted:
            logger.info("deleted %d checkpoints of task %r (kept %d)", deleted, task_id, kept)
        return deleted

    def delete_all(self, task_id: str) -> int:
        """Delete every checkpoint of ``task_id``; returns how many live ones were deleted."""
        return self.cleanup(task_id, 0)

    def _delete(self, task_id: str, sequences: Sequence[int]) -> None:
        pending = builtins.list(sequences)
        delay = self.backoff_initial
        for _ in range(self.max_attempts):
            pending = self._store.delete_batch(task_id, pending)
            if not pending:
                return
            # Unprocessed items mean the table is throttled: back off before the retry.
            self.clock.sleep(random.uniform(0, delay))
            delay = min(1.0, delay * 2)
        raise DynacoordError(
            f"could not delete {len(pending)} checkpoints of task {task_id!r}: the store kept "
            "returning them unprocessed (throttled?)"
        )

    # -- resume helper ----------------------------------------------------------------------------

    def task(
        self, task_id: str, *, ttl: float | None = None, cleanup_on_success: bool = False
    ) -> CheckpointTask:
        """A context manager for one run of a long job: see :class:`CheckpointTask`."""
        keys.checkpoint_prefix("x", task_id)
        if ttl is not None:
            ttl_to_ms(ttl)
        return CheckpointTask(self, task_id, ttl=ttl, cleanup_on_success=cleanup_on_success)


class CheckpointTask:
    """One run of a resumable job::

        with backend.checkpoints.task("import-2024-06") as task:
            start = task.latest.data["offset"] if task.latest else 0
            for offset in range(start, total, 1000):
                process(offset)
                task.save({"offset": offset + 1000}, progress=100 * (offset + 1000) / total)

    Entering loads the newest checkpoint into ``latest`` (None on a first run). ``save`` saves a
    new checkpoint (sequence assigned, the task's ``ttl`` applied) and makes it ``latest``.
    Exiting never deletes anything by default, whatever happened, so a failed run resumes from its
    last checkpoint; with ``cleanup_on_success=True`` the task's checkpoints are deleted when the
    block exits without an exception (the job is done, nothing is left to resume).
    """

    def __init__(
        self,
        checkpoints: Checkpoints,
        task_id: str,
        *,
        ttl: float | None = None,
        cleanup_on_success: bool = False,
    ) -> None:
        self.checkpoints = checkpoints
        self.task_id = task_id
        self.ttl = ttl
        self.cleanup_on_success = check_bool(cleanup_on_success, "cleanup_on_success")
        self.latest: Checkpoint | None = None

    @property
    def resumed(self) -> bool:
        """True when a previous run left a checkpoint."""
        return self.latest is not None

    def save(self, data: Any, *, progress: float | None = None) -> Checkpoint:
        checkpoint = self.checkpoints.save(self.task_id, data, progress=progress, ttl=self.ttl)
        self.latest = checkpoint
        return checkpoint

    def __enter__(self) -> CheckpointTask:
        self.latest = self.checkpoints.load_latest(self.task_id)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None and self.cleanup_on_success:
            self.checkpoints.delete_all(self.task_id)

    def __repr__(self) -> str:
        latest = self.latest.id if self.latest else None
        return f"CheckpointTask(task_id={self.task_id!r}, latest={latest!r})"
