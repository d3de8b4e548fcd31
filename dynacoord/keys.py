"""The key schema shared by every backend (DESIGN.md section 2).

This module is the only place that turns a (kind, namespace, key) triple into the strings that are
stored. DynamoDB uses them as ``pk``/``sk``/``gsi1pk``/``gsi1sk``; Redis uses ``pk`` (or
``pk|sk``) as key names and sorted sets where DynamoDB uses ``gsi1``; MongoDB stores the same
fields.

A namespace never contains ``#``, so in ``KIND#{ns}#{key}`` the first two ``#`` are always the
delimiters and distinct (namespace, key) pairs can never produce the same ``pk``, whatever the
key contains.
"""

from __future__ import annotations

import zlib
from typing import Any

from ._compat import Record, StrEnum
from .errors import InvalidKeyError

__all__ = [
    "BREAKER_SK",
    "CACHE_SK",
    "COUNTER_SK",
    "IDEMPOTENCY_SK",
    "LOCK_SK",
    "MAX_PARTITION_KEY_BYTES",
    "MAX_SORT_KEY_BYTES",
    "RATE_SK",
    "RUN_SK",
    "SEMAPHORE_SK",
    "ItemKey",
    "Kind",
    "ParsedKey",
    "breaker_key",
    "breaker_pk",
    "cache_index_pk",
    "cache_key",
    "cache_pk",
    "checkpoint_key",
    "checkpoint_prefix",
    "counter_key",
    "counter_pk",
    "idempotency_key",
    "idempotency_pk",
    "lock_key",
    "lock_pk",
    "outbox_index_pk",
    "outbox_index_sk",
    "outbox_key",
    "parse_pk",
    "parse_sk_sequence",
    "rate_key",
    "run_index_pk",
    "run_index_sk",
    "run_key",
    "run_pk",
    "semaphore_key",
    "semaphore_pk",
    "shard_of",
    "time_sk_bound",
    "validate_key",
    "validate_namespace",
]

#: DynamoDB limits on key attribute values (UTF-8 bytes).
MAX_PARTITION_KEY_BYTES = 2048
MAX_SORT_KEY_BYTES = 1024
#: Sequences are zero-padded to this width so that string order equals numeric order.
SEQUENCE_WIDTH = 20  # written out in checkpoint_key's format
MAX_SEQUENCE = 10**SEQUENCE_WIDTH - 1
#: Epoch milliseconds are zero-padded to this width in sort keys (good until year 33658).
MS_WIDTH = 15
MAX_NAMESPACE_CHARS = 128


class Kind(StrEnum):
    """Every item kind and its pk prefix."""

    LOCK = "LOCK"
    BREAKER = "CB"
    CACHE = "CACHE"
    CHECKPOINT = "CHECKPOINT"
    IDEMPOTENCY = "IDEMP"
    OUTBOX = "OUTBOX"
    COUNTER = "COUNTER"
    RUN = "RUN"
    SEMAPHORE = "SEM"
    RATE = "RATE"

    def __str__(self) -> str:
        return self.value


#: The fixed sort key of each single-item kind (checkpoints use ``SEQ#...``).
_FIXED_SK: dict[Kind, str] = {
    Kind.LOCK: "LOCK",
    Kind.BREAKER: "CB",
    Kind.CACHE: "CACHE",
    Kind.IDEMPOTENCY: "IDEMP",
    Kind.OUTBOX: "EVENT",
    Kind.COUNTER: "COUNTER",
    Kind.RUN: "RUN",
    Kind.SEMAPHORE: "SEM",
    Kind.RATE: "RATE",
}


#: the kinds' pk prefixes and fixed sort keys as plain str (an enum member's ``.value`` is a
#: descriptor call on every key built)
_LOCK = Kind.LOCK.value
_BREAKER = Kind.BREAKER.value
_CACHE = Kind.CACHE.value
_CHECKPOINT = Kind.CHECKPOINT.value
_IDEMPOTENCY = Kind.IDEMPOTENCY.value
_OUTBOX = Kind.OUTBOX.value
_COUNTER = Kind.COUNTER.value
_RUN = Kind.RUN.value
_SEMAPHORE = Kind.SEMAPHORE.value
_SK_LOCK = LOCK_SK = _FIXED_SK[Kind.LOCK]
_SK_BREAKER = BREAKER_SK = _FIXED_SK[Kind.BREAKER]
_SK_CACHE = CACHE_SK = _FIXED_SK[Kind.CACHE]
_SK_IDEMPOTENCY = IDEMPOTENCY_SK = _FIXED_SK[Kind.IDEMPOTENCY]
_SK_OUTBOX = _FIXED_SK[Kind.OUTBOX]
_SK_COUNTER = COUNTER_SK = _FIXED_SK[Kind.COUNTER]
_SK_RUN = RUN_SK = _FIXED_SK[Kind.RUN]
_SK_SEMAPHORE = SEMAPHORE_SK = _FIXED_SK[Kind.SEMAPHORE]
_RATE = Kind.RATE.value
_SK_RATE = RATE_SK = _FIXED_SK[Kind.RATE]


# Records (NamedTuples to a type checker) rather than dataclasses or NamedTuples: both generate
# methods from source when defined, which every cold start pays (about 1 ms and 0.15 ms each).
class ItemKey(Record):
    """The stored key attributes of one item; ``gsi1pk``/``gsi1sk`` only for listed kinds."""

    pk: str
    sk: str
    gsi1pk: str | None = None
    gsi1sk: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The key attributes that are set, as a plain dict."""
        out = {"pk": self.pk, "sk": self.sk}
        if self.gsi1pk is not None and self.gsi1sk is not None:
            out["gsi1pk"] = self.gsi1pk
            out["gsi1sk"] = self.gsi1sk
        return out

    @property
    def primary(self) -> dict[str, str]:
        """Only ``pk`` and ``sk`` (what GetItem/DeleteItem need)."""
        return {"pk": self.pk, "sk": self.sk}


class ParsedKey(Record):
    """The result of :func:`parse_pk`."""

    kind: Kind
    namespace: str
    key: str


def _utf8_len(value: str, what: str, original: object) -> int:
    if value.isascii():  # the common case: one byte per character, nothing to encode
        return len(value)
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(
            f"{what} is not valid UTF-8 text (it contains a lone surrogate): {original!r}",
            key=original,
        ) from exc


#: namespaces already found valid: every key of every call is built in one of a few namespaces,
#: so each is checked once rather than on every key (bounded: cleared when it grows past 1024)
_VALID_NAMESPACES: set[str] = set()


def validate_namespace(namespace: Any) -> str:
    """Return ``namespace`` if it is a usable namespace, else raise :class:`InvalidKeyError`."""
    if type(namespace) is str and namespace in _VALID_NAMESPACES:
        return namespace
    if not isinstance(namespace, str):
        raise InvalidKeyError(
            f"namespace must be a str, got {type(namespace).__name__}", key=namespace
        )
    if not namespace:
        raise InvalidKeyError("namespace must not be empty", key=namespace)
    if "#" in namespace:
        raise InvalidKeyError(
            f"namespace must not contain '#' (it delimits the key schema): {namespace!r}",
            key=namespace,
        )
    if "|" in namespace:
        raise InvalidKeyError(
            f"namespace must not contain '|' (Redis key delimiter): {namespace!r}", key=namespace
        )
    if "," in namespace or any(c < " " or c == "\x7f" for c in namespace):
        # The stack's Namespaces parameter is a comma-separated list (a comma would make two
        # namespaces of one), and a control character is invisible in every listing.
        raise InvalidKeyError(
            f"namespace must not contain a comma (the stack's Namespaces is comma-separated) or "
            f"a control character such as a tab or a newline: {namespace!r}",
            key=namespace,
        )
    if any(c in namespace for c in "*?$"):
        # An IAM policy scopes a namespace with LeadingKeys patterns (KIND#{ns}#*), where these
        # are wildcards and variables: no policy could be limited to such a namespace's data.
        raise InvalidKeyError(
            f"namespace must not contain '*', '?' or '$' (IAM wildcard and policy-variable "
            f"characters: no IAM policy could be scoped to it): {namespace!r}",
            key=namespace,
        )
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise InvalidKeyError(
            f"namespace must be at most {MAX_NAMESPACE_CHARS} characters, got {len(namespace)}",
            key=namespace,
        )
    _utf8_len(namespace, "namespace", namespace)
    if type(namespace) is str:  # a str subclass may hash or compare in its own way
        if len(_VALID_NAMESPACES) >= 1024:
            _VALID_NAMESPACES.clear()
        _VALID_NAMESPACES.add(namespace)
    return namespace


def validate_key(key: Any, what: str = "key") -> str:
    """Return ``key`` if it is a non-empty, encodable str, else raise :class:`InvalidKeyError`."""
    if type(key) is str and key and key.isascii():  # the common case, nothing more to check
        return key
    if not isinstance(key, str):
        raise InvalidKeyError(f"{what} must be a str, got {type(key).__name__}", key=key)
    if not key:
        raise InvalidKeyError(f"{what} must not be empty", key=key)
    _utf8_len(key, what, key)
    return key


def _pk(prefix: str, namespace: str, key: Any, what: str) -> str:
    """``{prefix}#{namespace}#{key}`` after checking both parts (``prefix`` is a kind's value)."""
    if type(key) is str and key and type(namespace) is str and namespace in _VALID_NAMESPACES:
        pk = f"{prefix}#{namespace}#{key}"
        if pk.isascii() and len(pk) <= MAX_PARTITION_KEY_BYTES:  # the common case: valid
            return pk
    validate_namespace(namespace)
    validate_key(key, what)
    pk = f"{prefix}#{namespace}#{key}"
    size = _utf8_len(pk, what, key)
    if size > MAX_PARTITION_KEY_BYTES:
        raise InvalidKeyError(
            f"{what} is too long: the stored key {prefix}#{namespace}#... would be {size} "
            f"bytes, the limit is {MAX_PARTITION_KEY_BYTES} bytes of UTF-8",
            key=key,
        )
    return pk


def _sort_key(value: str, what: str, key: object) -> str:
    if value.isascii() and len(value) <= MAX_SORT_KEY_BYTES:  # the common case: valid
        return value
    size = _utf8_len(value, what, key)
    if size > MAX_SORT_KEY_BYTES:
        raise InvalidKeyError(
            f"{what} is too long for a sort key: {size} bytes, the limit is "
            f"{MAX_SORT_KEY_BYTES} bytes of UTF-8",
            key=key,
        )
    return value


def shard_of(key: str, shards: int) -> int:
    """A stable shard number for ``key`` in ``range(shards)`` (same in every process)."""
    if shards <= 1:
        return 0
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % shards


def lock_key(namespace: str, key: str) -> ItemKey:
    return ItemKey(lock_pk(namespace, key), _SK_LOCK)


def lock_pk(namespace: str, key: str) -> str:
    """Only the pk of :func:`lock_key` (its sk is :data:`LOCK_SK`)."""
    return _pk(_LOCK, namespace, key, "lock key")


def semaphore_key(namespace: str, name: str) -> ItemKey:
    return ItemKey(semaphore_pk(namespace, name), _SK_SEMAPHORE)


def semaphore_pk(namespace: str, name: str) -> str:
    """Only the pk of :func:`semaphore_key` (its sk is :data:`SEMAPHORE_SK`)."""
    return _pk(_SEMAPHORE, namespace, name, "semaphore name")


def rate_key(namespace: str, name: str, shard: int | None = None) -> ItemKey:
    """A rate limiter's item: ``RATE#{ns}#{name}`` / ``RATE``; shard ``i`` of a sharded one:
    ``RATE#{ns}#{name}#{i}`` (a partition of its own) / ``RATE#{i}``. No unsharded item has a
    ``RATE#`` sort key, and a shard's pk ends with the number its sk names, so two (name, shard)
    pairs never share an item whatever ``#`` the names hold."""
    pk = _pk(_RATE, namespace, name, "rate limiter name")
    if shard is None:
        return ItemKey(pk, _SK_RATE)
    return ItemKey(_shard_pk(f"{pk}#{shard}", name), f"{_SK_RATE}#{shard}")


def _shard_pk(pk: str, key: object) -> str:
    # a shard's suffix may take a pk at the limit past it
    if len(pk.encode("utf-8", "surrogatepass")) > MAX_PARTITION_KEY_BYTES:
        raise InvalidKeyError(
            f"rate limiter name is too long: the stored key would be over "
            f"{MAX_PARTITION_KEY_BYTES} bytes of UTF-8",
            key=key,
        )
    return pk


def breaker_key(namespace: str, name: str) -> ItemKey:
    return ItemKey(breaker_pk(namespace, name), _SK_BREAKER)


def breaker_pk(namespace: str, name: str) -> str:
    """Only the pk of :func:`breaker_key` (its sk is :data:`BREAKER_SK`)."""
    return _pk(_BREAKER, namespace, name, "breaker name")


def cache_index_pk(namespace: str, shard: int) -> str:
    """The gsi1 partition that lists cache keys of one shard."""
    validate_namespace(namespace)
    return f"{_CACHE}#{namespace}#{shard}"


def cache_pk(namespace: str, key: str) -> str:
    """Only the pk of a cache entry (batch reads need no index attributes)."""
    return _pk(_CACHE, namespace, key, "cache key")


def cache_sort_key(key: str) -> str:
    """The gsi1sk of a cache entry: the key itself, checked against the sort-key limit."""
    return _sort_key(key, "cache key", key)


def cache_key(namespace: str, key: str, shards: int = 1) -> ItemKey:
    pk = cache_pk(namespace, key)
    return ItemKey(
        pk,
        _SK_CACHE,
        cache_index_pk(namespace, shard_of(key, shards)),
        cache_sort_key(key),
    )


def checkpoint_prefix(namespace: str, task_id: str) -> str:
    """The pk shared by every checkpoint of one task."""
    return _pk(_CHECKPOINT, namespace, task_id, "task id")


def checkpoint_key(namespace: str, task_id: str, sequence: int) -> ItemKey:
    if type(sequence) is not int and (isinstance(sequence, bool) or not isinstance(sequence, int)):
        raise TypeError(f"sequence must be an int, got {type(sequence).__name__}")
    if not 0 <= sequence <= MAX_SEQUENCE:
        raise ValueError(f"sequence must be in 0..{MAX_SEQUENCE}, got {sequence}")
    # the width written out (SEQUENCE_WIDTH): a nested format spec is parsed on every call
    return ItemKey(checkpoint_prefix(namespace, task_id), f"SEQ#{sequence:020d}")


def parse_sk_sequence(sk: str) -> int:
    """The sequence number of a checkpoint sort key ``SEQ#000...``."""
    if not sk.startswith("SEQ#"):
        raise ValueError(f"not a checkpoint sort key: {sk!r}")
    return int(sk[4:])


def idempotency_key(namespace: str, key: str) -> ItemKey:
    return ItemKey(idempotency_pk(namespace, key), _SK_IDEMPOTENCY)


def idempotency_pk(namespace: str, key: str) -> str:
    """Only the pk of :func:`idempotency_key` (its sk is :data:`IDEMPOTENCY_SK`)."""
    return _pk(_IDEMPOTENCY, namespace, key, "idempotency key")


def outbox_index_pk(namespace: str, status: str, shard: int) -> str:
    """The gsi1 partition that lists outbox events of one status and shard."""
    validate_namespace(namespace)
    return f"{_OUTBOX}#{namespace}#{status}#{shard}"


def time_sk_bound(ms: int) -> str:
    """The bare padded time ``{ms:015d}``: as a gsi1 sort-key bound, every entry of a time at or
    after ``ms`` sorts at or above it (``{ms:015d}#{id}`` > ``{ms:015d}``)."""
    return f"{ms:0{MS_WIDTH}d}"


def outbox_index_sk(due_ms: int, event_id: str) -> str:
    """The gsi1 sort key of an outbox event: ``{due_ms:015d}#{event_id}`` (due order)."""
    return _sort_key(f"{due_ms:015d}#{event_id}", "event id", event_id)  # MS_WIDTH digits


def outbox_pk(namespace: str, event_id: str) -> str:
    """Only the pk of :func:`outbox_key` (the same for every status and due time)."""
    return _pk(_OUTBOX, namespace, event_id, "event id")


def outbox_key(
    namespace: str, event_id: str, *, status: str, due_ms: int, shards: int = 1
) -> ItemKey:
    pk = outbox_pk(namespace, event_id)
    return ItemKey(
        pk,
        _SK_OUTBOX,
        outbox_index_pk(namespace, status, shard_of(event_id, shards)),
        outbox_index_sk(due_ms, event_id),
    )


def counter_key(namespace: str, key: str) -> ItemKey:
    return ItemKey(counter_pk(namespace, key), _SK_COUNTER)


def counter_pk(namespace: str, key: str) -> str:
    """Only the pk of :func:`counter_key` (its sk is :data:`COUNTER_SK`)."""
    return _pk(_COUNTER, namespace, key, "counter key")


def run_index_pk(namespace: str, status: str) -> str:
    """The gsi1 partition that lists workflow runs of one status."""
    validate_namespace(namespace)
    return f"{_RUN}#{namespace}#{status}"


def run_index_sk(updated_ms: int, run_id: str) -> str:
    """The gsi1 sort key of a workflow run: ``{updated_ms:015d}#{run_id}`` (update order)."""
    return f"{updated_ms:015d}#{run_id}"  # time_sk_bound's form (MS_WIDTH), in one format


def run_pk(namespace: str, run_id: str) -> str:
    """Only the pk of :func:`run_key` (its sk is :data:`RUN_SK`): what a read or an update of
    one run needs."""
    return _pk(_RUN, namespace, run_id, "run id")


def run_key(namespace: str, run_id: str, *, status: str, updated_ms: int) -> ItemKey:
    pk = run_pk(namespace, run_id)
    return ItemKey(
        pk,
        _SK_RUN,
        run_index_pk(namespace, status),
        _sort_key(run_index_sk(updated_ms, run_id), "run id", run_id),
    )


def parse_pk(pk: str) -> ParsedKey:
    """Split a stored ``pk`` back into (kind, namespace, key). Inverse of every builder above."""
    kind_part, sep1, rest = pk.partition("#")
    namespace, sep2, key = rest.partition("#")
    if not sep1 or not sep2 or not namespace or not key:
        raise InvalidKeyError(f"not a dynacoord partition key: {pk!r}", key=pk)
    try:
        kind = Kind(kind_part)
    except ValueError as exc:
        raise InvalidKeyError(f"unknown item kind {kind_part!r} in {pk!r}", key=pk) from exc
    return ParsedKey(kind, namespace, key)
