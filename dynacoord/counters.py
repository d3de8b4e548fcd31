"""Coordination counters, set-if-absent flags and idempotent fan-in joins.

The coordination store a queue-driven workflow engine keeps next to its queues: atomic counters
(``increment``), flags that only the first writer sets (``set_if_absent``) and fan-in joins that
count each member once however often it is redelivered (``join``). Policy lives here; a backend
supplies a :class:`CounterStore` whose methods are one request each.

Every item kind lives under the same key (``COUNTER#{ns}#{key}``), so one key holds either a
counter, a flag or a join; using a key as another kind than it holds raises
:class:`~dynacoord.errors.CounterTypeError`. An expired item (``now >= expires_at``) is absent for
every operation, whether or not the store's TTL sweeper has removed it yet.

Restarting an expired counter takes two conditional writes, and the second one is conditional so
that racing callers never lose an increment::

    A: add   (item live or absent?) -> no, expired
    B: add   (item live or absent?) -> no, expired
    A: restart (absent or expired?) -> yes: n = by_A, new expiry
    B: restart (absent or expired?) -> no, A's restart made it live again
    B: add   (item live or absent?) -> yes: n = by_A + by_B

An unconditional restart would let B overwrite A's restart (n = by_B, A's increment lost); an
unconditional add would continue counting from the stale value of the expired counter.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import codec, keys
from ._clock import Clock, SystemClock, now_ms
from ._items import is_live, optional_int
from ._raised import RaisedWrites
from ._validate import check_int, ttl_to_ms
from .errors import (
    BackendError,
    CounterTypeError,
    InvalidKeyError,
    InvalidValueError,
    JoinMismatchError,
)

__all__ = [
    "MAX_JOIN_EXPECTED",
    "MAX_JOIN_MEMBER_BYTES",
    "CounterItem",
    "CounterStore",
    "Counters",
    "JoinResult",
    "ShardedCounter",
    "WriteOutcome",
]

logger = logging.getLogger(__name__)

#: The most members a join may wait for. DynamoDB spreads them over at most 160 bucket items
#: (about 16 members each up to 2,560 members, 625 at this limit: 80 KB of 128-byte members);
#: Redis keeps one hash field per member, MongoDB one array on the document (12.8 MB of 128-byte
#: members at this limit, under its 16 MB). For a larger fan-in, count with
#: :meth:`Counters.increment` and make each member's work idempotent.
MAX_JOIN_EXPECTED = 100_000
MAX_JOIN_MEMBER_BYTES = 128

#: How often an increment or join retries after finding the item expired and losing the restart
#: race (each loss means another caller made the item live, so the next add succeeds unless the
#: item expired again in between: only possible with TTLs of a few milliseconds).
_MAX_RESTARTS = 8
#: DynamoDB numbers hold 38 significant digits: a larger int would fail inside boto3's serializer.
MAX_COUNTER_VALUE = 10**38 - 1

#: what a flag's item adds to its key and encoded value in codec.estimate_item_size (the names
#: "pk" and "v", and a byte to spare)
_FLAG_SIZE_OVERHEAD = 4

COUNTER = "counter"
FLAG = "flag"
JOIN = "join"


@dataclass(frozen=True, slots=True)
class CounterItem:
    """A live item under a counter key, as a store read it."""

    kind: str
    #: int for a counter and a join (its count), the decoded value for a flag
    value: Any
    expires_at_ms: int | None = None
    #: joins only
    expected: int | None = None
    members: frozenset[str] = frozenset()
    #: joins only: the member whose arrival completed the join (while it is incomplete, the
    #: latest member to arrive); arrivals beyond ``expected`` never change it
    last_member: str | None = None

    @classmethod
    def from_item(
        cls,
        item: Mapping[str, Any] | None,
        now_ms: int,
        *,
        members: Iterable[Any] | None = None,
    ) -> CounterItem | None:
        """The live item a store read (the same field names on every backend), or None if it is
        missing or expired. ``members`` overrides the item's ``members`` field (Redis keeps a
        join's members as separate hash fields)."""
        if not is_live(item, now_ms):
            return None
        assert item is not None
        expires_at_ms = optional_int(item, "expires_at_ms")
        kind = str(item.get("kind", COUNTER))
        if kind == FLAG:
            return cls(kind, codec.decode(str(item["value"])), expires_at_ms)
        if kind == JOIN:
            return cls(
                kind,
                int(item.get("n", 0)),
                expires_at_ms,
                int(item["expected"]),
                frozenset(map(str, item.get("members", ()) if members is None else members)),
                None if item.get("last") is None else str(item["last"]),
            )
        return cls(kind, int(item.get("n", 0)), expires_at_ms)


def _counter_item(
    kind: str,
    value: Any,
    expires_at_ms: int | None = None,
    expected: int | None = None,
    members: frozenset[str] = frozenset(),
    last_member: str | None = None,
) -> CounterItem:
    """``CounterItem(...)`` of these fields, given by position (the DynamoDB store's readers
    call it)."""
    return CounterItem(kind, value, expires_at_ms, expected, members, last_member)


def value_fields(kind: str, value: Any) -> dict[str, Any]:
    """The stored fields of a new counter (``n``) or flag (codec text ``value``) of ``kind``: the
    same field names on every backend, read back by :meth:`CounterItem.from_item`."""
    if kind == COUNTER:
        return {"kind": kind, "n": int(value)}
    return {"kind": kind, "value": codec.encode(value)}


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What one conditional write of a counter or join returned."""

    ok: bool
    #: the item after a successful write
    item: CounterItem | None = None
    #: the live item that made the condition fail; None when it failed on an expired item
    current: CounterItem | None = None
    #: set (to the store's largest counter) when the add was refused because its result would
    #: leave the numbers the store can hold; nothing was written
    out_of_range: int | None = None


def _write_outcome(
    ok: bool,
    item: CounterItem | None = None,
    current: CounterItem | None = None,
    out_of_range: int | None = None,
) -> WriteOutcome:
    """``WriteOutcome(...)`` of these fields, given by position (the DynamoDB store calls it)."""
    return WriteOutcome(ok, item, current, out_of_range)


@dataclass(frozen=True, slots=True)
class JoinResult:
    """The state of a join after one arrival.

    ``fired`` is True for the arrival that completed the join, and again for every repeated
    arrival of that same member (at least once: a redelivery after a crash between the join and
    the next step, or a retry whose first response was lost, must not strand the workflow). A
    repeated arrival of any other member reports the current state with ``fired=False``.
    """

    count: int
    complete: bool
    fired: bool
    expected: int = 0


def _join_result(count: int, complete: bool, fired: bool, expected: int) -> JoinResult:
    """``JoinResult(...)`` of these fields, given by position."""
    return JoinResult(count, complete, fired, expected)


class CounterStore(Protocol):
    """Storage for counters, flags and joins. Every method is one request to the store.

    ``now_ms`` is the caller's clock; an item with ``expires_at_ms <= now_ms`` is absent.
    ``ttl_ms`` None means "no expiry" on creation.
    """

    def add(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        """Add ``by`` to a live counter or create it at ``by``; fail on an expired or other item.

        The expiry is set only when the counter has none (on creation, or ``ttl_ms`` given for a
        counter created without one); a live counter keeps its expiry.
        """
        ...

    def restart(self, key: str, by: int, ttl_ms: int | None, now_ms: int) -> WriteOutcome:
        """Replace an absent or expired item with a counter at ``by``; fail on a live item."""
        ...

    def put_if_absent(
        self,
        key: str,
        kind: str,
        value: Any,
        ttl_ms: int | None,
        now_ms: int,
        token: str | None = None,
    ) -> bool:
        """Create a counter (int ``value``) or a flag (codec-encodable ``value``) if absent or
        expired. The item carries ``token`` (a fresh one when None): a refusal by an item that
        carries it is this caller's own write, applied (True)."""
        ...

    def get(self, key: str, now_ms: int) -> CounterItem | None:
        """The live item, read consistently."""
        ...

    def delete(self, key: str, now_ms: int) -> bool:
        """Delete the item; True if it was live."""
        ...

    def extend(self, key: str, ttl_ms: int, now_ms: int) -> bool:
        """Set the expiry of a live item to ``now + ttl``; False if missing or expired."""
        ...

    def join_add(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        """Add ``member`` to a live join (or create it); fail if the member is already in, the
        join has another ``expected``, the item is another kind, or it expired."""
        ...

    def join_restart(
        self, key: str, member: str, expected: int, ttl_ms: int | None, now_ms: int
    ) -> WriteOutcome:
        """Replace an absent or expired item with a join holding only ``member``."""
        ...


def _value_digest(kind: str, encoded: str) -> str:
    """What a set_if_absent wrote, as its retry must match it: a digest, so that the memory of
    raised writes stays small for big flags."""
    return f"{kind}:" + hashlib.sha256(encoded.encode("utf-8")).hexdigest()


class Counters:
    """Counters, flags and joins over a :class:`CounterStore`. Reached as ``backend.counters``."""

    def __init__(self, store: CounterStore, *, clock: Clock | None = None) -> None:
        self._store = store
        self._raised = RaisedWrites()  # set_if_absent writes that raised (maybe applied)
        self.clock: Clock = clock or SystemClock()

    # -- counters --------------------------------------------------------------------------------

    def increment(self, key: str, by: int = 1, *, ttl: float | None = None) -> int:
        """Add ``by`` (may be negative) atomically and return the new value.

        A missing or expired counter starts from 0. ``ttl`` (seconds) applies when the counter is
        created or restarted after expiry (and to a live counter that has no expiry yet); it does
        not slide on later increments, so ``increment(key, ttl=60)`` counts in fixed windows. Use
        :meth:`extend_ttl` to push an expiry. One request unless the counter has expired.
        """
        keys.validate_key(key, "counter key")
        check_int(by, "by", minimum=-MAX_COUNTER_VALUE, maximum=MAX_COUNTER_VALUE)
        ttl_ms = None if ttl is None else ttl_to_ms(ttl)
        now = now_ms(self.clock)
        for _ in range(_MAX_RESTARTS):
            outcome = self._store.add(key, by, ttl_ms, now)
            if outcome.out_of_range is not None:
                limit = outcome.out_of_range
                raise InvalidValueError(
                    f"incrementing counter {key!r} by {by} would leave the range this store "
                    f"holds exactly (-{limit}..{limit}); nothing was written"
                )
            if not outcome.ok:
                self._refuse_other_kind(key, outcome.current, COUNTER)
                # Expired: restart it, unless another caller restarted it first (then add again).
                outcome = self._store.restart(key, by, ttl_ms, now)
                if not outcome.ok:
                    self._refuse_other_kind(key, outcome.current, COUNTER)
                    continue
                logger.debug("counter %r restarted after expiry", key)
            if outcome.item is None:
                # a retry recognised as applied after another call deleted the counter in the
                # gap (Redis keeps the slots beside the item): the value read then is absent
                return 0
            return int(outcome.item.value)
        raise BackendError(  # pragma: no cover - needs an item expiring again on every attempt
            f"counter {key!r} kept expiring while being incremented ({_MAX_RESTARTS} attempts)"
        )

    def set_if_absent(self, key: str, value: Any, *, ttl: float | None = None) -> bool:
        """Store ``value`` unless the key holds a live item; True if this call stored it.

        An expired item counts as absent. An int ``value`` creates a counter (so
        ``set_if_absent(key, 0)`` followed by ``increment(key)`` works); any other
        JSON-compatible value (str, bool, float, None, bytes, Decimal, list, dict) creates a flag.
        """
        keys.validate_key(key, "counter key")
        ttl_ms = None if ttl is None else ttl_to_ms(ttl)
        if isinstance(value, int) and not isinstance(value, bool):
            check_int(value, "value", minimum=-MAX_COUNTER_VALUE, maximum=MAX_COUNTER_VALUE)
            return self._put_if_absent(key, COUNTER, value, str(value), ttl_ms)
        encoded = codec.encode(value)  # refuses unsupported values before anything is written
        # A UTF-8 character takes at most 4 bytes: a short flag fits without the exact estimate.
        if 4 * (len(key) + len(encoded)) + _FLAG_SIZE_OVERHEAD > codec.DYNAMODB_ITEM_LIMIT:
            codec.check_item_size({"pk": key, "v": encoded}, key=key)
        return self._put_if_absent(key, FLAG, value, encoded, ttl_ms)

    def _put_if_absent(
        self, key: str, kind: str, value: Any, encoded: str, ttl_ms: int | None
    ) -> bool:
        """One put_if_absent, recognised by this process's next attempt if its call raised: the
        request token is kept for the key and the same value (dynacoord._raised), so a refusal
        by an item holding it is this caller's own write, applied (True), never "taken"."""
        now = now_ms(self.clock)
        token = None
        if key in self._raised:  # rare: the digest only then (and when a call raises)
            token = self._raised.take(key, _value_digest(kind, encoded), now)
        token = token or os.urandom(8).hex()
        try:
            return self._store.put_if_absent(key, kind, value, ttl_ms, now, token=token)
        except BaseException:
            match = _value_digest(kind, encoded)
            self._raised.keep(key, token, match, None if ttl_ms is None else now + ttl_ms)
            raise

    def get(self, key: str) -> Any:
        """The counter's int, the flag's value or the join's count; None if missing or expired."""
        keys.validate_key(key, "counter key")
        item = self._store.get(key, now_ms(self.clock))
        return None if item is None else item.value

    def item(self, key: str) -> CounterItem | None:
        """The live item with its kind, expiry and (for joins) members, or None."""
        keys.validate_key(key, "counter key")
        return self._store.get(key, now_ms(self.clock))

    def delete(self, key: str) -> bool:
        """Delete a counter, flag or join; True if a live item was deleted."""
        keys.validate_key(key, "counter key")
        return self._store.delete(key, now_ms(self.clock))

    def extend_ttl(self, key: str, ttl: float) -> bool:
        """Set the expiry of a live item to now + ``ttl``; False if it is missing or expired."""
        keys.validate_key(key, "counter key")
        return self._store.extend(key, ttl_to_ms(ttl), now_ms(self.clock))

    def sharded(self, key: str, *, shards: int) -> ShardedCounter:
        """A counter spread over ``shards`` items, for rates past one item's ceiling (DynamoDB:
        1,000 WCU/s per partition, so about 1,000 increments/s on one counter). See
        :class:`ShardedCounter`."""
        return ShardedCounter(self, key, shards=shards)

    # -- joins -------------------------------------------------------------------------------------

    def join(self, key: str, member: str, *, expected: int, ttl: float | None = None) -> JoinResult:
        """Record that ``member`` arrived at the fan-in ``key`` that waits for ``expected`` members.

        Idempotent per member: a redelivered arrival is counted once. ``fired`` is True for the
        member whose arrival made the count reach ``expected`` (that caller runs the
        continuation) and stays True for every redelivery of that member, so a crash or a lost
        response between the join and the continuation cannot strand the run (at least once:
        make the continuation idempotent); any other member never fires. Every caller must pass the same ``expected`` (the first arrival
        stores it; a different value raises :class:`JoinMismatchError`). Extra distinct members
        beyond ``expected`` are counted but never fire again. ``ttl`` applies from the first
        arrival. Bounded by :data:`MAX_JOIN_EXPECTED` members of at most
        :data:`MAX_JOIN_MEMBER_BYTES` bytes. One request unless the join has expired.
        """
        keys.validate_key(key, "join key")
        check_int(expected, "expected", minimum=1, maximum=MAX_JOIN_EXPECTED)
        if not isinstance(member, str) or not member:
            raise InvalidKeyError("join member must be a non-empty str", key=member)
        size = len(keys.validate_key(member, "join member").encode("utf-8"))
        if size > MAX_JOIN_MEMBER_BYTES:
            raise InvalidKeyError(
                f"join member is {size} bytes, the limit is {MAX_JOIN_MEMBER_BYTES} bytes of UTF-8 "
                "(members are stored as given, in a bounded number of items)",
                key=member,
            )
        ttl_ms = None if ttl is None else ttl_to_ms(ttl)
        now = now_ms(self.clock)
        for _ in range(_MAX_RESTARTS):
            outcome = self._store.join_add(key, member, expected, ttl_ms, now)
            if outcome.ok:
                assert outcome.item is not None
                count = int(outcome.item.value)
                # Exactly one write makes the count reach expected (each write moves it up
                # atomically from the value it read), and only writes made while the join was
                # incomplete name their member ``last``: that member completed it.
                fired = count >= expected and outcome.item.last_member == member
                return _join_result(count, count >= expected, fired, expected)
            current = outcome.current
            if current is not None:
                if current.kind != JOIN:  # checked here: a redelivery is a hot path
                    self._refuse_other_kind(key, current, JOIN)
                stored = current.expected if current.expected is not None else expected
                if stored != expected:
                    raise JoinMismatchError(
                        f"join {key!r} was created with expected={stored}, this arrival says "
                        f"expected={expected}",
                        key=key,
                        expected=expected,
                        stored_expected=stored,
                    )
                if member in current.members:
                    # Arrived before (a redelivery, or a retry of this very arrival whose
                    # response was lost): it fires again if it is the member that completed it.
                    count = int(current.value)
                    logger.debug("join %r: member %r arrived again", key, member)
                    fired = count >= expected and current.last_member == member
                    return _join_result(count, count >= expected, fired, expected)
                continue  # pragma: no cover - the condition cannot fail otherwise
            outcome = self._store.join_restart(key, member, expected, ttl_ms, now)
            if outcome.ok:
                logger.debug("join %r restarted after expiry", key)
                return _join_result(1, expected == 1, expected == 1, expected)
            # Another arrival restarted it first: add to its join.
        raise BackendError(  # pragma: no cover
            f"join {key!r} kept expiring while being joined ({_MAX_RESTARTS} attempts)"
        )

    @staticmethod
    def _refuse_other_kind(key: str, current: CounterItem | None, wanted: str) -> None:
        if current is not None and current.kind != wanted:
            raise CounterTypeError(
                f"key {key!r} holds a {current.kind}, not a {wanted}", key=key, kind=current.kind
            )


#: the most shards a sharded counter may have (a read is one request per shard)
MAX_SHARDS = 100


class ShardedCounter:
    """A counter spread over ``shards`` counter items: ``{key}#shard{i}`` for i in 0..shards-1
    (those keys are the sharded counter's; do not use them as other counters).

    Each :meth:`increment` is one counting write to one shard picked at random, so the rate one
    counter takes grows with the shards (DynamoDB: about 1,000 increments/s per shard, each
    shard's item hashed to its own partition), at the same cost per increment as a plain counter
    (one request, 1 WCU for items under 1 KB), and exact under lost responses the same way (the
    slot of the call in flight). :meth:`value` sums every shard: ``shards`` consistent reads (DynamoDB:
    ``shards`` requests of 1 RCU each), so read it far less often than you increment it. The
    sum is not a snapshot: increments that land while it reads may or may not be in it.
    ``ttl`` applies per shard from its own first increment (each shard is a fixed window of its
    own), so use ``ttl`` for cleanup, not for exact time windows.
    """

    def __init__(self, counters: Counters, key: str, *, shards: int) -> None:
        keys.validate_key(key, "counter key")
        self.shards = check_int(shards, "shards", minimum=1, maximum=MAX_SHARDS)
        self.key = key
        self._counters = counters
        self._keys = [f"{key}#shard{i}" for i in range(self.shards)]
        for shard_key in self._keys:
            keys.validate_key(shard_key, "counter key")

    def __repr__(self) -> str:
        return f"ShardedCounter(key={self.key!r}, shards={self.shards})"

    def increment(self, by: int = 1, *, ttl: float | None = None) -> None:
        """Add ``by`` to one shard (one request). Returns nothing: the total needs every shard
        (:meth:`value`)."""
        self._counters.increment(random.choice(self._keys), by, ttl=ttl)

    def value(self) -> int:
        """The sum of every live shard (``shards`` reads)."""
        total = 0
        for shard_key in self._keys:
            n = self._counters.get(shard_key)
            if n is not None:
                total += int(n)
        return total

    def delete(self) -> bool:
        """Delete every shard; True if any was live."""
        deleted = False
        for shard_key in self._keys:
            deleted = self._counters.delete(shard_key) or deleted
        return deleted
