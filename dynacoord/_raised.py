"""The tokens of this process's conditional writes whose call *raised* (DESIGN.md section 1).

A write whose call raised may have applied (botocore raises after its last attempt when the first
one applied and its answer was lost; redis-py and pymongo likewise). Its caller's next attempt
must recognise it: :class:`RaisedWrites` keeps the raised write's request token for its key, and
the next write of the same key *and the same content* (``match``) in this process carries it, so
a refusal that shows the token is that write, applied.

Who may reuse a token is the whole safety of it, so the rules live here, once:

* a token is *taken* by one write at a time (under the lock): two calls of the process never both
  carry it (the other one writes with a fresh token and is refused while the first write holds);
* only a write with the same ``match`` takes it: a different content is another caller's write;
* an entry ends at ``until_ms`` (the written item's expiry: after it the item is free anyway);
* at most ``max_items`` are kept, the oldest dropped first (that write is then not recognised,
  as before this memory existed);
* a child forked after a write raised never reuses its parent's token (the parent may retry it).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict

__all__ = ["RaisedWrites"]


class RaisedWrites:
    """Tokens of raised writes by key (see the module docstring)."""

    max_items = 1024

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        # key -> (token, what was written, the end of its recognition or None)
        self._items: OrderedDict[str, tuple[str, str | None, int | None]] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        # lock-free: a hint that a take() may find something (the usual answer is "no")
        return key in self._items

    def take(self, key: str, match: str | None, now_ms: int) -> str | None:
        """The token kept for ``key`` if it was kept for ``match`` and has not ended; taken: the
        next caller gets None until it is kept again."""
        if not self._items:
            return None
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the tokens are its parent's
                self._items.clear()
                self._pid = os.getpid()
                return None
            entry = self._items.get(key)
            # a different content is another caller's write: it must be refused, never taken
            if entry is None or entry[1] != match:
                return None
            del self._items[key]
            until = entry[2]
            return entry[0] if until is None or now_ms < until else None

    def keep(self, key: str, token: str, match: str | None, until_ms: int | None) -> None:
        """Remember ``token``: the write of ``key`` that carried it raised (maybe applied)."""
        with self._lock:
            if self._pid != os.getpid():
                self._items.clear()
                self._pid = os.getpid()
            self._items[key] = (token, match, until_ms)
            self._items.move_to_end(key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
