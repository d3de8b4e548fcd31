"""A process forked while a thread of its parent is in the middle of a poll (issue 49): the
poll holds its ``WorkerGroup`` turns (plain locks) across its reads and its claim, and a child
forked meanwhile inherited them held, with no thread of its own to let them go: every worker the
child made from the parent's ``Outbox`` blocked forever on its first poll. The child's turns are
new (``os.register_at_fork``); its worker delivers. On redis-server (redis-py reconnects in a
child by itself)."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from dynacoord.outbox import Event, EventStatus
from dynacoord.outbox.worker import OutboxWorker
from dynacoord.testing import unique_name

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


class BlockingStore:
    """The outbox store, but ``refresh_shards`` (read inside a poll, its turn held) waits."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.inside = threading.Event()
        self.go_on = threading.Event()

    def refresh_shards(self) -> int:
        self.inside.set()
        self.go_on.wait(30)
        return self._store.refresh_shards()  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


@pytest.fixture()
def outbox(redis_server: Any) -> Any:
    import redis

    from dynacoord.backends.redis import RedisBackend

    client = redis.Redis(host="127.0.0.1", port=redis_server.port)
    return RedisBackend(client, namespace=unique_name("fork")).outbox


def _in_child(outbox: Any, write_end: int) -> None:
    """The child: a worker made from the parent's Outbox delivers, or the child is ended by the
    alarm (its poll blocked). Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not a test plugin's handler
        signal.alarm(20)
        got: list[str] = []
        handled = outbox.worker(lambda e: got.append(e.id), heartbeat=False).run_once()
        os.write(write_end, f"{handled} {','.join(got)}".encode())
        code = 0
    finally:
        os._exit(code)


def test_a_child_forked_during_a_poll_delivers(outbox: Any) -> None:
    outbox.publish(Event("t", 1, id="e1"))
    blocking = BlockingStore(outbox._store)
    parent_worker = OutboxWorker(
        blocking,  # type: ignore[arg-type]
        lambda e: None,
        clock=outbox.clock,
        group=outbox._workers,  # the group the child's worker joins: the turns are shared
        options=None,
    )
    polling = threading.Thread(target=parent_worker.run_once, daemon=True)
    polling.start()
    assert blocking.inside.wait(10), "the parent's poll did not start"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(read_end)
        _in_child(outbox, write_end)
    os.close(write_end)
    try:
        deadline = time.monotonic() + 40
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline, "the child never ended"
            time.sleep(0.05)
        report = os.read(read_end, 1000).decode()
    finally:
        os.close(read_end)
        blocking.go_on.set()
        polling.join(30)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        f"the child's worker blocked on its first poll (status {status:#x})"
    )
    assert report == "1 e1"
    assert outbox.get("e1").status is EventStatus.COMPLETED
    # The parent's own poll still works once it goes on: its turn is its own.
    assert parent_worker.run_once() == 0
