"""``dynacoord breaker status|reset|trip``."""

from __future__ import annotations

from typing import Any

from .common import Context, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("breaker", help="inspect and operate circuit breakers")
    sub = group.add_subparsers(dest="breaker_command", required=True, metavar="COMMAND")

    status = add_command(sub, "status", _status, "show a breaker's stored state")
    status.add_argument("name")
    status.add_argument(
        "--reset-timeout",
        type=float,
        default=30.0,
        help="the breaker's reset_timeout in seconds, to compute retry_after (default 30)",
    )

    reset = add_command(sub, "reset", _reset, "close a breaker and forget its failures")
    reset.add_argument("name")

    trip = add_command(sub, "trip", _trip, "open a breaker now (fresh reset timeout)")
    trip.add_argument("name")


def _status_dict(status: Any) -> dict[str, Any]:
    return {
        "name": status.name,
        "state": status.state.value,
        "failures": status.failures,
        "opened_at": status.opened_at,
        "retry_after": status.retry_after,
    }


def _status(ctx: Context) -> Any:
    breaker = ctx.backend().breaker(ctx.args.name, reset_timeout=ctx.args.reset_timeout)
    return _status_dict(breaker.status())


def _reset(ctx: Context) -> Any:
    breaker = ctx.backend().breaker(ctx.args.name)
    breaker.reset()
    return _status_dict(breaker.status())


def _trip(ctx: Context) -> Any:
    breaker = ctx.backend().breaker(ctx.args.name)
    breaker.trip()
    return _status_dict(breaker.status())
