"""The door of the Redis stores, :class:`RedisConn`: the only holder of the client, whose
:meth:`RedisConn.send` is the one request path (the request, metrics, error translation); and
what the stores share: the key names and pieces of Lua.

Key layout (docs/redis.md has the full table). Names come from :mod:`dynacoord.keys` (DESIGN.md
section 2) wrapped in a Redis Cluster **hash tag** ``{...}``: Redis hashes only the text between
the first ``{`` and the next ``}``, so every key a script touches together gets the same tag and
lives in the same slot, on a single primary and on a cluster alike (one layout for both).

* A single-item kind is a hash named ``{pk}`` (``{LOCK#ns#key}``); a counting item's recent
  request tokens are ``{pk}|rq`` beside it.
* A checkpoint is ``{pk}|{sk}`` and its task's index ``{pk}|idx``: a task's checkpoints share
  one slot, different tasks spread.
* Listed kinds that DynamoDB indexes in gsi1 (cache entries, outbox events, workflow runs) are
  filed under a **shard tag**: ``{tag}|{pk}`` for the item, ``{tag}|rq|{pk}`` for its tokens and
  ``{tag}|idx`` / ``{tag}|idx|{gsi1pk}`` for the sorted sets that play gsi1. A script moves an
  item between status indexes of its own shard only, so item and indexes share a slot, while
  the shards of a namespace spread over the cluster. Listing reads every shard (one command per
  shard).

Why names never collide: a tag never contains ``|`` (a namespace cannot), so in a tagged name the
first ``|`` ends the tag and the rest starts with a kind (``CACHE#``...), ``rq|`` or ``idx``;
untagged names end with a fixed suffix (``}``, ``}|rq``, ``}|idx``, ``}|SEQ#`` + 20 digits). A user
key may contain braces: the Redis tag is then cut at its first ``}``, which changes only the slot,
never which keys share it (every name of an item starts with the same ``{`` + text).

Every field value is a string; numbers are written as decimal strings computed in Python (never by
Lua ``tostring``, which rounds above 14 digits).

Expiry: the truth is the ``expires_at_ms`` field compared with the caller's ``now_ms``, exactly
as on DynamoDB. ``PEXPIRE`` is only garbage collection: it is set *relative* (remaining lifetime
plus a grace period), so it works with any injected clock and never removes an item before the
caller's clock says it expired.

Compare-and-set operations are Lua scripts (run atomically by the server), never a read followed
by a separate write. Scripts that read items named in an index build those names from a prefix
passed in ARGV; the prefix carries the index's own tag, so the items are in the script's slot.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..._writers import DEFAULT_WINDOW_MS, PRUNE_AT, Slot, lease, release
from ...errors import BackendError
from ...keys import Kind, validate_namespace
from ...metrics import Metrics, measure_request

__all__ = [
    "LUA_LIVE",
    "LUA_REPLY",
    "LUA_TOKENS",
    "SHARDS",
    "RedisConn",
    "as_int",
    "as_str",
    "counting_token",
    "hash_fields",
    "index_key",
    "is_cluster",
    "item_key",
    "pairs",
    "request_token",
    "shard_tag",
    "shard_tokens_key",
    "tokens_key",
]

logger = logging.getLogger("dynacoord.backends.redis")


#: Counting scripts keep one slot per call in flight in a hash beside the item (``{item}|rq``,
#: slot -> its last token; dynacoord._writers): a retried script whose slot holds its token
#: knows its first run applied and does not count again. Past PRUNE_AT slots, the script drops
#: the slots whose token's time has passed (in the same atomic script: no slot leased and
#: written since can be lost). redis-py's retry settings are not read: a call's tokens hold for
#: COUNT_WINDOW_MS (ten minutes) after it starts, and the hash expires two windows after its
#: last write.
COUNT_WINDOW_MS = DEFAULT_WINDOW_MS

#: Lua ``seen(rq, token)``, ``remember(rq, token, now)`` and ``prune(rq, now)`` (past PRUNE_AT
#: slots, drop the stale ones) for counting scripts; ``token`` is
#: ``{slot}:{token}`` (:func:`counting_token`). A token of 18 digits or more was made as
#: ``ms * 10**6`` and holds for 60 s (hashes on a server may still carry one: it must turn
#: stale like the others), otherwise it is ``until_ms * 10``.
LUA_TOKENS = f"""
local function slot(token)
  local i = string.find(token, ':', 1, true)
  return string.sub(token, 1, i - 1), string.sub(token, i + 1)
end
local function seen(rq, token)
  -- a sorted set under this name holds tokens in a form HGET cannot read: drop it, or every
  -- counting write on this key would fail with WRONGTYPE
  if redis.call('TYPE', rq).ok == 'zset' then redis.call('DEL', rq) end
  local w, t = slot(token)
  return redis.call('HGET', rq, w) == t
end
local function stale(v, now)
  if #v >= 18 then return tonumber(string.sub(v, 1, -7)) + 60000 < now end
  return tonumber(string.sub(v, 1, -2)) < now
end
local function prune(rq, now)
  if redis.call('HLEN', rq) > {PRUNE_AT} then
    local all = redis.call('HGETALL', rq)
    local at = tonumber(now)
    for i = 1, #all, 2 do
      if stale(all[i + 1], at) then redis.call('HDEL', rq, all[i]) end
    end
  end
end
local function remember(rq, token, now)
  local w, t = slot(token)
  redis.call('HSET', rq, w, t)
  prune(rq, now)
  redis.call('PEXPIRE', rq, {2 * DEFAULT_WINDOW_MS})
end
"""


class CountingArg(str):
    """The ``{slot}:{token}`` argument of one counting script, holding its leased slot:
    :meth:`RedisConn.run` gives the slot back when the script's call (redis-py's retries
    included) has returned."""

    __slots__ = ("slot",)
    slot: Slot


def counting_token(now_ms: int) -> CountingArg:
    """The ``{slot}:{token}`` of one counting script (see LUA_TOKENS), its slot leased from
    this process's pool until :meth:`RedisConn.run` returns."""
    slot, token = lease(now_ms, COUNT_WINDOW_MS)
    arg = CountingArg(f"{slot.name}:{token}")
    arg.slot = slot
    return arg


def tokens_key(item: str) -> str:
    """The writer slots (a hash) of the counting item named ``item`` (an untagged
    ``{pk}`` name: the set ``{pk}|rq`` has the same tag, so the same slot)."""
    return f"{item}|rq"


def shard_tokens_key(tag: str, pk: str) -> str:
    """The request tokens of the counting item ``pk`` filed under the shard tag ``tag``."""
    return f"{{{tag}}}|rq|{pk}"


def request_token() -> str:
    """A fresh per-call request token (64 random bits), stored in the ``req`` field of the item
    a script creates: a retried script that finds it knows its first run applied."""
    return secrets.token_hex(8)


#: Lua ``live(key, now)``: the hash exists and has no ``expires_at_ms`` or one after ``now``.
LUA_LIVE = """
local function live(key, now)
  if redis.call('EXISTS', key) == 0 then return false end
  local exp = redis.call('HGET', key, 'expires_at_ms')
  return (not exp) or tonumber(exp) > tonumber(now)
end
"""

#: Lua ``reply(flag)``: ``{flag, field, value, ...}`` with every field of the hash ``KEYS[1]``
#: (read back with :func:`pairs`). Scripts start with it.
LUA_REPLY = """
local function reply(flag)
  local out = {flag}
  for _, v in ipairs(redis.call('HGETALL', KEYS[1])) do table.insert(out, v) end
  return out
end
"""


def as_str(value: Any) -> str | None:
    """A reply value as str (clients may or may not use ``decode_responses``)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogatepass")
    return str(value)


def as_int(value: Any, default: int = 0) -> int:
    """A reply value (bytes, str, int or None) as int."""
    if value is None:
        return default
    if isinstance(value, bytes):
        return int(value.decode("ascii"))
    return int(value)


def pairs(flat: Sequence[Any]) -> dict[str, str]:
    """A flat ``[field, value, field, value, ...]`` reply (``HGETALL`` in a script) as a dict."""
    return {as_str(flat[i]) or "": as_str(flat[i + 1]) or "" for i in range(0, len(flat) - 1, 2)}


def hash_fields(raw: Mapping[Any, Any]) -> dict[str, str]:
    """An ``HGETALL`` reply of the client (bytes or str keys and values) as a dict of str."""
    return {as_str(k) or "": as_str(v) or "" for k, v in raw.items()}


#: Shards of the listed kinds that spread over a cluster (cache entries, workflow runs): the
#: items of one namespace are filed under this many shard tags, so over up to this many slots
#: (and nodes). It is part of the key layout: another value would look for every cache entry and
#: run under another name. The outbox keeps one shard per namespace (see outbox.py: a
#: multi-event publish is one atomic script, so its events must share a slot).
SHARDS = 8


def shard_tag(kind: Kind, namespace: str, shard: int) -> str:
    """The shard tag ``{kind}#{ns}#{shard}`` (for the cache the same string as its gsi1pk)."""
    validate_namespace(namespace)
    return f"{kind.value}#{namespace}#{shard}"


def item_key(pk: str, sk: str | None = None, *, tag: str | None = None) -> str:
    """The Redis key of an item: ``{pk}``, ``{pk}|{sk}``, or ``{tag}|{pk}`` under a shard tag."""
    if tag is not None:
        return f"{{{tag}}}|{pk}"
    return f"{{{pk}}}" if sk is None else f"{{{pk}}}|{sk}"


def index_key(name: str, *, tag: str | None = None) -> str:
    """The sorted set that plays the part of gsi1 partition ``name`` (or lists a task's
    checkpoints, ``name`` = their pk): ``{name}|idx``, or ``{tag}|idx|{name}`` under a shard tag
    (the outbox and run status indexes: every status of a shard in the shard's slot)."""
    if tag is not None:
        return f"{{{tag}}}|idx|{name}"
    return f"{{{name}}}|idx"


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a ``redis.cluster.RedisCluster`` (detected, never configured)."""
    try:
        from redis.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis-py without cluster support
        return False
    return isinstance(client, RedisCluster)


def _translated(exc: Exception, what: str) -> BackendError:
    return BackendError(f"Redis {type(exc).__name__} during {what}: {exc}", code=type(exc).__name__)


#: Operation names reported by metrics that are not the method's name in capitals
_OPERATIONS = {"delete": "DEL"}


class RedisConn:
    """The door of every Redis store: the only holder of the client (and of the scripts it
    registered). Stores send each request through one of its methods, never the client:

    * :meth:`call`: one command (``HMGET``, ``HGETALL``, ``DEL``...);
    * :meth:`run`: one Lua script (``EVALSHA``, falling back to ``EVAL`` once per server);
    * :meth:`pipeline`: commands queued on one pipeline (``MULTI``/``EXEC`` when
      ``transaction``), one round trip;
    * :meth:`run_each`: one script per shard, one pipeline (per node on a cluster).

    Each goes through :meth:`send`, the one request path (error translation, metrics).
    """

    def __init__(
        self, client: Any, *, gc_grace_ms: int = 60_000, metrics: Metrics | None = None
    ) -> None:
        self.client = client
        # None: nothing is measured, the request path adds no clock read
        self._metrics = metrics if metrics is not None and metrics.enabled else None
        self.gc_grace_ms = gc_grace_ms
        self.cluster = is_cluster(client)
        self._scripts: dict[str, Any] = {}
        import redis

        self._error: type[Exception] = redis.RedisError

    def send(
        self, what: str, operation: str, request: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """The request path of the Redis backend: every request of every store, in this order.

        1. The request: ``request(*args, **kwargs)``, one round trip. Retries are redis-py's
           own (the client's ``Retry``, if it was built with one); dynacoord adds none, so a
           write whose response was lost may run twice: every script recognises its own
           applied write (``req`` tokens, counting slots: see the module docstring).
        2. Metrics, when the backend has a listener: ``StoreRequestLatency`` with dimensions
           ``Backend=redis`` and ``Operation`` (``HMGET``, ``EVALSHA``, ``PIPELINE``...), and
           ``StoreRequestErrors`` for a request that raised.
        3. Errors: a ``redis.RedisError`` becomes :class:`~dynacoord.errors.BackendError`
           naming ``what`` (the store call: ``"lock acquire"``), the cause chained.
        """
        try:
            metrics = self._metrics
            if metrics is None:
                return request(*args, **kwargs)
            dimensions = {"Backend": "redis", "Operation": operation}
            start = time.perf_counter()
            try:
                result = request(*args, **kwargs)
            except Exception:
                measure_request(metrics, dimensions, start, failed=True)
                raise
            measure_request(metrics, dimensions, start)
            return result
        except self._error as exc:
            raise _translated(exc, what) from exc

    def call(self, what: str, command: str, /, *args: Any, **kwargs: Any) -> Any:
        """One command: ``client.<command>(*args, **kwargs)`` through :meth:`send`."""
        operation = _OPERATIONS.get(command) or command.upper()
        return self.send(what, operation, getattr(self.client, command), *args, **kwargs)

    def pipeline(
        self, what: str, commands: Sequence[tuple[Any, ...]], *, transaction: bool
    ) -> list[Any]:
        """``(command, *args)`` tuples queued on one pipeline, sent in one round trip
        (``MULTI``/``EXEC``: atomic, when ``transaction``); the replies in order."""
        pipe = self.client.pipeline(transaction=transaction)
        for command, *args in commands:
            getattr(pipe, command)(*args)
        return list(self.send(what, "PIPELINE", pipe.execute))

    def script(self, source: str) -> Any:
        """A registered Lua script (EVALSHA, falling back to EVAL once per server)."""
        found = self._scripts.get(source)
        if found is None:
            found = self.client.register_script(source)
            self._scripts[source] = found
        return found

    def run(self, source: str, keys: list[str], args: list[Any], what: str) -> Any:
        """Run a Lua script: one round trip, atomic on the server. A counting script's slot
        (a :class:`CountingArg` among ``args``) is given back when the call returns."""
        try:
            return self.send(
                what, "EVALSHA", self.script(source), keys=keys, args=[_arg(a) for a in args]
            )
        finally:
            for arg in args:
                if type(arg) is CountingArg:
                    release(arg.slot)

    def run_each(
        self, source: str, calls: Sequence[tuple[list[str], list[Any]]], what: str
    ) -> list[Any]:
        """Run one script once per ``(keys, args)`` (one call per shard), replies in order.

        A single primary gets one pipeline (one round trip). redis-py refuses scripts in a
        cluster pipeline, so on a cluster the calls are grouped by the node that serves their
        slot and each group is one pipeline on that node's own connection; a call the node
        answers with a redirection (MOVED/ASK while slots move) or a node that fails is sent
        again through the cluster client, which follows the redirection. Either way it is one
        request for :meth:`send` (``PIPELINE``).
        """
        if not calls:
            return []
        script = self.script(source)
        if not self.cluster:
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                script(keys=keys, args=[_arg(a) for a in args], client=pipe)
            return list(self.send(what, "PIPELINE", pipe.execute))
        replies: list[Any] = self.send(what, "PIPELINE", self._run_each_on_nodes, script, calls)
        return replies

    def _run_each_on_nodes(
        self, script: Any, calls: Sequence[tuple[list[str], list[Any]]]
    ) -> list[Any]:
        import redis

        replies: list[Any] = [None] * len(calls)
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, (keys, _args) in enumerate(calls):
            node = self.client.get_node_from_key(keys[0])
            groups.setdefault(node.name, (node, []))[1].append(i)
        again: list[int] = []
        for node, indexes in groups.values():
            connection = getattr(node, "redis_connection", None)
            if connection is None:
                again.extend(indexes)
                continue
            pipe = connection.pipeline(transaction=False)
            for i in indexes:
                keys, args = calls[i]
                script(keys=keys, args=[_arg(a) for a in args], client=pipe)
            try:
                results = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError):
                again.extend(indexes)
                continue
            for i, result in zip(indexes, results, strict=True):
                if isinstance(result, redis.exceptions.ResponseError) and _redirected(result):
                    again.append(i)
                elif isinstance(result, Exception):
                    raise result
                else:
                    replies[i] = result
        for i in again:
            keys, args = calls[i]
            replies[i] = script(keys=keys, args=[_arg(a) for a in args])
        return replies

    def gc_ms(self, expires_at_ms: int, now_ms: int, grace_ms: int | None = None) -> int:
        """Relative PEXPIRE for an item that logically expires at ``expires_at_ms``."""
        grace = self.gc_grace_ms if grace_ms is None else grace_ms
        return max(0, expires_at_ms - now_ms) + grace


def _redirected(error: Exception) -> bool:
    # A node that no longer (or not yet) serves the slot: the cluster client follows it.
    text = str(error)
    return text.startswith(("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")) or type(error).__name__ in (
        "MovedError",
        "AskError",
        "TryAgainError",
        "ClusterDownError",
    )


def _arg(value: Any) -> Any:
    # Numbers go over the wire as exact decimal strings (Lua would round big doubles).
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return value
