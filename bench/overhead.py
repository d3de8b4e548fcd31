"""Section 2: overhead over the floor.

For each operation that is one request, the floor is the same request (same API, key shape,
expressions, return options) made directly on the same boto3 client, with the parameters written
out by hand the way a careful raw-boto3 caller would. Samples are interleaved A/B in one run; the
ratio is median(dynacoord) / median(raw). Target: <= 1.10.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from ._harness import BenchEnv, interleaved, ratio, stats

__all__ = ["TARGET", "run"]

logger = logging.getLogger(__name__)

TARGET = 1.10


@dataclass(frozen=True, slots=True)
class Pair:
    primitive: str
    operation: str
    dynacoord: Callable[[int], object]
    raw: Callable[[int], object]
    raw_api: str


def _now_ms() -> int:
    return int(time.time() * 1000)


def _n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _expect_condition_failure(call: Callable[[], object]) -> None:
    try:
        call()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
    else:  # pragma: no cover - a bench bug, not a measurement
        raise AssertionError("the raw call was expected to fail its condition")


# -- locks -----------------------------------------------------------------------------------------


def _lock_pairs(env: BenchEnv, total: int) -> list[Pair]:
    backend = env.backend()
    locks = backend.locks
    ns = backend.namespace
    client = env.client
    table = env.table
    ttl_ms = 60_000
    grace = backend.lock_fence_grace
    leases: dict[int, Any] = {}
    raw_fences: dict[int, int] = {}
    raw_owner = "raw-owner"

    def key(name: str) -> dict[str, Any]:
        return {"pk": _s(f"LOCK#{ns}#{name}"), "sk": _s("LOCK")}

    def ttl(expires_ms: int) -> int:
        return -(-expires_ms // 1000) + grace

    def dyn_acquire(i: int) -> None:
        leases[i] = locks.acquire(f"a{i}", ttl=60, owner=f"o{i}")

    def raw_acquire(i: int) -> None:
        now = _now_ms()
        exp = now + ttl_ms
        response = client.update_item(
            TableName=table,
            Key=key(f"raw-a{i}"),
            ConditionExpression="attribute_not_exists(pk) OR expires_at_ms <= :now",
            UpdateExpression=(
                "SET #owner = :owner, expires_at_ms = :exp, #ttl = :ttl, "
                "fence = if_not_exists(fence, :base) + :one"
            ),
            ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
            ExpressionAttributeValues={
                ":now": _n(now),
                ":owner": _s(raw_owner),
                ":exp": _n(exp),
                ":ttl": _n(ttl(exp)),
                ":base": _n(now * 1000),
                ":one": _n(1),
            },
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        raw_fences[i] = int(response["Attributes"]["fence"]["N"])

    holder = locks.acquire("held", ttl=3600)
    assert holder is not None
    raw_acquire(-1)  # raw-a-1 is the raw side's held lock

    def dyn_acquire_held(i: int) -> None:
        assert locks.acquire("held", ttl=60) is None

    def raw_acquire_held(i: int) -> None:
        now = _now_ms()
        exp = now + ttl_ms
        _expect_condition_failure(
            lambda: client.update_item(
                TableName=table,
                Key=key("raw-a-1"),
                ConditionExpression="attribute_not_exists(pk) OR expires_at_ms <= :now",
                UpdateExpression=(
                    "SET #owner = :owner, expires_at_ms = :exp, #ttl = :ttl, "
                    "fence = if_not_exists(fence, :base) + :one"
                ),
                ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
                ExpressionAttributeValues={
                    ":now": _n(now),
                    ":owner": _s("someone-else"),
                    ":exp": _n(exp),
                    ":ttl": _n(ttl(exp)),
                    ":base": _n(now * 1000),
                    ":one": _n(1),
                },
                ReturnValues="ALL_NEW",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        )

    def dyn_extend(i: int) -> None:
        assert leases[i].extend()

    def raw_extend(i: int) -> None:
        now = _now_ms()
        exp = now + ttl_ms
        client.update_item(
            TableName=table,
            Key=key(f"raw-a{i}"),
            ConditionExpression="#owner = :owner AND fence = :fence AND expires_at_ms > :now",
            UpdateExpression="SET expires_at_ms = :exp, #ttl = :ttl",
            ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
            ExpressionAttributeValues={
                ":owner": _s(raw_owner),
                ":fence": _n(raw_fences[i]),
                ":now": _n(now),
                ":exp": _n(exp),
                ":ttl": _n(ttl(exp)),
            },
        )

    def dyn_get(i: int) -> None:
        assert locks.get(f"a{i}") is not None

    def raw_get(i: int) -> None:
        client.get_item(TableName=table, Key=key(f"raw-a{i}"), ConsistentRead=True)

    def dyn_release(i: int) -> None:
        assert leases[i].release()

    def raw_release(i: int) -> None:
        now = _now_ms()
        client.update_item(
            TableName=table,
            Key=key(f"raw-a{i}"),
            ConditionExpression="#owner = :owner AND fence = :fence AND expires_at_ms > :now",
            UpdateExpression="SET expires_at_ms = :now, #ttl = :ttl REMOVE #owner",
            ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
            ExpressionAttributeValues={
                ":owner": _s(raw_owner),
                ":fence": _n(raw_fences[i]),
                ":now": _n(now),
                ":ttl": _n(ttl(now)),
            },
        )

    def dyn_force(i: int) -> None:
        locks.force_release(f"a{i}")

    def raw_force(i: int) -> None:
        now = _now_ms()
        client.update_item(
            TableName=table,
            Key=key(f"raw-a{i}"),
            ConditionExpression="attribute_exists(pk)",
            UpdateExpression="SET expires_at_ms = :now, #ttl = :ttl REMOVE #owner",
            ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
            ExpressionAttributeValues={":now": _n(now), ":ttl": _n(ttl(now))},
            ReturnValues="ALL_OLD",
        )

    return [
        Pair("locks", "acquire (free key)", dyn_acquire, raw_acquire, "UpdateItem"),
        Pair(
            "locks",
            "acquire (held, timeout=0)",
            dyn_acquire_held,
            raw_acquire_held,
            "UpdateItem (condition fails)",
        ),
        Pair("locks", "lease.extend", dyn_extend, raw_extend, "UpdateItem"),
        Pair("locks", "get", dyn_get, raw_get, "GetItem (consistent)"),
        Pair("locks", "lease.release", dyn_release, raw_release, "UpdateItem"),
        Pair("locks", "force_release", dyn_force, raw_force, "UpdateItem"),
    ]


PRIMITIVES: list[tuple[str, Callable[[BenchEnv, int], list[Pair]]]] = [
    ("locks", _lock_pairs),
]


def run(env: BenchEnv) -> dict[str, Any]:
    n = env.scale.samples
    warmup = env.scale.warmup
    rows: list[dict[str, Any]] = []
    missing: dict[str, str] = {}
    for name, make_pairs in PRIMITIVES:
        try:
            pairs = make_pairs(env, n + warmup)
        except Exception as exc:
            logger.exception("overhead pairs for %r could not be set up", name)
            missing[name] = f"{type(exc).__name__}: {exc}"
            continue
        for pair in pairs:
            try:
                a, b = interleaved(pair.dynacoord, pair.raw, n, warmup)
            except Exception as exc:
                logger.exception("overhead of %r failed", pair.operation)
                rows.append(
                    {
                        "primitive": pair.primitive,
                        "operation": pair.operation,
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
                continue
            sa, sb = stats(a), stats(b)
            r = ratio(sa.median_ms, sb.median_ms)
            rows.append(
                {
                    "primitive": pair.primitive,
                    "operation": pair.operation,
                    "raw_api": pair.raw_api,
                    "dynacoord": sa.as_dict(),
                    "raw": sb.as_dict(),
                    "ratio_median": r,
                    "ratio_p95": ratio(sa.p95_ms, sb.p95_ms),
                    "extra_ms_median": round(sa.median_ms - sb.median_ms, 4),
                    "within_target": r <= TARGET,
                }
            )
    ok = [r for r in rows if "ratio_median" in r]
    return {
        "status": "ok" if ok else "error",
        "target": TARGET,
        "samples": n,
        "warmup": warmup,
        "rows": rows,
        "missing": missing,
        "above_target": [r["operation"] for r in ok if not r["within_target"]],
    }
