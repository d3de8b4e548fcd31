"""The memory of claims whose call raised (dynacoord.idempotency._RaisedClaims): who may reuse a
token. The contract tests (tests/contract/test_applied_then_raised.py) run it on every backend."""

from __future__ import annotations

from dynacoord.idempotency import _RaisedClaims


def test_a_raised_claims_token_is_taken_once_for_its_key_and_payload():
    raised = _RaisedClaims()
    raised.keep("k", "t1", "h", until_ms=1_000)
    assert raised.take("k", "other payload", now_ms=0) is None  # another call: not its retry
    assert raised.take("j", "h", now_ms=0) is None
    assert raised.take("k", "h", now_ms=0) == "t1"
    assert raised.take("k", "h", now_ms=0) is None  # one call at a time holds it


def test_a_raised_claims_token_ends_with_its_lease():
    raised = _RaisedClaims()
    raised.keep("k", "t1", None, until_ms=1_000)
    assert raised.take("k", None, now_ms=1_000) is None


def test_a_forked_child_never_reuses_its_parents_token():
    raised = _RaisedClaims()
    raised.keep("k", "t1", None, until_ms=1_000)
    raised._pid = -1  # as a child forked after the claim raised sees it: another pid
    assert raised.take("k", None, now_ms=0) is None
    raised.keep("k", "t2", None, until_ms=1_000)  # the child's own claims are its own
    assert raised.take("k", None, now_ms=0) == "t2"


def test_the_memory_is_bounded():
    raised = _RaisedClaims()
    for i in range(raised.max_items + 10):
        raised.keep(f"k{i}", f"t{i}", None, until_ms=1_000)
    assert raised.take("k0", None, now_ms=0) is None  # the oldest were dropped
    assert raised.take(f"k{raised.max_items + 9}", None, now_ms=0) == f"t{raised.max_items + 9}"
