"""What a lease object says about itself, on every backend: ``is_held()`` answers for this lease
(its fence), not for its owner's name. A fixed ``owner=`` (a host name, a job name) comes back
under a new lease after the old one expired; the old lease must say it no longer holds the lock,
or a worker that checks it before a write fenced by the old token goes on as if it held it.

tests/contract/test_store_rules.py lists this rule; tests/mutations/guards.d/every-backend.toml
breaks the fence comparison.
"""

from __future__ import annotations

from typing import Any

from dynacoord import ManualClock


def test_a_lease_taken_again_by_its_owner_after_it_expired_is_not_held(make_backend: Any) -> None:
    clock = ManualClock()
    first = make_backend(clock=clock)
    other = make_backend(clock=clock, namespace=first.namespace)  # another process, same owner
    old = first.locks.acquire("job", ttl=1, owner="host-1")
    assert old is not None and old.is_held()
    clock.advance(2)
    assert not old.is_held(), "expired"
    new = other.locks.acquire("job", ttl=10, owner="host-1")
    assert new is not None and new.fence > old.fence
    assert new.is_held()
    assert not old.is_held(), "the old lease of the same owner name, under a newer fence"
    assert old.release() is False
    assert new.is_held(), "the old lease's release frees nothing of the new one"
