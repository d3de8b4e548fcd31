"""``dynacoord ratelimit show``: a shared rate limiter's bucket, per shard.

The store keeps one number per shard, ``tat`` (GCRA's theoretical arrival time: when the bucket
is full again); the rate, period and burst live in the callers' code. Given them, the view
computes what the limiter would: the calls admitted at once now and when the next call of one
would be.
"""

from __future__ import annotations

import sys
from typing import Any

from .common import CommandFailed, Context, UsageError, add_command

#: microseconds per second (``tat`` is stored in epoch microseconds)
_MICROS = 1_000_000


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("ratelimit", help="inspect shared rate limiters")
    sub = group.add_subparsers(dest="ratelimit_command", required=True, metavar="COMMAND")

    show = add_command(
        sub, "show", _show, "show a rate limiter's bucket per shard (exit 1 if absent)"
    )
    show.add_argument("name")
    show.add_argument(
        "--rate",
        type=float,
        default=None,
        help="the limiter's rate (calls per --per seconds), to show the calls left and the next "
        "admission (the table does not store it)",
    )
    show.add_argument("--per", type=float, default=1.0, help="the limiter's period (default 1 s)")
    show.add_argument(
        "--burst", type=int, default=None, help="the limiter's burst (default: the library's)"
    )
    show.add_argument(
        "--shards", type=int, default=1, help="the limiter's shards (default 1: not sharded)"
    )


def _show(ctx: Context) -> Any:
    from .. import keys
    from ..ratelimit import MAX_SHARDS, RateLimiter

    args = ctx.args
    if args.rate is None and (args.burst is not None or args.per != 1.0):
        raise UsageError("--per and --burst describe a rate: give --rate too")
    if not 1 <= args.shards <= MAX_SHARDS:
        raise ValueError(f"--shards must be between 1 and {MAX_SHARDS}, got {args.shards}")
    backend = ctx.backend()
    keys.rate_key(backend.namespace, args.name)  # a bad name is refused before anything is sent
    limiter: RateLimiter | None = None
    if args.rate is not None:
        # the limiter's own checks and rounding (a shard's interval rounded up to a microsecond)
        limiter = backend.rate_limiter(
            args.name, rate=args.rate, per=args.per, burst=args.burst, shards=args.shards
        )
    # The read uses only the name and shards (the table stores no rate): any valid rate.
    reader = limiter or backend.rate_limiter(args.name, rate=args.shards, shards=args.shards)
    now = int(backend.clock.time() * _MICROS)
    tats = reader.state()
    if all(tat is None for tat in tats):
        sharded = "" if args.shards > 1 else "; a sharded limiter needs --shards K"
        raise CommandFailed(
            f"no rate limiter {args.name!r} in namespace {backend.namespace!r} (it has admitted "
            f"no call, or its item expired: a full bucket){sharded}"
        )
    shards = [_shard(tat, now, limiter) for tat in tats]
    out: dict[str, Any] = {"name": args.name, "shards": args.shards}
    if limiter is None:
        print(
            "dynacoord: note: the table stores when the bucket is full again, not the rate: pass "
            "--rate R [--per S] [--burst N] to see the calls left and the next admission",
            file=sys.stderr,
        )
    else:
        if args.burst is None:
            print(
                f"dynacoord: note: assumes burst {limiter.burst} (the library's default for "
                "this rate): pass --burst N for the one your code gives",
                file=sys.stderr,
            )
        out.update(rate=limiter.rate, per=limiter.per, burst=limiter.burst)
        out["available"] = sum(s["available"] for s in shards)
        # a call of one goes to one shard: the soonest any shard admits it
        out["next_admission_at"] = min(s["next_admission_at"] for s in shards)
        out["retry_after"] = min(s["retry_after"] for s in shards)
    if args.shards > 1:
        out["per_shard"] = [{"shard": i, **s} for i, s in enumerate(shards)]
    else:
        out["full_at"] = shards[0]["full_at"]
    return out


def _shard(tat: int | None, now: int, limiter: Any) -> dict[str, Any]:
    """One shard's bucket: when it is full again (epoch s), and with the limiter's settings the
    calls of one admitted at once now and the next admission of one (as the limiter decides)."""
    after = now if tat is None else max(tat, now)
    out: dict[str, Any] = {"full_at": round(after / _MICROS, 6)}
    if limiter is not None:
        interval = round(limiter.interval * _MICROS)
        tolerance = limiter.burst * interval // limiter.shards
        available = max(0, (now + tolerance - after) // interval)
        admit_at = now if available >= 1 else after + interval - tolerance
        out["available"] = int(available)
        out["next_admission_at"] = round(admit_at / _MICROS, 6)
        out["retry_after"] = round((admit_at - now) / _MICROS, 6)
    return out
