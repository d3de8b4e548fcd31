"""``dynacoord semaphore show``: who holds the permits of a leased semaphore."""

from __future__ import annotations

import sys
from typing import Any

from .common import CommandFailed, Context, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("semaphore", help="inspect leased counting semaphores")
    sub = group.add_subparsers(dest="semaphore_command", required=True, metavar="COMMAND")

    show = add_command(
        sub, "show", _show, "show a semaphore's holders (owner, fence, expiry); exit 1 if absent"
    )
    show.add_argument("name")
    show.add_argument(
        "--limit",
        type=int,
        default=None,
        help="the semaphore's limit, to show the free permits (the table does not store it: "
        "every caller gives its own)",
    )


def _show(ctx: Context) -> Any:
    from .._clock import now_ms
    from ..semaphore import MAX_LIMIT

    limit = ctx.args.limit
    if limit is not None and not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"--limit must be between 1 and {MAX_LIMIT}, got {limit}")
    backend = ctx.backend()
    # The read uses neither the limit nor the TTL (the table stores neither): any valid ones.
    semaphore = backend.semaphore(ctx.args.name, limit=limit or MAX_LIMIT, ttl=1)
    now = now_ms(backend.clock)
    state = semaphore.state()  # one consistent read; None: no item (unlike holders())
    if state is None:
        raise CommandFailed(
            f"no semaphore {ctx.args.name!r} in namespace {backend.namespace!r} (never "
            "acquired, or removed a day after its last permit's expiry)"
        )
    holders = state.holders
    out: dict[str, Any] = {
        "name": ctx.args.name,
        "limit": limit,
        "held": len(holders),
    }
    if limit is not None:
        out["free"] = max(0, limit - len(holders))
    else:
        print(
            "dynacoord: note: the table does not store a semaphore's limit (each caller gives "
            "its own): pass --limit N to see the free permits",
            file=sys.stderr,
        )
    out["last_fence"] = state.last_fence
    out["holders"] = [
        {
            "owner": permit.owner,
            "fence": permit.fence,
            "expires_at": permit.expires_at,
            "expires_in": round((permit.expires_at_ms - now) / 1000, 3),
        }
        for permit in holders
    ]
    return out
