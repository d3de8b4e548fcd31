"""One slot per writer: how a counting write recognises its own applied write at a constant cost.

A counting write (an ADD: ``counters.increment``, ``cache.incr``, a breaker's failure count and
trial slots) cannot be refused by "already applied" on its own, so it carries a token, and a
retry whose refusal shows that token knows its first attempt applied. The client libraries retry
a request whose response was lost by sending *the same request again*, from the same thread,
before that thread sends anything else. So a store needs only the **last** token of each writer
(a process's thread), not the tokens of every recent write: the item keeps one slot per writer,
``writer -> last token``, and a write sets its writer's slot on the condition that the slot does
not already hold its token. The timeline the slot closes::

    W: ADD n 1, slot[W] = t1  (if slot[W] != t1)  -> applied, the answer is lost
    W: (botocore) the same request again          -> refused: slot[W] == t1, so "applied"
    W: ADD n 1, slot[W] = t2                      -> the next write; t1 is no longer needed

The size of the item is then one slot per writer that wrote the key recently, whatever the rate
(the previous design kept every token of the last one to two minutes: 11 bytes per increment).
A slot whose token is older than :data:`WINDOW_MS` belongs to a writer that is not waiting for
a retry any more (a retry is sent within seconds; the promise is "within one window"), so it may
be dropped: stores drop such stale slots once an item holds more than :data:`PRUNE_AT` of them
(DynamoDB: by a later write conditional on the slot still holding the stale token, so a writer
that came back in between keeps its slot; Redis and MongoDB: inside the same atomic write).

A token is an int that encodes the time it was made (``now_ms * 10**6`` or the writer's last
token plus one, whichever is larger), so that a stale slot is known from its value alone, and
a writer's tokens strictly increase (its next write never carries the token of its last).
A writer is a thread of a process: a random process id (made again in a forked child) and a
serial number per thread (never reused, unlike thread idents).
"""

from __future__ import annotations

import itertools
import os
import threading
from base64 import urlsafe_b64encode

__all__ = ["PRUNE_AT", "TOKEN_SCALE", "WINDOW_MS", "token_ms", "writer_token"]

#: A retry sent less than this long after its first attempt is always recognised; a slot whose
#: token is older than this is stale (its writer has moved on).
WINDOW_MS = 60_000
#: Past this many writer slots on one item, stores drop the stale ones.
PRUNE_AT = 8
#: a token is ``now_ms * TOKEN_SCALE`` (or the writer's last token + 1 if larger)
TOKEN_SCALE = 10**6

_serials = itertools.count()


def _new_process_id() -> str:
    return urlsafe_b64encode(os.urandom(6)).decode("ascii")  # 8 characters, no padding


_process = [_new_process_id()]


def _forked() -> None:  # pragma: no cover - runs in a forked child
    _process[0] = _new_process_id()


os.register_at_fork(after_in_child=_forked)


class _Writer(threading.local):
    process = ""
    name = ""
    last = 0


_writer = _Writer()


def writer_token(now_ms: int) -> tuple[str, int]:
    """The calling thread's writer name and a fresh token for one counting write at ``now_ms``."""
    w = _writer
    process = _process[0]
    if w.process is not process:
        # a new thread, or the first write of a forked child: a name no other writer has
        w.process = process
        w.name = f"{process}{next(_serials):x}"
        w.last = 0
    token = max(now_ms * TOKEN_SCALE, w.last + 1)
    w.last = token
    return w.name, token


def token_ms(token: int | str) -> int:
    """The time (epoch ms) a token was made."""
    return int(token) // TOKEN_SCALE
