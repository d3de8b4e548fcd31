"""A leader process killed with SIGKILL is replaced once its lease ends (real processes, Redis).

The victim is a real process that wins the election and renews it in the background; it is
killed with SIGKILL (no step-down, no release: what an OOM kill or a lost host leaves). A
candidate of this process, campaigning from the moment of the kill, must be elected with a larger
term, never before the victim's stored lease ended at its clock, and at its first write after it
ended (it waits with reads, never hammering with writes). Redis only: the rules are the lock
store's on every backend (tests/contract/test_leader.py), and a real server keeps this cheap.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from typing import Any

from dynacoord._clock import SystemClock, now_ms
from dynacoord.testing import unique_name
from tests.conftest import CountingStore
from tests.reliability import _workers

TTL = 2.0


def leader_victim(target: tuple[str, ...], namespace: str, started: Any) -> None:
    """Win the election, renew it in the background, and wait to be killed."""
    leader = _workers.make_backend(target, namespace).leader("svc", ttl=TTL, owner="victim")
    assert leader.campaign(timeout=30)
    started.set()
    while True:
        time.sleep(1)


def test_a_killed_leader_is_replaced_once_its_lease_ends(redis_server: Any) -> None:
    target = ("redis", str(redis_server.port))
    namespace = unique_name("kill")
    ctx = multiprocessing.get_context("spawn")
    started = ctx.Event()
    victim = ctx.Process(target=leader_victim, args=(target, namespace, started), daemon=True)
    victim.start()
    candidate = _workers.make_backend(target, namespace).leader("svc", ttl=TTL, owner="next")
    counted = candidate._store = CountingStore(candidate._store)
    try:
        assert started.wait(60), "the victim was never elected"
        time.sleep(TTL / 2)  # let it renew at least once: the lease killed is a renewed one
        os.kill(victim.pid, signal.SIGKILL)
        victim.join(10)
        assert victim.exitcode == -signal.SIGKILL
    finally:
        if victim.is_alive():
            victim.kill()
    held = candidate.leader()
    assert held is not None and held.owner == "victim"
    assert candidate.campaign(timeout=60, heartbeat=False)
    elected_at = now_ms(SystemClock())
    assert candidate.term is not None and candidate.term > held.term
    shown = candidate.leader()
    assert shown is not None and (shown.owner, shown.term) == ("next", candidate.term)
    # never before the victim's lease ended, and by the first write after it: at most one
    # refused write (the first attempt, while the victim's lease ran), reads while waiting
    assert elected_at >= held.expires_at_ms
    assert counted.calls.get("try_acquire", 0) <= 2, counted.calls
    assert candidate.step_down() is True
