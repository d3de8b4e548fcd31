"""The workflow-run store on Redis.

Item: hash ``{RUN#{ns}#{shard}}|RUN#{ns}#{run_id}`` (``shard`` = a stable hash of the run id
modulo ``SHARDS``) with ``run_id``, ``status``, ``created_ms``, ``updated_ms``,
``end_ttl_ms``, ``reconciles``, ``gsi1sk``, one field ``c:{name}`` per context field (codec text),
and once ended ``ended_ms``, ``result`` or ``error`` and ``expires_at_ms`` (``PEXPIRE`` removes it
a grace period later). A running run has no expiry.
Index: one sorted set per status and shard, ``{RUN#{ns}#{shard}}|idx|RUN#{ns}#{status}`` (the
gsi1pk under the run's shard tag: a run and every status index it moves between share a slot,
while the runs of a namespace spread over the cluster), holding the DynamoDB ``gsi1sk`` strings (``{updated_ms:015d}#{run_id}``) with score 0, so "updated before T, oldest first" is one
``ZRANGEBYLEX`` exactly like the Query on gsi1. Every write moves the run's index entry in the same
script as the item change, so the index always lists a run under its current status and update
time; a page drops entries whose item Redis has already removed. Runs by status read every
shard (one script per shard, pipelined) and merge them: ``gsi1sk`` strings are unique and
ordered across shards, so the merged page and its cursor are those of one index.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ... import codec
from ..._items import is_live
from ...errors import RunExistsError
from ...keys import Kind, run_index_pk, run_index_sk, run_key, shard_of, time_sk_bound
from ...runs import Run, RunPage, RunStatus, new_run_fields, write_refused
from ._conn import (
    LUA_LIVE,
    LUA_REPLY,
    SHARDS,
    RedisConn,
    as_str,
    hash_fields,
    index_key,
    item_key,
    pairs,
    request_token,
    shard_tag,
)

__all__ = ["RedisRunStore"]

_HEAD = (
    LUA_REPLY
    + LUA_LIVE
    + """
local now = tonumber(ARGV[1])
local function unindex()
  local st = redis.call('HGET', KEYS[1], 'status')
  local gsk = redis.call('HGET', KEYS[1], 'gsi1sk')
  if st and gsk then redis.call('ZREM', ARGV[2] .. st, gsk) end
end
"""
)

# KEYS[1]=run; ARGV: now, index prefix "idx|RUN#{ns}#", gsi1sk, then field/value pairs
_CREATE = (
    _HEAD
    + """
if live(KEYS[1], now) then
  -- written by this very request (a retry after a lost reply): ours
  if redis.call('HGET', KEYS[1], 'req') == ARGV[5] then return {1} end
  return {0}
end
unindex()
redis.call('DEL', KEYS[1])
for i = 4, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
redis.call('ZADD', ARGV[2] .. 'running', 0, ARGV[3])
return {1}
"""
)

# KEYS[1]=run; ARGV: now, index prefix, new gsi1sk, reconciled 0/1, n set, then n set pairs,
# then the fields to remove
_UPDATE = (
    _HEAD
    + """
-- the last set pair is ('req', token): a retry of this very update (its reply lost) is done
if redis.call('HGET', KEYS[1], 'req') == ARGV[5 + 2 * tonumber(ARGV[5])] then return reply(1) end
if not live(KEYS[1], now) or redis.call('HGET', KEYS[1], 'status') ~= 'running' then return reply(0) end
unindex()
local nset = tonumber(ARGV[5])
for i = 6, 5 + 2 * nset, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
for i = 6 + 2 * nset, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
end
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[1], 'reconciles', 1) end
redis.call('HSET', KEYS[1], 'updated_ms', ARGV[1], 'gsi1sk', ARGV[3])
redis.call('ZADD', ARGV[2] .. 'running', 0, ARGV[3])
return reply(1)
"""
)

# KEYS[1]=run; ARGV: now, index prefix, new gsi1sk, status, outcome field, outcome value, grace ms
_FINISH = (
    _HEAD
    + """
-- ARGV[8] = request token: a retry of this very finish (its reply lost) is done
if redis.call('HGET', KEYS[1], 'req') == ARGV[8] then return reply(1) end
if not live(KEYS[1], now) or redis.call('HGET', KEYS[1], 'status') ~= 'running' then return reply(0) end
unindex()
local ttl = tonumber(redis.call('HGET', KEYS[1], 'end_ttl_ms') or '0')
local expires = now + ttl
redis.call('HSET', KEYS[1], 'status', ARGV[4], 'updated_ms', ARGV[1], 'ended_ms', ARGV[1],
           'gsi1sk', ARGV[3], 'expires_at_ms', string.format('%d', expires), ARGV[5], ARGV[6],
           'req', ARGV[8])
redis.call('PEXPIRE', KEYS[1], ttl + tonumber(ARGV[7]))
redis.call('ZADD', ARGV[2] .. ARGV[4], 0, ARGV[3])
return reply(1)
"""
)

# KEYS[1]=index; ARGV: min, max, count, item prefix "RUN#{ns}#"
_QUERY = """
local members = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[1], ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, m in ipairs(members) do
  local run_id = string.sub(m, 17)
  local fields = redis.call('HGETALL', ARGV[4] .. run_id)
  if #fields == 0 then
    redis.call('ZREM', KEYS[1], m)
  end
  table.insert(out, m)
  table.insert(out, fields)
end
return out
"""


def _run(fields: Mapping[str, str]) -> Run:
    return Run.from_item(fields, {k[2:]: v for k, v in fields.items() if k.startswith("c:")})


class RedisRunStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace
        # "idx|RUN#{ns}#" + status is the index of that status
        self._tags = [shard_tag(Kind.RUN, namespace, shard) for shard in range(SHARDS)]

    def _tag(self, run_id: str) -> str:
        return self._tags[shard_of(run_id, SHARDS)]

    def _index_prefix(self, tag: str) -> str:
        """``{tag}|idx|RUN#{ns}#``: + status is that status's index in the shard ``tag``."""
        return index_key(run_index_pk(self._ns, ""), tag=tag)

    def _key(self, run_id: str) -> str:
        pk = run_key(self._ns, run_id, status="running", updated_ms=0).pk
        return item_key(pk, tag=self._tag(run_id))

    def create(
        self, run_id: str, context: Mapping[str, Any], ttl_after_end_ms: int, now_ms: int
    ) -> Run:
        key = run_key(self._ns, run_id, status=RunStatus.RUNNING.value, updated_ms=now_ms)
        ctx = {name: codec.encode(value) for name, value in context.items()}
        # Same size limit as the DynamoDB item, so a run fits every backend.
        codec.check_item_size({**key.as_dict(), "run_id": run_id, "ctx": ctx}, key=run_id)
        fields = {**new_run_fields(run_id, ttl_after_end_ms, now_ms), "gsi1sk": key.gsi1sk}
        fields.update({f"c:{name}": text for name, text in ctx.items()})
        index_prefix = self._index_prefix(self._tag(run_id))
        args: list[Any] = [now_ms, index_prefix, key.gsi1sk, "req", request_token()]
        for name, value in fields.items():
            args.extend([name, value])
        reply = self._conn.run(_CREATE, [self._key(run_id)], args, "run start")
        if int(reply[0]) != 1:
            raise RunExistsError(f"run {run_id!r} already exists", run_id=run_id)
        return _run({k: str(v) for k, v in fields.items()})

    def get(self, run_id: str, now_ms: int) -> Run | None:
        raw = self._conn.call("run get", "hgetall", self._key(run_id))
        fields = hash_fields(raw)
        return _run(fields) if is_live(fields, now_ms) else None

    def update(
        self,
        run_id: str,
        now_ms: int,
        *,
        set_fields: Mapping[str, Any] | None = None,
        remove_fields: Sequence[str] = (),
        reconciled: bool = False,
    ) -> Run:
        sets = set_fields or {}
        args: list[Any] = [
            now_ms,
            self._index_prefix(self._tag(run_id)),
            run_index_sk(now_ms, run_id),
            int(reconciled),
            len(sets) + 1,
        ]
        for name, value in sets.items():
            args.extend([f"c:{name}", codec.encode(value)])
        args.extend(["req", request_token()])  # last set pair: the request token
        args.extend(f"c:{name}" for name in remove_fields)
        reply = self._conn.run(_UPDATE, [self._key(run_id)], args, "run update")
        fields = pairs(list(reply[1:]))
        if int(reply[0]) != 1:
            raise write_refused(run_id, fields, now_ms)
        return _run(fields)

    def finish(
        self,
        run_id: str,
        status: RunStatus,
        now_ms: int,
        *,
        result: Any = None,
        error: str | None = None,
    ) -> Run:
        if status is RunStatus.COMPLETED:
            outcome = ["result", codec.encode(result)]
        else:
            outcome = ["error", error or ""]
        reply = self._conn.run(
            _FINISH,
            [self._key(run_id)],
            [
                now_ms,
                self._index_prefix(self._tag(run_id)),
                run_index_sk(now_ms, run_id),
                status.value,
                *outcome,
                self._conn.gc_grace_ms,
                request_token(),
            ],
            "run finish",
        )
        fields = pairs(list(reply[1:]))
        if int(reply[0]) != 1:
            raise write_refused(run_id, fields, now_ms)
        return _run(fields)

    def query(
        self, status: RunStatus, before_ms: int | None, page_size: int, cursor: Any, now_ms: int
    ) -> RunPage:
        low = "-" if cursor is None else f"({cursor}"
        # Every run updated at before_ms or later sorts at or above the bare padded number.
        high = "+" if before_ms is None else "(" + time_sk_bound(max(before_ms, 0))
        item_pk_prefix = run_key(self._ns, "x", status="running", updated_ms=0).pk[:-1]
        replies = self._conn.run_each(
            _QUERY,
            [
                (
                    [self._index_prefix(tag) + status.value],
                    [low, high, page_size + 1, item_key(item_pk_prefix, tag=tag)],
                )
                for tag in self._tags
            ],
            "run query",
        )
        # Each shard gave its first page_size + 1 entries past the cursor; the first
        # page_size + 1 of all shards are among them (entries are unique, in one byte order).
        rows = [
            (as_str(reply[i]) or "", reply[i + 1])
            for reply in replies
            for i in range(0, len(reply), 2)
        ]
        rows.sort(key=lambda row: row[0].encode("utf-8", "surrogatepass"))
        more = len(rows) > page_size
        rows = rows[:page_size]
        runs = []
        for _member, flat in rows:
            fields = pairs(list(flat))
            if is_live(fields, now_ms) and fields.get("status") == status.value:
                runs.append(_run(fields))
        return RunPage(runs, rows[-1][0] if more else None)
