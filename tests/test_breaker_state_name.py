"""``dynacoord.BreakerState`` prints as itself (it printed ``<enum 'State'>``, the name inside
``dynacoord.breaker``); ``dynacoord.breaker.State`` stays the same class (issue 52 item 12)."""

from __future__ import annotations

import pickle

import dynacoord
from dynacoord import breaker


def test_breaker_state_prints_as_its_public_name() -> None:
    assert repr(dynacoord.BreakerState) == "<enum 'BreakerState'>"
    assert repr(dynacoord.BreakerState.OPEN) == "<BreakerState.OPEN: 'open'>"
    assert str(dynacoord.BreakerState.OPEN) == "open"


def test_the_module_name_is_the_same_class_and_members_pickle() -> None:
    assert breaker.State is dynacoord.BreakerState
    for member in dynacoord.BreakerState:
        assert pickle.loads(pickle.dumps(member)) is member
