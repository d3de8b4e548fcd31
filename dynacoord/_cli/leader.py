"""``dynacoord leader show``: who leads an election, its term and lease.

The leader of ``NAME`` is the lock ``leader:NAME`` (dynacoord.leader): ``lock show
leader:NAME`` shows the same item, and ``lock release leader:NAME --force`` is an operator's
step-down (the leader learns it at its next renewal, within its renew interval; until then it
still believes it leads, so a new leader elected meanwhile overlaps it: its term is what the
resource must check).
"""

from __future__ import annotations

from typing import Any

from .common import CommandFailed, Context, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("leader", help="inspect leader elections")
    sub = group.add_subparsers(dest="leader_command", required=True, metavar="COMMAND")

    show = add_command(
        sub, "show", _show, "show who leads, its term and lease end (exit 1 if nobody leads)"
    )
    show.add_argument("name")


def _show(ctx: Context) -> Any:
    from .._clock import now_ms
    from ..leader import leader_key

    backend = ctx.backend()
    key = leader_key(ctx.args.name)  # a bad name is refused before anything is sent
    # Leader.leader() is one consistent read of the lock item; the TTL only builds the object
    # (no campaign, no thread: nothing is written).
    info = backend.leader(ctx.args.name, ttl=60).leader()
    if info is None:
        raise CommandFailed(
            f"no leader of {ctx.args.name!r} in namespace {backend.namespace!r} (never elected, "
            "stepped down, or its lease ended)"
        )
    now = now_ms(backend.clock)
    return {
        "name": ctx.args.name,
        "leader": info.owner,
        "term": info.term,
        "expires_at": info.expires_at,
        "lease_left": round(max(0, info.expires_at_ms - now) / 1000, 3),
        "lock_key": key,
    }
