"""The memory of writes whose call raised (dynacoord._raised.RaisedWrites: idempotency claims,
counters.set_if_absent): who may reuse a token. The contract tests
(tests/contract/test_applied_then_raised.py) run it on every backend."""

from __future__ import annotations

from dynacoord._raised import RaisedWrites


def test_a_raised_claims_token_is_taken_once_for_its_key_and_payload():
    raised = RaisedWrites()
    raised.keep("k", "t1", "h", until_ms=1_000)
    assert raised.take("k", "other payload", now_ms=0) is None  # another call: not its retry
    assert raised.take("j", "h", now_ms=0) is None
    assert raised.take("k", "h", now_ms=0) == "t1"
    assert raised.take("k", "h", now_ms=0) is None  # one call at a time holds it


def test_a_raised_claims_token_ends_with_its_lease():
    raised = RaisedWrites()
    raised.keep("k", "t1", None, until_ms=1_000)
    assert raised.take("k", None, now_ms=1_000) is None


def test_a_forked_child_never_reuses_its_parents_token():
    raised = RaisedWrites()
    raised.keep("k", "t1", None, until_ms=1_000)
    raised._pid = -1  # as a child forked after the claim raised sees it: another pid
    assert raised.take("k", None, now_ms=0) is None
    raised.keep("k", "t2", None, until_ms=1_000)  # the child's own claims are its own
    assert raised.take("k", None, now_ms=0) == "t2"


def test_the_memory_is_bounded():
    raised = RaisedWrites()
    for i in range(raised.max_items + 10):
        raised.keep(f"k{i}", f"t{i}", None, until_ms=1_000)
    assert raised.take("k0", None, now_ms=0) is None  # the oldest were dropped
    assert raised.take(f"k{raised.max_items + 9}", None, now_ms=0) == f"t{raised.max_items + 9}"


def test_a_write_without_an_end_is_recognised_until_taken():
    raised = RaisedWrites()
    raised.keep("k", "t1", "v", until_ms=None)  # a flag without TTL
    assert "k" in raised
    assert raised.take("k", "v", now_ms=10**15) == "t1"
    assert "k" not in raised
