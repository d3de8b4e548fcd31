"""A shared TTL cache with stampede protection.

Policy lives here (TTLs, value encoding, batching and retries of unprocessed batch entries, the
fill lock of :meth:`Cache.get_or_set`, the ``@cached`` decorator); a backend supplies a
:class:`CacheStore` whose methods are one request each.

Expiry is decided by the injected clock: an entry whose ``expires_at_ms`` has passed is never
returned, listed or counted, whatever the store's own expiry sweeper (DynamoDB TTL, which can lag
by days) has or has not removed yet. Every conditional write treats an expired entry as absent.

Values are encoded with :mod:`dynacoord.codec` (JSON-compatible values, bytes, Decimal; no
pickle), so they round-trip exactly and are readable from every backend.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import logging
import random
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from . import codec, keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import Record
from ._items import is_live, optional_int
from ._validate import check_bool, check_int, check_iterable, ttl_to_ms
from .errors import BackendError, InvalidValueError
from .metrics import NO_SCOPE, MetricsScope

if TYPE_CHECKING:
    from .locks import Locks

__all__ = ["Cache", "CacheEntry", "CacheStore", "KeyPage"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Characters that make a glob pattern more than a literal prefix.
_GLOB_CHARS = "*?["

#: Attempts at resending the unprocessed part of one batch before giving up.
_BATCH_ATTEMPTS = 10

#: The range of an ``incr`` amount: 38 digits, DynamoDB's number precision.
_BY_MIN, _BY_MAX = -(10**38) + 1, 10**38 - 1


_INT64_TEXT = re.compile(r"-?(?:0|[1-9][0-9]{0,18})")


def is_int64_text(encoded: str) -> bool:
    """True if the codec text ``encoded`` is a plain integer in the signed 64-bit range: what
    MongoDB and Redis store as a number (field ``n``) so that ``incr`` is one atomic increment."""
    return bool(_INT64_TEXT.fullmatch(encoded)) and (
        codec.INT64_MIN <= int(encoded) <= codec.INT64_MAX
    )


class CacheEntry(Record):
    """A live entry as a store returns it: the codec text and the expiry (None: never). A named
    tuple: a batch read makes one per entry, and a tuple is the cheapest immutable record."""

    encoded: str
    expires_at_ms: int | None = None

    @classmethod
    def from_item(cls, item: Mapping[str, Any] | None, now_ms: int) -> CacheEntry | None:
        """The live entry a stored item holds (the same field names on every backend: an int
        value as ``n``, any other as codec text ``v``), or None if missing or expired."""
        if not is_live(item, now_ms):
            return None
        assert item is not None
        encoded = str(int(item["n"])) if "n" in item else str(item.get("v", "null"))
        return cls(encoded, optional_int(item, "expires_at_ms"))


@dataclass(frozen=True, slots=True)
class KeyPage:
    """One page of listed keys: ``live`` ones, ``expired`` ones, and where to continue."""

    live: list[str]
    expired: list[str]
    cursor: Any = None


class CacheStore(Protocol):
    """Storage for cache entries. Every method is one request to the store (``check_entry`` none).

    ``now_ms`` is passed in so that expiry is decided by the caller's clock on every backend.
    Values arrive and leave as :func:`dynacoord.codec.encode` text; how they are laid out (for
    example integers in a numeric attribute so that ``incr`` can be atomic) is the store's choice.
    """

    #: number of listing partitions :meth:`keys_page` walks (DynamoDB: the gsi1 shards)
    partitions: int
    #: most keys one :meth:`get_batch` / one :meth:`set_batch` or :meth:`delete_batch` may carry
    max_batch_get: int
    max_batch_write: int

    def check_entry(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        """No request: raise ValueTooLargeError / InvalidKeyError if the entry cannot be stored."""
        ...

    def get(self, key: str, now_ms: int, *, consistent: bool = True) -> CacheEntry | None:
        """The live entry; None if absent or expired. Read consistently unless ``consistent``
        is False (DynamoDB: an eventually consistent read; stores whose reads are always
        consistent ignore it)."""
        ...

    def set(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        """Write the entry unconditionally (replacing any old one)."""
        ...

    def add(self, key: str, encoded: str, expires_at_ms: int | None, now_ms: int) -> bool:
        """Write the entry only if the key is absent or expired; False if a live entry exists."""
        ...

    def delete(self, key: str, now_ms: int) -> bool:
        """Remove the entry; True if a live entry was removed."""
        ...

    def touch(self, key: str, expires_at_ms: int | None, now_ms: int) -> bool:
        """Set a live entry's expiry (None: never expires); False if absent or expired."""
        ...

    def incr(self, key: str, by: int, now_ms: int, expires_if_new: int | None) -> int | None:
        """Atomically add ``by`` to a live integer entry and return the new value.

        The entry keeps its expiry. A store that can also create the counter in the same
        request does so, with value ``by`` and expiry ``expires_if_new`` (DynamoDB: an absent
        key; Redis: an absent or expired one). None if nothing was written (the caller then
        uses :meth:`create_counter`);
        :class:`InvalidValueError` if the live value is not an integer.
        """
        ...

    def create_counter(self, key: str, value: int, expires_at_ms: int | None, now_ms: int) -> bool:
        """Write integer ``value`` only if the key is absent or expired (like :meth:`add`)."""
        ...

    def keys_page(self, partition: int, prefix: str, now_ms: int, cursor: Any) -> KeyPage:
        """One page of the keys in ``partition`` that start with ``prefix`` (``""``: all)."""
        ...

    def get_batch(
        self, keys: list[str], now_ms: int, *, consistent: bool = True
    ) -> tuple[Mapping[str, tuple[str, int | None]], list[str]]:
        """Read up to ``max_batch_get`` distinct keys (consistently unless ``consistent`` is
        False, as :meth:`get`): (live entries, unprocessed).

        An entry is any ``(encoded, expires_at_ms)`` pair: a :class:`CacheEntry` or a plain
        tuple, which is cheaper to make once per item of a batch.
        """
        ...

    def set_batch(
        self, entries: list[tuple[str, str, int | None]]
    ) -> list[tuple[str, str, int | None]]:
        """Write up to ``max_batch_write`` (key, encoded, expires_at_ms); return the unprocessed."""
        ...

    def delete_batch(self, keys: list[str]) -> list[str]:
        """Delete up to ``max_batch_write`` distinct keys; return the unprocessed ones."""
        ...


def _literal_prefix(pattern: str) -> str:
    """The part of a glob before its first wildcard (``"user:*"`` -> ``"user:"``)."""
    cut = min((i for i in (pattern.find(c) for c in _GLOB_CHARS) if i >= 0), default=len(pattern))
    return pattern[:cut]


def _valid_keys(given: list[Any]) -> list[str]:
    """``given`` once each item is known to be a valid cache key; the first bad one raises as
    :func:`keys.validate_key` words it."""
    for k in given:
        keys.validate_key(k, "cache key")
    return given


def _chunks(items: list[T], size: int) -> Iterator[list[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class Cache:
    """A TTL cache over a :class:`CacheStore`. Reached as ``backend.cache(default_ttl=...)``.

    ``default_ttl`` (seconds) applies to every write that gives no ``ttl``; None means entries
    never expire unless a ``ttl`` is given.

    ``consistent_reads`` (default False): :meth:`get`, :meth:`has` and :meth:`get_many` read
    eventually consistently (DynamoDB: half the read units, DAX can serve them); a write by any
    process is then seen after the store's replication lag (typically under a second), which a
    cache's readers already accept for entries written just before they read. The reads that
    decide something stay consistent whatever this says: :meth:`get_or_set` and ``@cached``
    (the fill protocol: a waiter must see the filler's value), and every write's condition.

    ``local_ttl`` (seconds, default None: off): an in-process tier for hot keys. A value this
    cache read or wrote is kept in the process for that long (never past the entry's own
    expiry; at most ``local_max`` keys, the oldest dropped first) and returned by :meth:`get`
    and :meth:`has` without a request. Freshness: a write or delete by *another* process is seen
    up to ``local_ttl`` seconds late (plus the replication lag); this cache's own writes,
    deletes and increments update or drop its local copy at once, also when threads share the
    cache (see :meth:`_begin`). Misses are not kept.
    """

    #: first delay and cap of the backoff used while waiting for a fill or resending a batch
    backoff_initial = 0.02
    backoff_max = 0.5

    def __init__(
        self,
        store: CacheStore,
        *,
        locks: Locks | None = None,
        default_ttl: float | None = None,
        clock: Clock | None = None,
        namespace: str = "default",
        metrics: MetricsScope | None = None,
        consistent_reads: bool = False,
        local_ttl: float | None = None,
        local_max: int = 1024,
    ) -> None:
        self._store = store
        self.consistent_reads = check_bool(consistent_reads, "consistent_reads")
        if local_ttl is not None and (
            not isinstance(local_ttl, int | float) or isinstance(local_ttl, bool)
        ):
            raise TypeError(f"local_ttl must be seconds or None, got {local_ttl!r}")
        if local_ttl is not None and not 0 < local_ttl <= 3600:
            raise ValueError(f"local_ttl must be within (0, 3600] seconds, got {local_ttl!r}")
        self.local_ttl = local_ttl
        self.local_max = check_int(local_max, "local_max", minimum=1)
        #: key -> (monotonic deadline, encoded value, expires_at_ms) of the in-process tier
        self._local: dict[str, tuple[float, str, int | None]] = {}
        #: key -> tokens of this cache's reads and writes of it in flight (tier on only)
        self._inflight: dict[str, set[int]] = {}
        self._tokens = itertools.count()
        #: guards _local and _inflight (never held during a request)
        self._local_lock = threading.Lock()
        self._locks = locks
        self._metrics = metrics if metrics is not None else NO_SCOPE
        self.clock: Clock = clock or SystemClock()
        self.namespace = namespace
        self._default_ttl_ms = (
            None if default_ttl is None else ttl_to_ms(default_ttl, "default_ttl")
        )

    @property
    def default_ttl(self) -> float | None:
        """The default TTL in seconds, or None."""
        return None if self._default_ttl_ms is None else self._default_ttl_ms / 1000

    def __repr__(self) -> str:
        return f"Cache(namespace={self.namespace!r}, default_ttl={self.default_ttl!r})"

    # -- helpers ------------------------------------------------------------------------------

    def _expiry(self, ttl: float | None, now: int) -> int | None:
        ttl_ms = self._default_ttl_ms if ttl is None else ttl_to_ms(ttl)
        return None if ttl_ms is None else now + ttl_ms

    def _prepare(self, key: str, value: Any, ttl: float | None) -> tuple[str, int | None, int]:
        """Validate key, TTL and value, and size-check the entry; nothing is sent. Returns the
        encoded value, the expiry and the time it was computed from."""
        keys.validate_key(key, "cache key")
        now = now_ms(self.clock)
        expires = self._expiry(ttl, now)
        encoded = codec.encode(value)
        self._store.check_entry(key, encoded, expires)
        return encoded, expires, now

    def _sleep(self, delay: float, deadline: float | None = None) -> float:
        """Sleep a fully jittered ``delay`` (never past ``deadline``); return the next delay."""
        pause = random.uniform(0, delay)
        if deadline is not None:
            pause = min(pause, max(0.0, deadline - self.clock.monotonic()))
        self.clock.sleep(pause)
        return min(self.backoff_max, delay * 2)

    # -- single keys ----------------------------------------------------------------------------

    # The in-process tier when threads share this cache (concurrent invocations). A request's
    # answer may be older than a change this cache made while it was in flight:
    #
    #   A: get(k) misses the tier, reads 1 .................... answer arrives, keeps 1
    #   B:               delete(k) (drops the tier's copy, deletes) ^ the store holds nothing
    #
    # Kept, A's answer would be served to every thread for local_ttl after B's delete. So each
    # request on a key takes a token before it is sent and its answer is kept only if the token
    # is still valid when it comes back: a write voids every token on its key when it starts
    # (the answers in flight may predate it) and when it ends (they may have been read before
    # it applied), and a write whose own token was voided (another write overlapped it: which
    # of the two the store holds is unknown) drops the copy instead of keeping its value.

    def _begin(self, key: str, *, write: bool) -> int | None:
        """A token for one request on ``key`` (None when the tier is off)."""
        if self.local_ttl is None:
            return None
        with self._local_lock:
            if write:
                self._local.pop(key, None)
                self._inflight.pop(key, None)
            token = next(self._tokens)
            self._inflight.setdefault(key, set()).add(token)
            return token

    def _end(
        self,
        key: str,
        token: int | None,
        *,
        write: bool,
        keep: tuple[str, int | None] | None = None,
    ) -> None:
        """The request of ``token`` on ``key`` came back (or failed: ``keep`` None): keep
        ``(encoded, expires_at_ms)`` in the tier if nothing voided the token."""
        if token is None:
            return
        with self._local_lock:
            tokens = self._inflight.get(key)
            valid = tokens is not None and token in tokens
            if write:
                self._inflight.pop(key, None)
                if not valid or keep is None:
                    self._local.pop(key, None)
            elif tokens is not None:
                tokens.discard(token)
                if not tokens:
                    del self._inflight[key]
            if valid and keep is not None:
                self._keep_locked(key, *keep)

    def _keep_locked(self, key: str, encoded: str, expires_at_ms: int | None) -> None:
        """Put a copy in the tier (the tier is on and _local_lock is held)."""
        assert self.local_ttl is not None
        local = self._local
        local.pop(key, None)
        while len(local) >= self.local_max:
            del local[next(iter(local))]  # the oldest kept
        local[key] = (self.clock.monotonic() + self.local_ttl, encoded, expires_at_ms)

    def _read(self, key: str) -> tuple[str, int | None] | None:
        """The live entry of ``key`` as (encoded, expires_at_ms): from the in-process tier when
        it holds a fresh copy, else one read (eventually consistent unless consistent_reads)."""
        now = now_ms(self.clock)
        if self.local_ttl is None:
            entry = self._store.get(key, now, consistent=self.consistent_reads)
            return None if entry is None else (entry.encoded, entry.expires_at_ms)
        with self._local_lock:
            kept = self._local.get(key)
            if kept is not None:
                deadline, encoded, expires = kept
                if self.clock.monotonic() < deadline and (expires is None or expires > now):
                    return encoded, expires
                del self._local[key]
            token = next(self._tokens)
            self._inflight.setdefault(key, set()).add(token)
        entry = None
        try:
            entry = self._store.get(key, now, consistent=self.consistent_reads)
        finally:
            self._end(
                key,
                token,
                write=False,
                keep=None if entry is None else (entry.encoded, entry.expires_at_ms),
            )
        return None if entry is None else (entry.encoded, entry.expires_at_ms)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when it is absent or expired (one read, or none
        from the in-process tier; see the class docstring for the freshness of each)."""
        keys.validate_key(key, "cache key")
        entry = self._read(key)
        self._metrics.count("CacheMiss" if entry is None else "CacheHit")
        return default if entry is None else codec.decode(entry[0])

    def has(self, key: str) -> bool:
        """True if ``key`` holds a live entry (a stored None counts)."""
        keys.validate_key(key, "cache key")
        return self._read(key) is not None

    def set(self, key: str, value: Any, ttl: float | None = None) -> None:
        """Store ``value`` under ``key`` for ``ttl`` seconds (default: the cache's default TTL).

        Raises before anything is written: :class:`InvalidKeyError` for a bad key,
        :class:`InvalidValueError` for a value the codec cannot store, :class:`ValueTooLargeError`
        for an entry over the item limit, :class:`InvalidValueError` (a ``ValueError``) for a
        ``ttl`` out of range and ``TypeError`` for one that is not a number.
        """
        encoded, expires, _ = self._prepare(key, value, ttl)
        token = self._begin(key, write=True)
        stored = False
        try:
            self._store.set(key, encoded, expires)
            stored = True
        finally:
            self._end(key, token, write=True, keep=(encoded, expires) if stored else None)

    def add(self, key: str, value: Any, ttl: float | None = None) -> bool:
        """Store ``value`` only if ``key`` is absent or expired (atomic); True if it was stored."""
        encoded, expires, now = self._prepare(key, value, ttl)
        token = self._begin(key, write=True)
        added = False
        try:
            added = self._store.add(key, encoded, expires, now)
        finally:
            self._end(key, token, write=True, keep=(encoded, expires) if added else None)
        return added

    def delete(self, key: str) -> bool:
        """Remove ``key``; True if a live entry was removed."""
        keys.validate_key(key, "cache key")
        return self._delete_checked(key)

    def _delete_checked(self, key: str) -> bool:
        token = self._begin(key, write=True)
        try:
            return self._store.delete(key, now_ms(self.clock))
        finally:
            self._end(key, token, write=True)

    def touch(self, key: str, ttl: float | None) -> bool:
        """Give a live entry a new TTL from now (None: never expire); False if absent/expired."""
        keys.validate_key(key, "cache key")
        now = now_ms(self.clock)
        expires = None if ttl is None else now + ttl_to_ms(ttl)
        token = self._begin(key, write=True)
        try:
            return self._store.touch(key, expires, now)
        finally:
            self._end(key, token, write=True)

    def incr(self, key: str, by: int = 1, *, ttl: float | None = None) -> int:
        """Atomically add ``by`` to the integer under ``key`` and return the new value.

        An absent or expired key starts from 0 (and gets ``ttl``, default: the cache's default
        TTL); an existing counter keeps its expiry. A live non-integer value raises
        :class:`InvalidValueError`. Integers are limited to 38 digits (DynamoDB's precision).
        """
        keys.validate_key(key, "cache key")
        check_int(by, "by", minimum=_BY_MIN, maximum=_BY_MAX)
        # Up to two steps because "add to the live counter" and "start a new counter on an
        # expired one" are different writes, and a store cannot tell an expired item from a live
        # one inside a single atomic ADD:
        #   1. ADD to a live integer entry (one conditional write; the common case). DynamoDB
        #      also creates an absent key in this same write, Redis an absent or expired one.
        #   2. If nothing was written (expired, or absent on other stores), create it with value
        #      ``by``, conditionally on it still being absent or expired. If someone else created
        #      it between 1 and 2, the create fails and we go back to 1, where our increment lands
        #      on top of theirs. No increment is ever lost or applied twice.
        # No size check: a number of at most 38 digits cannot make the entry outgrow an item,
        # and the store refuses a key it cannot hold when it builds the key.
        ttl_ms = self._default_ttl_ms if ttl is None else ttl_to_ms(ttl)
        token = self._begin(key, write=True)
        try:
            for _ in range(_BATCH_ATTEMPTS):
                now = now_ms(self.clock)
                expires = None if ttl_ms is None else now + ttl_ms
                value = self._store.incr(key, by, now, expires)
                if value is not None:
                    return value
                if self._store.create_counter(key, by, expires, now):
                    return by
        finally:
            self._end(key, token, write=True)
        raise BackendError(
            f"incr of cache key {key!r} kept racing with concurrent deletes/creates; giving up",
            code="IncrContention",
        )

    # -- listing --------------------------------------------------------------------------------

    def _walk(self, pattern: str) -> Iterator[KeyPage]:
        prefix = _literal_prefix(pattern)
        for partition in range(self._store.partitions):
            cursor: Any = None
            while True:
                page = self._store.keys_page(partition, prefix, now_ms(self.clock), cursor)
                yield page
                if page.cursor is None:
                    break
                cursor = page.cursor

    def keys(self, pattern: str = "*") -> list[str]:
        """Live keys matching the glob ``pattern`` (``fnmatch`` rules, case-sensitive), sorted.

        The literal prefix of the pattern (``"user:"`` in ``"user:*"``) is matched by the store
        (DynamoDB: ``begins_with`` on gsi1, every shard, every page); the rest of the pattern is
        applied here. On DynamoDB the index is eventually consistent: an entry written a moment
        ago may be missing.
        """
        if not isinstance(pattern, str):
            raise TypeError(f"pattern must be a str, got {type(pattern).__name__}")
        import fnmatch

        full = pattern == "*"
        found: list[str] = []
        for page in self._walk(pattern):
            found.extend(k for k in page.live if full or fnmatch.fnmatchcase(k, pattern))
        return sorted(found)

    def clear(self) -> int:
        """Remove every entry of this namespace; return how many live entries were removed.
        (The in-process tier of this cache is emptied too.)

        Expired entries still stored are removed too (not counted). Entries written while
        ``clear`` runs may survive it.
        """
        self._clear_local()
        removed = 0
        try:
            for page in self._walk("*"):
                batch = page.live + page.expired
                if batch:
                    self._delete_keys(batch)
                removed += len(page.live)
        finally:
            # a read in flight during the walk may have kept an entry deleted after it
            self._clear_local()
        return removed

    def _clear_local(self) -> None:
        with self._local_lock:
            self._local.clear()
            self._inflight.clear()

    # -- batches --------------------------------------------------------------------------------

    def get_many(self, keys_: Iterable[str]) -> dict[str, Any]:
        """The live entries among ``keys_`` as a dict (absent/expired keys are left out).

        Batch reads (eventually consistent unless ``consistent_reads``; never from the
        in-process tier) of ``max_batch_get`` keys (DynamoDB: 100) per request; keys the
        store leaves unprocessed are resent with backoff. ``keys_`` must be an iterable of keys:
        a single str is refused with ``TypeError`` (it would be read as one key per character).
        """
        given = check_iterable(keys_, "keys", "cache keys", hint="for one key use get()")
        wanted = list(dict.fromkeys(_valid_keys(given)))
        decode = codec.decode
        out: dict[str, Any] = {}
        for chunk in _chunks(wanted, self._store.max_batch_get):
            entries: Mapping[str, tuple[str, int | None]] = {}
            pending = chunk
            delay = self.backoff_initial
            for attempt in range(_BATCH_ATTEMPTS):
                found, pending = self._store.get_batch(
                    pending, now_ms(self.clock), consistent=self.consistent_reads
                )
                entries = {**entries, **found} if entries else found
                if not pending:
                    break
                logger.debug("get_many: %d keys unprocessed (attempt %d)", len(pending), attempt)
                delay = self._sleep(delay)
            else:
                raise BackendError(
                    f"get_many: {len(pending)} keys stayed unprocessed after {_BATCH_ATTEMPTS} "
                    "attempts (throttled?)",
                    code="UnprocessedKeys",
                )
            # in the order asked for (a store returns a batch in any order), so the result
            # needs no second pass
            for k in chunk:
                entry = entries.get(k)
                if entry is not None:
                    out[k] = decode(entry[0])  # a plain tuple from some stores
        return out

    def set_many(self, mapping: Mapping[str, Any], ttl: float | None = None) -> None:
        """Store every (key, value) of ``mapping`` with the same TTL.

        Every key and value is validated and size-checked before the first write; then batch
        writes of ``max_batch_write`` entries (DynamoDB: 25) per request, unprocessed entries
        resent with backoff. Not atomic as a whole: after a store error some entries may be
        written and others not.
        """
        if not isinstance(mapping, Mapping):
            raise TypeError(f"mapping must be a Mapping, got {type(mapping).__name__}")
        now = now_ms(self.clock)
        expires = self._expiry(ttl, now)
        entries: list[tuple[str, str, int | None]] = []
        for key, value in mapping.items():
            keys.validate_key(key, "cache key")
            encoded = codec.encode(value)
            self._store.check_entry(key, encoded, expires)
            entries.append((key, encoded, expires))
        tokens = [(key, self._begin(key, write=True)) for key, _, _ in entries]
        try:
            self._set_batches(entries)
        finally:
            for key, token in tokens:
                self._end(key, token, write=True)  # not kept: the tier keeps what was read

    def _set_batches(self, entries: list[tuple[str, str, int | None]]) -> None:
        for chunk in _chunks(entries, self._store.max_batch_write):
            pending = chunk
            delay = self.backoff_initial
            for _ in range(_BATCH_ATTEMPTS):
                pending = self._store.set_batch(pending)
                if not pending:
                    break
                delay = self._sleep(delay)
            else:
                raise BackendError(
                    f"set_many: {len(pending)} entries stayed unprocessed after "
                    f"{_BATCH_ATTEMPTS} attempts (throttled?)",
                    code="UnprocessedItems",
                )

    def delete_many(self, keys_: Iterable[str]) -> None:
        """Remove every key of ``keys_`` (batch deletes, unprocessed ones resent).

        ``keys_`` must be an iterable of keys: a single str is refused with ``TypeError`` rather
        than deleting one key per character.
        """
        given = check_iterable(keys_, "keys", "cache keys", hint="for one key use delete()")
        wanted = list(dict.fromkeys(_valid_keys(given)))
        self._delete_keys(wanted)

    def _delete_keys(self, wanted: list[str]) -> None:
        tokens = [(key, self._begin(key, write=True)) for key in wanted]
        try:
            self._delete_batches(wanted)
        finally:
            for key, token in tokens:
                self._end(key, token, write=True)

    def _delete_batches(self, wanted: list[str]) -> None:
        for chunk in _chunks(wanted, self._store.max_batch_write):
            pending = chunk
            delay = self.backoff_initial
            for _ in range(_BATCH_ATTEMPTS):
                pending = self._store.delete_batch(pending)
                if not pending:
                    break
                delay = self._sleep(delay)
            else:
                raise BackendError(
                    f"delete: {len(pending)} keys stayed unprocessed after {_BATCH_ATTEMPTS} "
                    "attempts (throttled?)",
                    code="UnprocessedItems",
                )

    # -- stampede protection --------------------------------------------------------------------

    def get_or_set(
        self,
        key: str,
        fn: Callable[[], Any],
        ttl: float | None = None,
        *,
        lock_timeout: float = 10.0,
    ) -> Any:
        """The value of ``key``; on a miss, compute it with ``fn()``, store it and return it.

        Stampede protection: on a miss the caller takes a short lock ``cache-fill:{key}`` (a
        distributed lock in this cache's namespace, TTL ``lock_timeout``). Only the holder calls
        ``fn``; every other caller, in any process, polls for the value with jittered backoff
        instead of calling ``fn`` too. If the holder fails (``fn`` raised, the process died) the
        lock is released or expires and one waiter takes it over.

        Decision: a waiter does not wait forever. After ``lock_timeout`` seconds without a value
        it calls ``fn`` itself and stores the result (liveness beats strict once-only when the
        filler is stuck); this is logged at WARNING level. Pick a ``lock_timeout`` above the
        normal run time of ``fn``.

        Bad input raises before anything is written, with one exception: the value ``fn``
        returns is only known after the fill lock was taken. If it cannot be stored
        (:class:`InvalidValueError`, :class:`ValueTooLargeError`), nothing is cached and the
        lock is released, but, like every released lock, its item
        ``LOCK#{namespace}#cache-fill:{key}`` stays (no owner, expired; it keeps the fence and
        is removed by the store's expiry sweep), exactly as after a successful fill.
        """
        keys.validate_key(key, "cache key")
        if not callable(fn):
            raise TypeError(f"fn must be callable (it computes the value), got {type(fn).__name__}")
        lock_ttl_ms = ttl_to_ms(lock_timeout, "lock_timeout")
        if ttl is not None:
            ttl_to_ms(ttl)  # validate before calling fn
        return self._get_or_set(key, fn, ttl, lock_ttl_ms)

    def _get_or_set(
        self, key: str, fn: Callable[[], Any], ttl: float | None, lock_ttl_ms: int
    ) -> Any:
        """:meth:`get_or_set` once its arguments are known to be valid."""
        entry = self._store.get(key, now_ms(self.clock))
        self._metrics.count("CacheMiss" if entry is None else "CacheHit")
        if entry is not None:
            return codec.decode(entry.encoded)
        if self._locks is None:  # a store without locks: no stampede protection
            return self._fill(key, fn, ttl)
        lock_key = f"cache-fill:{key}"
        deadline = self.clock.monotonic() + lock_ttl_ms / 1000
        delay = self.backoff_initial
        while True:
            lease = self._locks.acquire(lock_key, lock_ttl_ms / 1000)
            if lease is not None:
                try:
                    # Re-check under the lock: the previous holder may have filled it between our
                    # miss and our acquisition (without this, fn would run twice).
                    entry = self._store.get(key, now_ms(self.clock))
                    if entry is not None:
                        return codec.decode(entry.encoded)
                    return self._fill(key, fn, ttl)
                finally:
                    lease.release()
            delay = self._sleep(delay, deadline)
            entry = self._store.get(key, now_ms(self.clock))
            if entry is not None:
                return codec.decode(entry.encoded)
            if self.clock.monotonic() >= deadline:
                logger.warning(
                    "get_or_set(%r): no value after waiting %.3fs for the filler; computing here",
                    key,
                    lock_ttl_ms / 1000,
                )
                return self._fill(key, fn, ttl)

    def _fill(self, key: str, fn: Callable[[], Any], ttl: float | None) -> Any:
        value = fn()
        self.set(key, value, ttl)
        self._metrics.count("CacheFill")
        return value

    def cached(
        self,
        ttl: float | None = None,
        key: str | Callable[..., str] | None = None,
        *,
        lock_timeout: float = 10.0,
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: cache a function's result with :meth:`get_or_set` (stampede protected).

        The cache key is, by default, ``"{module}.{qualname}:{digest}"`` where ``digest`` is a
        SHA-256 of the call's arguments bound to the signature with defaults applied (so
        ``f(1)`` and ``f(x=1)`` share an entry) and encoded with the codec, dict keys sorted: the
        same call gives the same key in every process. Arguments the codec cannot encode (``self``
        of a method, objects) raise :class:`InvalidValueError`; pass ``key`` then: a str (used as
        the prefix instead of the qualified name, the arguments still hashed) or a callable that
        takes the function's arguments and returns the whole key. The wrapper has
        ``.cache_key(*args, **kwargs)`` and ``.invalidate(*args, **kwargs)``.
        """
        if ttl is not None:
            ttl_to_ms(ttl)
        lock_ttl_ms = ttl_to_ms(lock_timeout, "lock_timeout")
        if key is not None and not (isinstance(key, str) or callable(key)):
            raise TypeError(f"key must be a str, a callable or None, got {type(key).__name__}")
        if isinstance(key, str):
            keys.validate_key(key, "cache key")

        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            if not callable(fn):
                raise TypeError(f"@cache.cached decorates a callable, got {type(fn).__name__}")
            signature = inspect.signature(fn)
            prefix = key if isinstance(key, str) else f"{fn.__module__}.{fn.__qualname__}"

            if callable(key):
                make_key = key

                def cache_key(*args: Any, **kwargs: Any) -> str:
                    return keys.validate_key(make_key(*args, **kwargs), "cache key")

            else:

                def cache_key(*args: Any, **kwargs: Any) -> str:
                    bound = signature.bind(*args, **kwargs)
                    bound.apply_defaults()
                    try:
                        canonical = codec.canonical(bound.arguments)
                    except InvalidValueError as exc:
                        raise InvalidValueError(
                            f"cannot build a cache key for {prefix}: its arguments are not "
                            f"encodable ({exc}); pass key=... to @cache.cached"
                        ) from exc
                    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
                    return keys.validate_key(f"{prefix}:{digest}", "cache key")

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> T:
                # ttl and lock_timeout were checked when the decorator was made
                result: T = self._get_or_set(
                    cache_key(*args, **kwargs), lambda: fn(*args, **kwargs), ttl, lock_ttl_ms
                )
                return result

            def invalidate(*args: Any, **kwargs: Any) -> bool:
                # delete() without its key check: cache_key returns a checked key (and the
                # in-process tier drops its copy, as delete() does)
                return self._delete_checked(cache_key(*args, **kwargs))

            wrapper.cache_key = cache_key  # type: ignore[attr-defined]
            wrapper.invalidate = invalidate  # type: ignore[attr-defined]
            return wrapper

        return decorate
