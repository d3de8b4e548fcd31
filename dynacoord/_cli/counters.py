"""``dynacoord counters get|incr|delete``."""

from __future__ import annotations

from typing import Any

from .common import CommandFailed, Context, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser(
        "counters", help="inspect and change coordination counters, flags and joins"
    )
    sub = group.add_subparsers(dest="counters_command", required=True, metavar="COMMAND")

    get = add_command(sub, "get", _get, "show a counter, flag or join (exit 1 if absent)")
    get.add_argument("key")

    incr = add_command(sub, "incr", _incr, "increment a counter atomically, print the new value")
    incr.add_argument("key")
    incr.add_argument("--by", type=int, default=1, help="amount to add (default 1, may be < 0)")
    incr.add_argument("--ttl", type=float, help="expiry in seconds when the counter is created")

    delete = add_command(sub, "delete", _delete, "delete a counter, flag or join")
    delete.add_argument("key")


def _get(ctx: Context) -> Any:
    item = ctx.backend().counters.item(ctx.args.key)
    if item is None:
        raise CommandFailed(f"no counter, flag or join {ctx.args.key!r} (missing or expired)")
    out: dict[str, Any] = {
        "key": ctx.args.key,
        "kind": item.kind,
        "value": item.value,
        "expires_at": None if item.expires_at_ms is None else item.expires_at_ms / 1000,
    }
    if item.kind == "join":
        out["expected"] = item.expected
        out["members"] = sorted(item.members)
    return out


def _incr(ctx: Context) -> Any:
    value = ctx.backend().counters.increment(ctx.args.key, ctx.args.by, ttl=ctx.args.ttl)
    return {"key": ctx.args.key, "value": value}


def _delete(ctx: Context) -> Any:
    if not ctx.backend().counters.delete(ctx.args.key):
        raise CommandFailed(f"no counter, flag or join {ctx.args.key!r} to delete")
    return {"key": ctx.args.key, "deleted": True}
