"""The ``dynacoord`` command line.

Exit codes: 0 success, 1 failure (an error, or an operation that did not succeed such as a lock
not acquired), 2 usage error. Errors are one line on stderr; results go to stdout (``--json`` for
machine-readable output); progress lines while waiting on AWS go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import __version__
from ._cli.common import Context, UsageError, emit, env_default, error_line

__all__ = ["build_parser", "main"]

#: Command-group modules under dynacoord._cli; each has ``register(subparsers)``.
COMMAND_MODULES = (
    "locks",
    "provision",
    "cache",
    "breaker",
    "checkpoints",
    "outbox",
    "counters",
    "runs",
    "local",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dynacoord",
        description="Coordination primitives on one DynamoDB table: manage the table, the stack "
        "and the stored state.",
    )
    parser.add_argument(
        "--table",
        default=env_default("DYNACOORD_TABLE", "dynacoord"),
        help="table name (env DYNACOORD_TABLE, default dynacoord)",
    )
    parser.add_argument(
        "--namespace",
        default=env_default("DYNACOORD_NAMESPACE", "default"),
        help="namespace (env DYNACOORD_NAMESPACE, default 'default')",
    )
    parser.add_argument(
        "--endpoint-url",
        default=env_default("DYNACOORD_ENDPOINT_URL"),
        help="DynamoDB endpoint, e.g. DynamoDB Local (env DYNACOORD_ENDPOINT_URL)",
    )
    parser.add_argument("--region", default=None, help="AWS region (default: boto3's)")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"dynacoord._cli.{name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    ctx = Context(args)
    try:
        result = args.handler(ctx)
    except UsageError as exc:
        print(f"dynacoord: usage: {exc}", file=sys.stderr)
        return 2
    except (TypeError, ValueError) as exc:
        print(error_line(exc), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dynacoord: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        print(error_line(exc), file=sys.stderr)
        return 1
    emit(ctx, result)
    return 0
