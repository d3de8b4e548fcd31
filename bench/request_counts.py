"""Section 1: requests per operation, counted on the wire with a botocore ``before-send`` hook.

Every public operation of every primitive that exists in this checkout is called a few times;
each call's requests are counted. ``minimum`` is the fewest requests the operation can take with
its semantics on DynamoDB (the reason is in ``why``); a row whose count is above it is flagged.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ._harness import BenchEnv

__all__ = ["run"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Op:
    primitive: str
    operation: str
    call: Callable[[int], object]
    minimum: int
    why: str = ""


def _count(env: BenchEnv, op: Op, reps: int) -> dict[str, Any]:
    totals: list[int] = []
    apis: Counter[str] = Counter()
    for i in range(reps):
        with env.counter.measure() as ops:
            op.call(i)
        totals.append(sum(ops.values()))
        apis = ops
    requests = max(totals)
    return {
        "primitive": op.primitive,
        "operation": op.operation,
        "requests": requests,
        "varies": min(totals) != requests,
        "apis": dict(sorted(apis.items())),
        "minimum": op.minimum,
        "above_minimum": requests > op.minimum,
        "why": op.why,
    }


# -- per primitive: the operations and their minimum ---------------------------------------------


def _lock_ops(env: BenchEnv, reps: int) -> list[Op]:
    locks = env.backend().locks
    n = reps + 1
    held = [locks.acquire(f"held{i}", ttl=60) for i in range(n)]
    leases = [locks.acquire(f"mine{i}", ttl=60) for i in range(n)]
    owned = [locks.acquire(f"own{i}", ttl=60, owner=f"owner{i}") for i in range(n)]
    forced = [locks.acquire(f"force{i}", ttl=60) for i in range(n)]
    released = [locks.acquire(f"rel{i}", ttl=60) for i in range(n)]
    assert all(x is not None for x in (*held, *leases, *owned, *forced, *released))

    def hold(i: int) -> None:
        with locks.hold(f"hold{i}", ttl=60, heartbeat=False):
            pass

    return [
        Op(
            "locks",
            "acquire (free key)",
            lambda i: locks.acquire(f"free{i}", ttl=60),
            1,
            "one conditional UpdateItem",
        ),
        Op(
            "locks",
            "acquire (held by another owner, timeout=0)",
            lambda i: locks.acquire(f"held{i}", ttl=60),
            1,
            "the failed conditional write returns the holder (ReturnValuesOnConditionCheckFailure)",
        ),
        Op(
            "locks",
            "re-acquire by the same owner",
            lambda i: locks.acquire(f"own{i}", ttl=60, owner=f"owner{i}"),
            2,
            "keeping the fence needs a second, differently conditioned write",
        ),
        Op("locks", "lease.extend", lambda i: leases[i].extend(), 1, "one conditional UpdateItem"),
        Op("locks", "lease.is_held", lambda i: leases[i].is_held(), 1, "one consistent GetItem"),
        Op("locks", "get", lambda i: locks.get(f"held{i}"), 1, "one consistent GetItem"),
        Op(
            "locks",
            "lease.release",
            lambda i: released[i].release(),
            1,
            "one conditional UpdateItem (the item is kept for the fence)",
        ),
        Op(
            "locks",
            "force_release",
            lambda i: locks.force_release(f"force{i}"),
            1,
            "one conditional UpdateItem",
        ),
        Op("locks", "hold() enter + exit (no heartbeat due)", hold, 2, "acquire + release"),
    ]


PRIMITIVES: list[tuple[str, Callable[[BenchEnv, int], list[Op]]]] = [
    ("locks", _lock_ops),
]


def run(env: BenchEnv) -> dict[str, Any]:
    reps = env.scale.count_reps
    rows: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for name, make_ops in PRIMITIVES:
        try:
            ops = make_ops(env, reps)
        except Exception as exc:
            logger.exception("request counts for %r could not be set up", name)
            missing[name] = f"{type(exc).__name__}: {exc}"
            continue
        for op in ops:
            try:
                rows.append(_count(env, op, reps))
            except Exception as exc:
                logger.exception("request count of %r failed", op.operation)
                rows.append(
                    {
                        "primitive": op.primitive,
                        "operation": op.operation,
                        "error": f"{type(exc).__name__}: {exc}",
                        "minimum": op.minimum,
                    }
                )
    return {
        "status": "ok" if rows else "error",
        "rows": rows,
        "missing": missing,
        "flagged": [r["operation"] for r in rows if r.get("above_minimum")],
    }
