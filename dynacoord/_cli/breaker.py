"""``dynacoord breaker status|reset|trip``."""

from __future__ import annotations

import sys
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
        default=None,
        help="the breaker's reset_timeout in seconds, to compute retry_after (the table does "
        "not store it; default 30, the library's, with a note)",
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


#: the library's default reset_timeout (BreakerOptions), assumed when none is given
_DEFAULT_RESET_TIMEOUT = 30.0


def _status(ctx: Context) -> Any:
    given = ctx.args.reset_timeout
    reset_timeout = _DEFAULT_RESET_TIMEOUT if given is None else given
    breaker = ctx.backend().breaker(ctx.args.name, reset_timeout=reset_timeout)
    status = breaker.status()
    if given is None and status.retry_after is not None:
        # the stored state has no reset timeout: retry_after is only as right as this guess
        print(
            f"dynacoord: note: retry_after assumes a reset timeout of {reset_timeout:g} s (the "
            "library's default; the table does not store the breaker's): pass --reset-timeout S "
            "for the one your code uses",
            file=sys.stderr,
        )
    return {**_status_dict(status), "reset_timeout": reset_timeout}


def _reset(ctx: Context) -> Any:
    breaker = ctx.backend().breaker(ctx.args.name)
    breaker.reset()
    return _status_dict(breaker.status())


def _trip(ctx: Context) -> Any:
    breaker = ctx.backend().breaker(ctx.args.name)
    breaker.trip()
    return _status_dict(breaker.status())
