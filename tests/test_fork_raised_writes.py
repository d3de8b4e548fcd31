"""A forked child never claims its parent's unanswered write (issue 49, "fork at any step").

A write whose call raised may have applied; the process that sent it keeps its token (and slot)
so that its next attempt recognises it. A child forked meanwhile inherits that memory, but the
write is its parent's, which may still send it again itself: if the child sent it too, one
applied write would be recognised by two processes (two holders of one permit, a window count
added twice). Each test here raises a write in the parent, forks for real (``os.fork``), lets
the child use the parent's object, and checks the child wrote under an identity of its own.

Where the store is a server (DynamoDB Local, redis-server) parent and child share it; mongomock
lives in the process's memory, so a child's writes reach only its own copy: the semaphore's test
still runs there (it judges the child's answer), the breaker's does not (its breach shows only in
the shared store). The rules live in the shared front-ends (semaphore.py, _breaker_window.py,
_raised.py), so one backend of each kind is enough. Linux (``os.fork``) only.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError

from dynacoord import BreakerState, FailureRate, ManualClock
from dynacoord.errors import BackendError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")

#: what a caller sees when the client gave up: botocore's own error, or the backend's wrapper
RAISED = (EndpointConnectionError, BackendError)


def _fork(child: Callable[[int], str]) -> tuple[Callable[[], None], Callable[[], str]]:
    """Fork a child that waits for ``go()``, runs ``child(read_fd)`` and reports its string.
    Returns (go, result): ``result()`` waits for the child's report and exit."""
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        code = 1
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # not a test plugin's handler
            signal.alarm(20)
            os.close(to_child_w)
            os.close(from_child_r)
            os.read(to_child_r, 1)  # the parent's go
            try:
                report = child(to_child_r)
            except BaseException as exc:  # reported, never raised into pytest's copy
                report = f"error: {exc!r}"
            os.write(from_child_w, report.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(to_child_r)
    os.close(from_child_w)

    def go() -> None:
        os.write(to_child_w, b"g")
        os.close(to_child_w)

    def result() -> str:
        try:
            deadline = time.monotonic() + 40
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                assert time.monotonic() < deadline, "the child never ended"
                time.sleep(0.02)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"status {status:#x}"
            return os.read(from_child_r, 10_000).decode()
        finally:
            os.close(from_child_r)

    return go, result


# -- semaphore: an acquire that raised ----------------------------------------------------------


@pytest.mark.parametrize("lossy", ["dynamodb", "redis", "mongo"], indirect=True)
def test_a_forked_child_never_takes_its_parents_raised_permit(lossy: Any) -> None:
    sem = lossy.backend().semaphore("fork", limit=2, ttl=30)
    sem.holders()  # read now: the raised write is the acquire's only request
    lossy.raise_next(applied=True)
    with pytest.raises(RAISED):
        sem.acquire(blocking=False)  # applied: the parent may still send its token again
    (raised,) = [p.token for p in sem.holders()]

    def child(_: int) -> str:
        return sem.acquire(blocking=False).token

    go, result = _fork(child)
    go()
    childs = result()
    # Without the rule the child sends the parent's token and is told the parent's slot is its
    # own permit: with the parent's own next acquire, two holders of one permit.
    assert childs != raised, "the child took its parent's raised permit as its own"
    parents = sem.acquire(blocking=False)
    assert parents.token == raised  # the parent still recognises its own applied write
    if lossy.kind != "mongo":  # a shared store: both permits are in it, one each
        assert sorted(p.token for p in sem.holders()) == sorted([raised, childs])


# -- FailureRate breaker: a flush that raised -------------------------------------------------------


class BoomError(Exception):
    pass


def _fail() -> None:
    raise BoomError("dependency failed")


@pytest.mark.parametrize("lossy", ["dynamodb", "redis"], indirect=True)
def test_a_forked_child_never_sends_its_parents_raised_flush(lossy: Any) -> None:
    # flush_interval longer than the test: only flush() writes the counts
    policy = FailureRate(threshold=0.5, minimum_calls=5, window=60, flush_interval=30)
    breaker = lossy.backend(clock=ManualClock()).breaker("fork", reset_timeout=10, policy=policy)
    for _ in range(3):
        with pytest.raises(BoomError):
            breaker.call(_fail)
    lossy.raise_next(applied=True)
    with pytest.raises(RAISED):
        breaker.flush()  # 3 of 3 stored; the parent keeps the write to send it again

    def child(_: int) -> str:
        breaker.flush()
        return "flushed"

    go, result = _fork(child)
    # The parent goes on first: its kept write is recognised, its slot carries a new token.
    breaker.flush()
    with pytest.raises(BoomError):
        breaker.call(_fail)
    breaker.flush()  # 4 of 4: below minimum_calls=5
    assert breaker.state is BreakerState.CLOSED
    go()
    assert result() == "flushed"
    # Without the rule the child sent the parent's old write (its slot now holds a newer token,
    # so it applied): 7 of 7 stored for 4 calls, and the breaker opened.
    assert breaker.state is BreakerState.CLOSED, "the child counted its parent's calls again"


@pytest.mark.parametrize("lossy", ["dynamodb", "redis"], indirect=True)
def test_a_forked_child_never_writes_its_parents_unwritten_calls(lossy: Any) -> None:
    policy = FailureRate(threshold=0.5, minimum_calls=5, window=60, flush_interval=30)
    breaker = lossy.backend(clock=ManualClock()).breaker("fork2", reset_timeout=10, policy=policy)
    for _ in range(3):
        with pytest.raises(BoomError):
            breaker.call(_fail)  # counted, not written yet

    def child(_: int) -> str:
        breaker.flush()  # the child's own calls: none
        return "flushed"

    go, result = _fork(child)
    go()
    assert result() == "flushed"
    breaker.flush()  # the parent writes its 3 of 3
    # Without the rule the child wrote them too: 6 of 6, and the breaker opened.
    assert breaker.state is BreakerState.CLOSED, "the child wrote its parent's calls"


# -- leader: a campaign that raised, a term the parent leads ----------------------------------------


@pytest.mark.parametrize("lossy", ["dynamodb", "redis", "mongo"], indirect=True)
def test_a_forked_child_never_adopts_its_parents_raised_campaign(lossy: Any) -> None:
    candidate = lossy.backend().leader("fork", ttl=30)
    lossy.raise_next(applied=True)
    with pytest.raises(RAISED):
        candidate.campaign(timeout=0, heartbeat=False)  # applied: the parent holds the seat

    def child(_: int) -> str:
        return f"{candidate.campaign(timeout=0, heartbeat=False)} {candidate.owner}"

    go, result = _fork(child)
    go()
    elected, childs_owner = result().split(" ", 1)
    # Without the rule the child campaigned under the parent's owner and adopted the parent's
    # applied acquire as its own; with the parent's next campaign, two leaders of one term.
    assert elected == "False", "the child adopted its parent's raised campaign"
    assert childs_owner != candidate.owner
    assert candidate.campaign(timeout=0, heartbeat=False)  # the parent adopts its own
    assert candidate.leader() is not None and candidate.leader().owner == candidate.owner


@pytest.mark.parametrize("lossy", ["redis"], indirect=True)
def test_a_forked_child_does_not_lead_its_parents_term(lossy: Any) -> None:
    candidate = lossy.backend().leader("fork-led", ttl=30)
    assert candidate.campaign(timeout=0, heartbeat=False)

    def child(_: int) -> str:
        return f"{candidate.is_leader} {candidate.campaign(timeout=0, heartbeat=False)}"

    go, result = _fork(child)
    go()
    # Without the rule the child said it led the parent's term (no thread of its own renewing
    # or watching it), and a campaign under the parent's owner was "already leading".
    assert result() == "False False", "the child led its parent's term"
    assert candidate.is_leader


# -- RaisedWrites (dynacoord/_raised.py): set_if_absent, idempotency claims -----------------------


def _raise_once(lossy: Any, store: Any, method: str) -> None:
    """The next call of ``store.method`` raises after its write applied."""
    real = getattr(store, method)

    def raising(*args: Any, **kwargs: Any) -> Any:
        setattr(store, method, real)  # once
        lossy.raise_next(applied=True)
        return real(*args, **kwargs)

    setattr(store, method, raising)


@pytest.mark.parametrize("lossy", ["dynamodb", "redis", "mongo"], indirect=True)
def test_a_forked_child_never_claims_its_parents_raised_set_if_absent(lossy: Any) -> None:
    counters = lossy.backend().counters
    _raise_once(lossy, counters._store, "put_if_absent")
    with pytest.raises(RAISED):
        counters.set_if_absent("flag", "mine")  # applied: the parent may send it again

    def child(_: int) -> str:
        return str(counters.set_if_absent("flag", "mine"))

    go, result = _fork(child)
    go()
    # Without the rule the child sent the parent's token and was told it set the flag: two
    # processes each told they set it.
    assert result() == "False", "the child claimed its parent's raised set_if_absent"
    assert counters.set_if_absent("flag", "mine") is True  # the parent's own, recognised


@pytest.mark.parametrize("lossy", ["dynamodb", "redis", "mongo"], indirect=True)
def test_a_forked_child_never_runs_under_its_parents_raised_claim(lossy: Any) -> None:
    backend = lossy.backend()
    runs: list[int] = []

    @backend.idempotent(key=lambda x: f"k{x}", in_progress_ttl=60)
    def work(x: int) -> int:
        runs.append(x)
        return x * 2

    _raise_once(lossy, backend.idempotency._store, "claim")
    with pytest.raises(RAISED):
        work(1)  # the claim applied: the parent may send its token again

    def child(_: int) -> str:
        try:
            return f"ran {work(1)}"
        except Exception as exc:
            return type(exc).__name__

    go, result = _fork(child)
    go()
    # Without the rule the child recognised the parent's claim as its own and ran the
    # function; the parent's retry runs it too.
    assert result() == "IdempotencyInProgressError", "the child ran under its parent's claim"
    assert work(1) == 2
    assert runs == [1]


# -- rate limiter: a call that raised (the rule is dynacoord/ratelimit.py's) ---------------------


@pytest.mark.parametrize("lossy", ["dynamodb", "redis"], indirect=True)
def test_a_forked_child_never_claims_its_parents_raised_rate_limited_call(lossy: Any) -> None:
    limiter = lossy.backend(clock=ManualClock()).rate_limiter("fork", rate=1, per=60, burst=3)
    lossy.raise_next(applied=True)
    with pytest.raises(RAISED):
        limiter.try_acquire()  # applied: 1 spent, and the parent may still send it again

    def child(_: int) -> str:
        return str(limiter.try_acquire().admitted)

    go, result = _fork(child)
    go()
    assert result() == "True"  # the child's own call
    assert limiter.try_acquire().admitted  # the parent's raised call, recognised
    # Without the rule the child was admitted on the parent's spent call: 2 admitted, 1 spent.
    assert limiter.available() == 1, "the child was admitted on its parent's raised call"
