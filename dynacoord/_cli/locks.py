"""``dynacoord lock acquire|release|show``."""

from __future__ import annotations

import logging
from typing import Any

from .common import CommandFailed, Context, UsageError, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("lock", help="inspect and manage distributed locks")
    sub = group.add_subparsers(dest="lock_command", required=True, metavar="COMMAND")

    acquire = add_command(sub, "acquire", _acquire, "acquire a lock and print its lease")
    acquire.add_argument("key")
    acquire.add_argument("--ttl", type=float, required=True, help="lease TTL in seconds")
    acquire.add_argument("--owner", help="owner id (default: a unique id)")
    acquire.add_argument("--timeout", type=float, default=0.0, help="seconds to keep trying")

    release = add_command(sub, "release", _release, "release a lock (owner-checked, or --force)")
    release.add_argument("key")
    release.add_argument("--owner", help="the owner that holds the lock")
    release.add_argument("--fence", type=int, help="the fence of the lease to release")
    release.add_argument("--force", action="store_true", help="release whoever holds it")

    show = add_command(sub, "show", _show, "show who holds a lock")
    show.add_argument("key")


def _lease_dict(info: Any) -> dict[str, Any]:
    return {
        "key": info.key,
        "owner": info.owner,
        "fence": info.fence,
        "expires_at": info.expires_at,
    }


def _acquire(ctx: Context) -> Any:
    locks = ctx.backend().locks
    lease = locks.acquire(
        ctx.args.key, ctx.args.ttl, owner=ctx.args.owner, timeout=ctx.args.timeout
    )
    if lease is None:
        holder = locks.get(ctx.args.key)
        detail = f" (held by {holder.owner!r})" if holder else ""
        raise CommandFailed(f"lock {ctx.args.key!r} not acquired{detail}")
    return _lease_dict(lease)


def _release(ctx: Context) -> Any:
    locks = ctx.backend().locks
    if ctx.args.force:
        released = locks.force_release(ctx.args.key)
    else:
        if not ctx.args.owner or ctx.args.fence is None:
            raise UsageError("release needs --owner and --fence (or --force)")
        from ..locks import Lease, LockInfo

        lease = Lease(locks, LockInfo(ctx.args.key, ctx.args.owner, ctx.args.fence, 0), 1)
        # The library logs a lost release as a warning for long-running code; here the error
        # line below says it (and why), so the log line would only say it twice.
        lock_log = logging.getLogger("dynacoord.locks")
        level = lock_log.level
        lock_log.setLevel(logging.ERROR)
        try:
            released = lease.release()
        finally:
            lock_log.setLevel(level)
    if not released:
        # Say precisely why: a free lock, another holder, or the right owner with another fence.
        holder = locks.get(ctx.args.key)
        if holder is None:
            raise CommandFailed(f"lock {ctx.args.key!r} is not held (nothing to release)")
        if ctx.args.force:  # pragma: no cover - force_release frees any live holder
            raise CommandFailed(f"lock {ctx.args.key!r} could not be released")
        if holder.owner == ctx.args.owner:
            raise CommandFailed(
                f"lock {ctx.args.key!r} is held by {holder.owner!r} with fence {holder.fence}, "
                f"not {ctx.args.fence}"
            )
        raise CommandFailed(f"lock {ctx.args.key!r} is held by {holder.owner!r}, not by that owner")
    return {"key": ctx.args.key, "released": True}


def _show(ctx: Context) -> Any:
    info = ctx.backend().locks.get(ctx.args.key)
    if info is None:
        return {"key": ctx.args.key, "held": False}
    return {"held": True, **_lease_dict(info)}
