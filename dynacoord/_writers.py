"""One slot per in-flight call: how a counting write recognises its own applied write at a cost
set by concurrency.

A counting write (an ADD: ``counters.increment``, ``cache.incr``, a breaker's failure count and
trial slots) cannot be refused by "already applied" on its own, so it carries a token, and a
retry whose refusal shows that token knows its first attempt applied. The client libraries retry
a request whose response was lost by sending *the same request again*, inside the same call,
before that call returns. So a store needs only the **last** token of each call in flight, not
the tokens of every recent write: a call **leases a slot** from its process's pool for its whole
duration (every retry the client makes included) and gives it back when it returns, and the
item keeps one attribute per slot, ``slot -> last token``. A write sets its slot on the
condition that the slot does not already hold its token. The timeline the slot closes::

    call A (slot s): ADD n 1, slot[s] = t1  (if slot[s] != t1)  -> applied, the answer is lost
    call A (botocore): the same request again                  -> refused: slot[s] == t1: "applied"
    call A returns, s goes back to the pool
    call B (slot s): ADD n 1, slot[s] = t2                      -> t1 is no longer needed

A slot is never in two calls at once, so no other call can overwrite ``slot[s]`` while A's retry
may still come, however many other calls or processes write the item in between. The pool hands
out the slot returned last (a stack): a process whose calls never overlap uses one slot, whatever
the number of threads it ever created (a thread per request included), and an item holds at most
**(calls in flight at once in one process) x (processes that wrote it within one window)**
slots, whatever the rate.

A token is an int that encodes until when its call may still retry: ``(now_ms + window_ms) *
TOKEN_SCALE``, or the slot's last token plus one if that is larger (so a slot's tokens strictly
increase: its next call never carries the token of its last). ``window_ms`` is the longest time
the client library may still re-send a request after the call started: read from the client's
own configuration (DynamoDB: timeouts x attempts + the retry mode's backoff ceiling, see
``backends/dynamodb/_retry_window.py``), never a constant a default setting can exceed. A slot
whose token's time has passed belongs to no call that may still retry, so a store may drop it:
stores drop such stale slots once an item holds more than :data:`PRUNE_AT` of them (DynamoDB: also
when dropping them takes the item below a KB it bills, by a write conditional on each slot
being gone or still holding the token seen, so a slot leased again in between is kept and two
writers dropping the same slots do not refuse each other; Redis and MongoDB: inside the same
atomic write, or filtered the same way).
Each writer states its own window in its tokens, so a process with short timeouts never drops
the slot of one with long ones.

Slots of writers that will never write again (a Lambda environment reclaimed, a one-shot cron
job or CLI call, a burst's calls that have returned) are dropped by **whoever writes next**: a
process remembers the slots its last write to an item showed (:func:`remember`), and its next
write there drops, in its own request, those stale by then and its own that are free in its
pool (:func:`finished`: their calls have returned, so no retry of theirs can come); a write
whose answer shows many stale slots (a process that may never write again cannot leave them to
its next write) drops them at once. An item then holds the slots of the writers of one window,
whatever their lifetimes.

A slot's name is a random process id (made again in a forked child: 6 characters, 36 bits: two
writers of one item within one window share one with a chance of about n^2 / 2^37, 1 in 10
million for 120) and the slot's serial number in that process's pool.
"""

from __future__ import annotations

import os
import threading
from base64 import urlsafe_b64encode
from collections.abc import Iterable
from typing import Any

__all__ = [
    "DEFAULT_WINDOW_MS",
    "PRUNE_AT",
    "TOKEN_SCALE",
    "Slot",
    "finished",
    "lease",
    "recall",
    "release",
    "remember",
    "token_ms",
]

#: The window of a client whose retries dynacoord cannot read from its configuration (Redis,
#: MongoDB: see each backend): ten minutes.
DEFAULT_WINDOW_MS = 600_000
#: Past this many slots on one item, stores drop the stale ones.
PRUNE_AT = 8
#: a token is ``until_ms * TOKEN_SCALE`` (or the slot's last token + 1 if larger): 14 digits,
#: 8 bytes as a DynamoDB number
TOKEN_SCALE = 10
#: A token of 18 digits or more was made as ``made_ms * 10**6`` and may be retried for 60 s
#: after ``made_ms``: items on a table can still carry such tokens, and a slot holding one must
#: turn stale when its call can no longer retry, as any other slot does.
_MADE_MS_TOKEN = 10**17
_MADE_MS_SCALE = 10**6
_MADE_MS_WINDOW_MS = 60_000


class Slot:
    """One slot of a process's pool: its name and the last token a call carried in it."""

    __slots__ = ("last", "name", "pool")

    def __init__(self, name: str, pool: _Pool) -> None:
        self.name = name
        self.pool = pool
        self.last = 0


class _Pool:
    """The slots of one process: free ones on a stack, the one returned last handed out first."""

    def __init__(self) -> None:
        # 6 characters (36 bits): every byte of a slot's name is billed on every counted item
        self.process = urlsafe_b64encode(os.urandom(6)).decode("ascii")[:6]
        self.lock = threading.Lock()
        self.free: list[Slot] = []
        self.made = 0
        #: item -> the other writers' slots this process's last counting write to it saw
        self.seen: dict[str, tuple[tuple[str, Any, int], ...]] = {}

    def take(self) -> Slot:
        with self.lock:
            if self.free:
                return self.free.pop()
            name = f"{self.process}{self.made:x}"
            self.made += 1
        return Slot(name, self)

    def give(self, slot: Slot) -> None:
        with self.lock:
            self.free.append(slot)


_pool = [_Pool()]


def _forked() -> None:  # pragma: no cover - runs in a forked child
    # the child's calls must never share a slot name with the parent's
    _pool[0] = _Pool()


os.register_at_fork(after_in_child=_forked)


def lease(now_ms: int, window_ms: int) -> tuple[Slot, int]:
    """A slot for one counting call starting at ``now_ms`` whose client may re-send its request
    for up to ``window_ms``, and the call's token. Give the slot back with :func:`release` when
    the call has returned (after every retry of the client)."""
    slot = _pool[0].take()
    token = max((now_ms + window_ms) * TOKEN_SCALE, slot.last + 1)
    slot.last = token
    return slot, token


def release(slot: Slot) -> None:
    """Give back a slot taken by :func:`lease` (its call returned or raised)."""
    if slot.pool is _pool[0]:  # a slot of the parent, in a forked child: not this pool's
        slot.pool.give(slot)


def finished(names: Iterable[str]) -> set[str]:
    """Those of the slot ``names`` that belong to this process's pool and are free: no call of
    this process holds them, so none of their calls can still be retried (a slot is leased for
    its call's whole duration, every retry of the client included)."""
    pool = _pool[0]
    with pool.lock:
        free = {slot.name for slot in pool.free}
    return {name for name in names if name in free}


#: at most this many items' slots are remembered by one process (then it starts again)
MAX_SEEN = 1024


def remember(item: str, slots: tuple[tuple[str, Any, int], ...]) -> None:
    """Keep the slots this process's counting write saw on ``item``: (name, value as stored,
    until when its call may retry), for its next write to ``item`` to drop those that have
    turned stale by then (:func:`recall`) in the same request. Nothing to keep clears the
    entry."""
    seen = _pool[0].seen
    if not slots:
        seen.pop(item, None)
        return
    if len(seen) >= MAX_SEEN and item not in seen:
        seen.clear()
    seen[item] = slots


def recall(item: str) -> tuple[tuple[str, Any, int], ...]:
    """What :func:`remember` kept for ``item`` (and forget it), or nothing."""
    return _pool[0].seen.pop(item, ())


def token_ms(token: int | str) -> int:
    """Until when (epoch ms) the call that carried ``token`` may retry: past it, its slot is
    stale."""
    value = int(token)
    if value >= _MADE_MS_TOKEN:  # made_ms * 10**6, retried for 60 s
        return value // _MADE_MS_SCALE + _MADE_MS_WINDOW_MS
    return value // TOKEN_SCALE
