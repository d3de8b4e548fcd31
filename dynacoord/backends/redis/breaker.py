"""The circuit-breaker store on Redis.

Item: hash ``{CB#{ns}#{name}}`` (the pk in a hash tag) with ``state``, ``failures``,
``successes``, ``opened_at_ms``, ``trial_round``, ``trial_calls``, ``trial_started_ms``,
``updated_ms``, ``req`` (the request token of the last transition: trip, reset, start_trial,
close, reopen) and ``req_from`` (the state the last trip or reset found, ``closed`` when the hash
was absent); no expiry (the state must outlive every process). Absent means closed with no
failures; ``reset`` closes the hash in place (never deletes it) so that ``trial_round`` never
goes back. Beside it, ``{CB#{ns}#{name}}|rq`` (the same hash tag, so the same slot) holds the
recent request tokens of the counting writes: record_failure, join_trial, trial_success,
add_window. The failure-rate policy's window lives in the same hash: ``wgen`` (its generation,
one more at every trip and reset) and ``c:{gen}:{bucket}``/``f:{gen}:{bucket}`` (calls and
failures of one bucket); a window write drops, in the same script, every pair of another
generation or of a bucket that aged out.

Lost responses (docs/guarantees.md): the client retries a script whose reply was lost after it
ran. A transition that finds its own token in ``req``, or a counting write that finds its own in
``|rq``, is that retry: it writes nothing and answers what the first run answered (a trip or
reset: the record with the state it found, ``req_from``).

Every method is one Lua script that checks the state it leaves and writes in the same atomic
step (the conditions are those of the DynamoDB store), so of several processes racing for a
transition exactly one makes it, and counters use ``HINCRBY``, never read-modify-write.
Scripts reply ``{ok, field, value, ...}``: the flag, then the hash (after the write, or before
it where the protocol asks for the old record).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...breaker import (
    BreakerRecord,
    BreakerWindow,
    StartTrialResult,
    WindowWrite,
    window_from_fields,
)
from ...keys import breaker_key
from ._conn import (
    COUNT_WINDOW_MS,
    LUA_REPLY,
    LUA_TOKENS,
    RedisConn,
    as_int,
    counting_token,
    hash_fields,
    item_key,
    pairs,
    request_token,
    tokens_key,
)

__all__ = ["RedisBreakerStore"]

_HEAD = (
    LUA_REPLY
    + """
local function num(field)
  local v = redis.call('HGET', KEYS[1], field)
  if v then return tonumber(v) end
  return nil
end
local st = redis.call('HGET', KEYS[1], 'state')
-- the last transition was this call's (ARGV[i] its token): a retry whose first run applied
local function ours(i)
  return redis.call('HGET', KEYS[1], 'req') == ARGV[i]
end
-- the reply the first run of a trip or reset gave: the record, in the state it found and the
-- window generation before the one it started
local function as_found()
  local out = reply(1)
  local from = redis.call('HGET', KEYS[1], 'req_from')
  for i = 2, #out - 1, 2 do
    if out[i] == 'state' then out[i + 1] = from end
    if out[i] == 'wgen' then out[i + 1] = tostring(tonumber(out[i + 1]) - 1) end
  end
  return out
end
"""
)

# ARGV: now
_FAIL = (
    _HEAD
    + LUA_TOKENS
    + """
-- KEYS[2] = recent request tokens, ARGV[2] = this one: a retried failure counts once
if seen(KEYS[2], ARGV[2]) then return reply(1) end
if st and st ~= 'closed' then return {0} end
redis.call('HSET', KEYS[1], 'state', 'closed', 'updated_ms', ARGV[1])
redis.call('HINCRBY', KEYS[1], 'failures', 1)
remember(KEYS[2], ARGV[2], ARGV[1])
return reply(1)
"""
)

# ARGV: now
_RESET_FAILURES = (
    _HEAD
    + """
local failures = num('failures')
if st ~= 'closed' or not failures or failures <= 0 then return {0} end
redis.call('HSET', KEYS[1], 'failures', 0, 'updated_ms', ARGV[1])
return {1}
"""
)

# ARGV: now, min failures|'', token  (replies with the record as it was)
_TRIP = (
    _HEAD
    + """
if ours(3) then return as_found() end
if ARGV[2] ~= '' then
  local failures = num('failures')
  if st ~= 'closed' or not failures or failures < tonumber(ARGV[2]) then return {0} end
end
local old = reply(1)
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at_ms', ARGV[1], 'successes', 0,
           'trial_calls', 0, 'updated_ms', ARGV[1], 'req', ARGV[3], 'req_from', st or 'closed')
redis.call('HDEL', KEYS[1], 'trial_started_ms')
redis.call('HINCRBY', KEYS[1], 'wgen', 1)
return old
"""
)

# ARGV: now, gen, token  (replies with the record as it was). Opens a breaker closed in window
# generation ARGV[2]: of the processes that saw that window cross the threshold, the first one
# starts a new generation and every later one is refused.
_TRIP_WINDOW = (
    _HEAD
    + """
if ours(3) then return as_found() end
if (st and st ~= 'closed') or (num('wgen') or 0) ~= tonumber(ARGV[2]) then return {0} end
local old = reply(1)
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at_ms', ARGV[1], 'successes', 0,
           'trial_calls', 0, 'updated_ms', ARGV[1], 'req', ARGV[3], 'req_from', st or 'closed')
redis.call('HDEL', KEYS[1], 'trial_started_ms')
redis.call('HINCRBY', KEYS[1], 'wgen', 1)
return old
"""
)

# ARGV: now, gen, oldest bucket, token, then (bucket, calls, failures) triples
_ADD_WINDOW = (
    _HEAD
    + LUA_TOKENS
    + """
-- KEYS[2] = recent request tokens: a retried window write adds once
if seen(KEYS[2], ARGV[4]) then return reply(1) end
local gen = tonumber(ARGV[2])
if (st and st ~= 'closed') or (num('wgen') or 0) ~= gen then return {0} end
for i = 5, #ARGV, 3 do
  redis.call('HINCRBY', KEYS[1], 'c:' .. ARGV[2] .. ':' .. ARGV[i], ARGV[i + 1])
  if ARGV[i + 2] ~= '0' then
    redis.call('HINCRBY', KEYS[1], 'f:' .. ARGV[2] .. ':' .. ARGV[i], ARGV[i + 2])
  end
end
-- what no window needs any more: another generation's counts, buckets that aged out
local oldest = tonumber(ARGV[3])
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  local g, b = string.match(field, '^[cf]:(%d+):(%d+)$')
  if g and (tonumber(g) ~= gen or tonumber(b) < oldest) then
    redis.call('HDEL', KEYS[1], field)
  end
end
remember(KEYS[2], ARGV[4], ARGV[1])
return reply(1)
"""
)

# ARGV: now, cutoff  (won: the new record; lost: the current one)
_START_TRIAL = (
    _HEAD
    + """
local cutoff = tonumber(ARGV[2])
local opened = num('opened_at_ms')
local started = num('trial_started_ms')
if not ((st == 'open' and opened and opened <= cutoff) or
        (st == 'half_open' and started and started <= cutoff)) then
  -- a retry of this very start (its reply lost) finds the slot it took: ours
  if st == 'half_open' and redis.call('HGET', KEYS[1], 'req') == ARGV[3] then return reply(1) end
  return reply(0)
end
redis.call('HSET', KEYS[1], 'state', 'half_open', 'trial_calls', 1, 'successes', 0,
           'trial_started_ms', ARGV[1], 'updated_ms', ARGV[1], 'req', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'trial_round', 1)
return reply(1)
"""
)

# ARGV: round, now, cutoff, max calls, token
_JOIN_TRIAL = (
    _HEAD
    + LUA_TOKENS
    + """
-- KEYS[2] = recent request tokens: a retried join finds the slot its first run took
if seen(KEYS[2], ARGV[5]) then return reply(1) end
local calls = num('trial_calls')
local started = num('trial_started_ms')
if st ~= 'half_open' or num('trial_round') ~= tonumber(ARGV[1]) or not calls
   or calls >= tonumber(ARGV[4]) or not started or started <= tonumber(ARGV[3]) then
  return {0}
end
redis.call('HSET', KEYS[1], 'trial_started_ms', ARGV[2], 'updated_ms', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'trial_calls', 1)
remember(KEYS[2], ARGV[5], ARGV[2])
return reply(1)
"""
)

# ARGV: round, now, token
_TRIAL_SUCCESS = (
    _HEAD
    + LUA_TOKENS
    + """
-- KEYS[2] = recent request tokens: a retried success counts (and frees its slot) once
if seen(KEYS[2], ARGV[3]) then return reply(1) end
if st ~= 'half_open' or num('trial_round') ~= tonumber(ARGV[1]) then return {0} end
redis.call('HINCRBY', KEYS[1], 'successes', 1)
redis.call('HINCRBY', KEYS[1], 'trial_calls', -1)
redis.call('HSET', KEYS[1], 'updated_ms', ARGV[2])
remember(KEYS[2], ARGV[3], ARGV[2])
return reply(1)
"""
)

# ARGV: round, now, token
_CLOSE = (
    _HEAD
    + """
if ours(3) then return {1} end
if st ~= 'half_open' or num('trial_round') ~= tonumber(ARGV[1]) then return {0} end
redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0, 'successes', 0, 'trial_calls', 0,
           'updated_ms', ARGV[2], 'req', ARGV[3])
redis.call('HDEL', KEYS[1], 'opened_at_ms', 'trial_started_ms')
return {1}
"""
)

# ARGV: round, now, token
_REOPEN = (
    _HEAD
    + """
if ours(3) then return {1} end
if st ~= 'half_open' or num('trial_round') ~= tonumber(ARGV[1]) then return {0} end
redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at_ms', ARGV[2], 'successes', 0,
           'trial_calls', 0, 'updated_ms', ARGV[2], 'req', ARGV[3])
redis.call('HDEL', KEYS[1], 'trial_started_ms')
return {1}
"""
)

# ARGV: now, token  (replies with the record as it was). Closes the hash in place rather than
# deleting it: trial_round is kept, so the next trial starts a new round and any outcome still to
# come from a round started before the reset fails its round check instead of acting on the new
# one.
_RESET = (
    _HEAD
    + """
if ours(2) then return as_found() end
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local old = reply(1)
redis.call('HSET', KEYS[1], 'state', 'closed', 'failures', 0, 'successes', 0, 'trial_calls', 0,
           'updated_ms', ARGV[1], 'req', ARGV[2], 'req_from', st or 'closed')
redis.call('HDEL', KEYS[1], 'opened_at_ms', 'trial_started_ms')
redis.call('HINCRBY', KEYS[1], 'wgen', 1)
return old
"""
)


class RedisBreakerStore:
    def __init__(self, conn: RedisConn, namespace: str) -> None:
        self._conn = conn
        self._ns = namespace

    def _run(
        self, script: str, name: str, args: list[Any], what: str, *, tokens: bool = False
    ) -> tuple[bool, Any]:
        item = item_key(breaker_key(self._ns, name).pk)
        keys = [item, tokens_key(item)] if tokens else [item]
        reply = self._conn.run(script, keys, args, what)
        return as_int(reply[0]) == 1, list(reply[1:])

    def get(self, name: str, *, consistent: bool = True) -> BreakerRecord:
        # reads here are always consistent: ``consistent`` changes nothing
        raw = self._conn.call("breaker get", "hgetall", item_key(breaker_key(self._ns, name).pk))
        return BreakerRecord.from_item(hash_fields(raw))

    def record_failure(self, name: str, now_ms: int) -> BreakerRecord | None:
        ok, rest = self._run(
            _FAIL, name, [now_ms, counting_token(now_ms)], "breaker record_failure", tokens=True
        )
        return BreakerRecord.from_item(pairs(rest)) if ok else None

    def reset_failures(self, name: str, now_ms: int) -> bool:
        return self._run(_RESET_FAILURES, name, [now_ms], "breaker reset_failures")[0]

    def trip(self, name: str, now_ms: int, min_failures: int | None) -> BreakerRecord | None:
        ok, rest = self._run(
            _TRIP,
            name,
            [now_ms, "" if min_failures is None else min_failures, request_token()],
            "breaker trip",
        )
        return BreakerRecord.from_item(pairs(rest)) if ok else None

    def start_trial(self, name: str, now_ms: int, cutoff_ms: int) -> StartTrialResult:
        ok, rest = self._run(
            _START_TRIAL, name, [now_ms, cutoff_ms, request_token()], "breaker start_trial"
        )
        record = BreakerRecord.from_item(pairs(rest))
        return StartTrialResult(record) if ok else StartTrialResult(None, record)

    def join_trial(
        self, name: str, trial_round: int, now_ms: int, cutoff_ms: int, max_calls: int
    ) -> BreakerRecord | None:
        ok, rest = self._run(
            _JOIN_TRIAL,
            name,
            [trial_round, now_ms, cutoff_ms, max_calls, counting_token(now_ms)],
            "breaker join_trial",
            tokens=True,
        )
        return BreakerRecord.from_item(pairs(rest)) if ok else None

    def trial_success(self, name: str, trial_round: int, now_ms: int) -> BreakerRecord | None:
        ok, rest = self._run(
            _TRIAL_SUCCESS,
            name,
            [trial_round, now_ms, counting_token(now_ms)],
            "breaker trial_success",
            tokens=True,
        )
        return BreakerRecord.from_item(pairs(rest)) if ok else None

    def close(self, name: str, trial_round: int, now_ms: int) -> bool:
        return self._run(_CLOSE, name, [trial_round, now_ms, request_token()], "breaker close")[0]

    def reopen(self, name: str, trial_round: int, now_ms: int) -> bool:
        return self._run(_REOPEN, name, [trial_round, now_ms, request_token()], "breaker reopen")[0]

    def reset(self, name: str, now_ms: int) -> BreakerRecord | None:
        ok, rest = self._run(_RESET, name, [now_ms, request_token()], "breaker reset")
        return BreakerRecord.from_item(pairs(rest)) if ok else None

    def add_window(
        self,
        name: str,
        now_ms: int,
        gen: int,
        counts: Mapping[int, tuple[int, int]],
        oldest: int,
        *,
        write: WindowWrite | None = None,
    ) -> BreakerWindow | None:
        if write is None:
            token: str = counting_token(now_ms)
        else:  # the same slot and token at every send of this write (a plain str: kept leased)
            slot, value = write.take(now_ms, COUNT_WINDOW_MS)
            token = f"{slot}:{value}"
        args: list[Any] = [now_ms, gen, oldest, token]
        for bucket, (calls, failures) in sorted(counts.items()):
            args += [bucket, calls, failures]
        ok, rest = self._run(_ADD_WINDOW, name, args, "breaker add_window", tokens=True)
        return window_from_fields(pairs(rest), gen) if ok else None

    def trip_window(self, name: str, now_ms: int, gen: int) -> BreakerRecord | None:
        ok, rest = self._run(
            _TRIP_WINDOW, name, [now_ms, gen, request_token()], "breaker trip_window"
        )
        return BreakerRecord.from_item(pairs(rest)) if ok else None
