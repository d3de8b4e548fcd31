"""``dynacoord cache get|set|delete|keys|clear``."""

from __future__ import annotations

import json
from typing import Any

from .common import CommandFailed, Context, UsageError, _default, add_command, parse_value

_MISSING = object()


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("cache", help="inspect and manage cache entries")
    sub = group.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")

    get = add_command(sub, "get", _get, "print a cached value (exit 1 if absent or expired)")
    get.add_argument("key")

    set_ = add_command(sub, "set", _set, "store a value (JSON if it parses as JSON, else text)")
    set_.add_argument("key")
    set_.add_argument("value")
    set_.add_argument("--ttl", type=float, help="seconds until the entry expires (default: never)")
    set_.add_argument("--string", action="store_true", help="store VALUE as text, never as JSON")
    set_.add_argument(
        "--nx", action="store_true", help="only if the key is absent or expired (exit 1 if not)"
    )

    delete = add_command(sub, "delete", _delete, "delete entries")
    delete.add_argument("keys", nargs="+", metavar="key")

    keys = add_command(sub, "keys", _keys, "list live keys matching a glob pattern")
    keys.add_argument("pattern", nargs="?", default="*", help="glob (default '*')")

    clear = add_command(sub, "clear", _clear, "delete every entry of the namespace")
    clear.add_argument("--yes", action="store_true", help="confirm: this deletes every entry")


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, default=_default, ensure_ascii=False)


def _get(ctx: Context) -> Any:
    value = ctx.backend().cache().get(ctx.args.key, _MISSING)
    if value is _MISSING:
        raise CommandFailed(f"cache key {ctx.args.key!r} not found (absent or expired)")
    if ctx.json:
        return {"key": ctx.args.key, "value": value}
    return _render(value)


def _set(ctx: Context) -> Any:
    value = ctx.args.value if ctx.args.string else parse_value(ctx.args.value)
    cache = ctx.backend().cache()
    if ctx.args.nx:
        if not cache.add(ctx.args.key, value, ttl=ctx.args.ttl):
            raise CommandFailed(f"cache key {ctx.args.key!r} already holds a live value")
    else:
        cache.set(ctx.args.key, value, ttl=ctx.args.ttl)
    return {"key": ctx.args.key, "stored": True, "ttl": ctx.args.ttl}


def _delete(ctx: Context) -> Any:
    cache = ctx.backend().cache()
    results = {key: cache.delete(key) for key in ctx.args.keys}
    if ctx.json:
        return [{"key": key, "deleted": deleted} for key, deleted in results.items()]
    return [f"{key}\t{'deleted' if deleted else 'absent'}" for key, deleted in results.items()]


def _keys(ctx: Context) -> Any:
    found = ctx.backend().cache().keys(ctx.args.pattern)
    if not found:
        ctx.progress(f"no keys match {ctx.args.pattern!r}")
    return found


def _clear(ctx: Context) -> Any:
    if not ctx.args.yes:
        raise UsageError(
            f"clear deletes every cache entry of namespace {ctx.args.namespace!r}: add --yes"
        )
    removed = ctx.backend().cache().clear()
    return {"namespace": ctx.args.namespace, "removed": removed}
