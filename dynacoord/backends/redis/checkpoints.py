"""The checkpoint store on Redis.

Item: hash ``{CHECKPOINT#{ns}#{task_id}}|SEQ#{sequence:020d}`` (a task's checkpoints and its
index share the hash tag, so one slot) with ``data`` (codec text),
``progress`` (optional), ``created_ms`` and, with a TTL, ``expires_at_ms``.
Index: sorted set ``{CHECKPOINT#{ns}#{task_id}}|idx`` of the ``SEQ#...`` sort keys, all with score
0, so lexicographic order (``ZRANGEBYLEX``) is numeric order: sequences go up to 20 digits, more
than a float score can hold exactly. The index never expires before its longest-lived member
(it has no expiry while it holds a checkpoint without TTL). If Redis removed an item but its index
entry remains, a page reports it as expired and cleanup removes the entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...checkpoints import DELETE_BATCH, CheckpointPage, StoredCheckpoint
from ...keys import checkpoint_key, checkpoint_prefix, parse_sk_sequence
from ._conn import RedisConn, as_int, as_str, index_key, item_key, request_token

__all__ = ["RedisCheckpointStore"]

# KEYS[1]=item, KEYS[2]=index; ARGV: now, sk, data, progress|'', created, expires|'', gc ms|''
_INSERT = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local exp = redis.call('HGET', KEYS[1], 'expires_at_ms')
  if not exp or tonumber(exp) > tonumber(ARGV[1]) then
    -- written by this very request (a retry after a lost reply): ours
    if redis.call('HGET', KEYS[1], 'req') == ARGV[8] then return 1 end
    return 0
  end
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'created_ms', ARGV[5], 'req', ARGV[8])
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'progress', ARGV[4])
end
local index_pttl = redis.call('PTTL', KEYS[2])
redis.call('ZADD', KEYS[2], 0, ARGV[2])
if ARGV[6] == '' then
  redis.call('PERSIST', KEYS[2])
else
  redis.call('HSET', KEYS[1], 'expires_at_ms', ARGV[6])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
  if index_pttl == -2 or (index_pttl >= 0 and index_pttl < tonumber(ARGV[7])) then
    redis.call('PEXPIRE', KEYS[2], ARGV[7])
  end
end
return 1
"""

# KEYS[1]=index; ARGV: item prefix "{pk}|", newest first 0/1, count, cursor|'', keys only 0/1
_PAGE = """
local members
if ARGV[2] == '1' then
  local top = '+'
  if ARGV[4] ~= '' then top = '(' .. ARGV[4] end
  members = redis.call('ZREVRANGEBYLEX', KEYS[1], top, '-', 'LIMIT', 0, tonumber(ARGV[3]))
else
  local bottom = '-'
  if ARGV[4] ~= '' then bottom = '(' .. ARGV[4] end
  members = redis.call('ZRANGEBYLEX', KEYS[1], bottom, '+', 'LIMIT', 0, tonumber(ARGV[3]))
end
local out = {}
for _, sk in ipairs(members) do
  local f
  if ARGV[5] == '1' then
    f = redis.call('HMGET', ARGV[1] .. sk, 'created_ms', 'expires_at_ms')
    table.insert(out, sk); table.insert(out, false); table.insert(out, false)
  else
    f = redis.call('HMGET', ARGV[1] .. sk, 'created_ms', 'expires_at_ms', 'data', 'progress')
    table.insert(out, sk); table.insert(out, f[3]); table.insert(out, f[4])
  end
  table.insert(out, f[1]); table.insert(out, f[2])
end
return out
"""


class RedisCheckpointStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace

    def _index(self, task_id: str) -> str:
        return index_key(checkpoint_prefix(self._ns, task_id))

    def insert(self, checkpoint: StoredCheckpoint, now_ms: int) -> bool:
        k = checkpoint_key(self._ns, checkpoint.task_id, checkpoint.sequence)
        expires = checkpoint.expires_at_ms
        ok = self._conn.run(
            _INSERT,
            [item_key(k.pk, k.sk), self._index(checkpoint.task_id)],
            [
                now_ms,
                k.sk,
                checkpoint.data_text or "",
                "" if checkpoint.progress is None else repr(float(checkpoint.progress)),
                checkpoint.created_ms,
                "" if expires is None else expires,
                "" if expires is None else self._conn.gc_ms(expires, now_ms),
                request_token(),
            ],
            "checkpoint insert",
        )
        return as_int(ok) == 1

    def highest_sequence(self, task_id: str) -> int | None:
        top = self._conn.call(
            "checkpoint highest_sequence",
            "zrevrangebylex",
            self._index(task_id),
            "+",
            "-",
            start=0,
            num=1,
        )
        return parse_sk_sequence(as_str(top[0]) or "") if top else None

    def get(self, task_id: str, sequence: int) -> StoredCheckpoint | None:
        k = checkpoint_key(self._ns, task_id, sequence)
        created, expires, data, progress = self._conn.call(
            "checkpoint get",
            "hmget",
            item_key(k.pk, k.sk),
            ["created_ms", "expires_at_ms", "data", "progress"],
        )
        if created is None:
            return None
        return self._stored(task_id, k.sk, data, progress, created, expires)

    @staticmethod
    def _stored(
        task_id: str, sk: str, data: Any, progress: Any, created: Any, expires: Any
    ) -> StoredCheckpoint:
        fields = {
            "sk": sk,
            "data": as_str(data),
            "progress": as_str(progress),
            "created_ms": as_str(created),
            # An index entry whose item Redis already removed reads as long expired.
            "expires_at_ms": "0" if created is None else as_str(expires),
        }
        return StoredCheckpoint.from_item(task_id, fields)

    def page(
        self,
        task_id: str,
        *,
        newest_first: bool,
        limit: int,
        cursor: Any | None,
        keys_only: bool = False,
    ) -> CheckpointPage:
        prefix = item_key(checkpoint_prefix(self._ns, task_id)) + "|"  # "{pk}|", then the sk
        # One more than asked: it tells whether a next page exists without another request.
        reply = self._conn.run(
            _PAGE,
            [self._index(task_id)],
            [prefix, int(newest_first), limit + 1, cursor or "", int(keys_only)],
            "checkpoint page",
        )
        rows = [reply[i : i + 5] for i in range(0, len(reply), 5)]
        items = [
            self._stored(task_id, as_str(sk) or "", data, progress, created, expires)
            for sk, data, progress, created, expires in rows[:limit]
        ]
        more = len(rows) > limit
        next_cursor = f"SEQ#{items[-1].sequence:020d}" if more and items else None
        return CheckpointPage(items, next_cursor)

    def delete_batch(self, task_id: str, sequences: Sequence[int]) -> list[int]:
        if not sequences:
            return []
        if len(sequences) > DELETE_BATCH:
            raise ValueError(f"at most {DELETE_BATCH} deletes per batch, got {len(sequences)}")
        sks = [checkpoint_key(self._ns, task_id, seq).sk for seq in sequences]
        pk = checkpoint_prefix(self._ns, task_id)
        self._conn.pipeline(
            "checkpoint delete_batch",
            [("delete", *[item_key(pk, sk) for sk in sks]), ("zrem", self._index(task_id), *sks)],
            transaction=True,
        )
        return []
