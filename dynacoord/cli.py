"""The ``dynacoord`` command line.

Exit codes: 0 success, 1 failure (an error, or an operation that did not succeed such as a lock
not acquired), 2 usage error (nothing was sent), 130 interrupted (Ctrl-C); a reader that closes
stdout early (``| head``) ends the command quietly with 0. Errors are one line on
stderr starting ``dynacoord: error:``; results go to stdout (``--json`` for machine-readable
output); progress lines while waiting on AWS go to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from . import __version__
from ._cli.common import CommandFailed, Context, UsageError, emit, error_line

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
    "semaphore",
    "ratelimit",
    "leader",
    "local",
)


class _Parser(argparse.ArgumentParser):
    """argparse with dynacoord's one error line (``dynacoord: error: ...``, exit 2) instead of
    its usage block and ``PROG: error:``; every subcommand parser is one of these."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("dynacoord").strip()
        where = f"{command}: " if command else ""
        hint = f"see `{self.prog} --help`"
        self.exit(2, f"dynacoord: error: {where}{message} ({hint})\n")


#: The global options: (flags, keyword arguments, default at the top level). Every command also
#: takes them after its name (``dynacoord cache keys --table shop``), as the AWS CLI does.
_GLOBAL_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (
        ("--table",),
        {"help": "table name (env DYNACOORD_TABLE, default dynacoord)"},
    ),
    (
        ("--namespace",),
        {"help": "namespace (env DYNACOORD_NAMESPACE, default 'default'); also scopes iam-policy"},
    ),
    (
        ("--endpoint-url",),
        {
            "help": "DynamoDB endpoint, e.g. DynamoDB Local http://127.0.0.1:8000 (env "
            "DYNACOORD_ENDPOINT_URL, for DynamoDB only); given here, the stack commands send "
            "CloudFormation, CloudWatch and S3 to it too (LocalStack, moto's server)"
        },
    ),
    (("--region",), {"help": "AWS region (default: boto3's)"}),
    (
        ("--table-layout",),
        {
            "metavar": "JSON",
            "help": "the table's key and index names and key prefix as a JSON object, e.g. "
            '\'{"pk": "PK", "sk": "SK", "index": "GSI1", "index_pk": "GSI1PK", "index_sk": '
            '"GSI1SK", "prefix": "DC#"}\' (env DYNACOORD_TABLE_LAYOUT; default: dynacoord\'s '
            "own pk/sk/gsi1)",
        },
    ),
    (("--json",), {"action": "store_true", "help": "print results as JSON"}),
    (("-q", "--quiet"), {"action": "store_true", "help": "no progress lines"}),
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dynacoord",
        description="Coordination primitives on one DynamoDB table: manage the table, the stack "
        "and the stored state. The global options may also follow the command.",
    )
    for flags, options in _GLOBAL_OPTIONS:
        parser.add_argument(*flags, **options)
    parser.set_defaults(table=os.environ.get("DYNACOORD_TABLE") or "dynacoord")
    parser.add_argument(
        "--version", action="store_true", help="print the version (JSON with --json) and exit"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"dynacoord._cli.{name}")
        module.register(subparsers)
    _globals_after_commands(parser)
    return parser


def _globals_after_commands(parser: argparse.ArgumentParser) -> None:
    """Give every command parser below ``parser`` the global options, with their defaults
    suppressed: given after the command they win, not given they leave the value from before the
    command (or the top-level default) alone. A command's own option of the same name stays
    (``iam-policy --namespace`` names the policy's namespaces)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in dict.fromkeys(action.choices.values()):
            for flags, options in _GLOBAL_OPTIONS:
                if not any(flag in sub._option_string_actions for flag in flags):
                    sub.add_argument(*flags, **{**options, "default": argparse.SUPPRESS})
            _globals_after_commands(sub)


def _resolve_globals(args: argparse.Namespace) -> None:
    """Fill in the global options from the environment, remembering which were given.

    ``DYNACOORD_ENDPOINT_URL`` (what ``dynacoord local start`` prints) is DynamoDB's only: sent
    to CloudFormation it would reach DynamoDB Local. ``--endpoint-url`` on the command line is
    for every service the command calls (an emulator serving them all). ``DYNACOORD_NAMESPACE``
    counts as given, so that ``iam-policy`` narrows the policy to it.
    """
    from ._backend import warn_unknown_variables

    warn_unknown_variables()  # a misspelt DYNACOORD_NAMESPACE would read namespace default
    env_namespace = os.environ.get("DYNACOORD_NAMESPACE") or None
    args.namespace_given = args.namespace is not None or env_namespace is not None
    args.namespace = args.namespace or env_namespace or "default"
    args.aws_endpoint_url = args.endpoint_url or None
    args.endpoint_url = args.endpoint_url or os.environ.get("DYNACOORD_ENDPOINT_URL") or None
    for url, source in (
        (args.aws_endpoint_url, "--endpoint-url"),
        (args.endpoint_url, "DYNACOORD_ENDPOINT_URL"),
    ):
        if url is not None and "://" not in url:
            raise UsageError(
                f"{source} {url!r} has no scheme: write http://{url} (DynamoDB Local) or "
                f"https://{url}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader stopped early (`dynacoord stack template | head -1`): it took what it
        # wanted, so exit 0 without a traceback. stdout now points at /dev/null, or the
        # interpreter's final flush of what is still buffered would raise the same error again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # not a real file (tests): nothing will flush into it
            pass
        return 0


class _WarningLines(logging.Formatter):
    """A library log record as a ``dynacoord: warning:`` line, or ``dynacoord: error:`` for a
    record at ERROR or above (an event ``outbox work`` marked failed): a reader scanning for
    errors finds it; the command's own last line still says what it means for its exit."""

    def format(self, record: logging.LogRecord) -> str:
        level = "error" if record.levelno >= logging.ERROR else "warning"
        return f"dynacoord: {level}: {record.getMessage()}"


def _show_library_warnings() -> None:
    """The library's warnings (a table whose TTL never sweeps its items, a handler that failed)
    as ``dynacoord: warning: ...`` lines on stderr, unless the process set up logging itself
    (then they go where it says). Without this, logging's last resort prints them unprefixed."""
    library = logging.getLogger("dynacoord")
    if logging.getLogger().handlers or library.handlers:
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_WarningLines())
    library.addHandler(handler)


def _main(argv: Sequence[str] | None) -> int:
    _show_library_warnings()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on usage errors and 0 on --help
        return int(exc.code or 0)
    if args.version:
        if args.json:
            print(json.dumps({"version": __version__}))
        else:
            print(f"dynacoord {__version__}")
        return 0
    if args.command is None:
        print("dynacoord: error: a COMMAND is required (see `dynacoord --help`)", file=sys.stderr)
        return 2
    ctx = Context(args)
    try:
        _resolve_globals(args)
        result = args.handler(ctx)
    except UsageError as exc:
        print(f"dynacoord: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dynacoord: error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        raise  # a closed stdout: main's quiet exit, not an error line
    except CommandFailed as exc:
        emit(ctx, exc.result)
        print(error_line(exc), file=sys.stderr)
        return 1
    except Exception as exc:
        code, line = _failure(exc, str(args.table))
        print(line, file=sys.stderr)
        return code
    emit(ctx, result)
    return 0


def _failure(exc: Exception, table: str) -> tuple[int, str]:
    """The exit code and the error line of an exception a command raised."""
    from .errors import ConfigurationError

    name = type(exc).__name__
    module = type(exc).__module__
    if name == "NoRegionError" and module.startswith("botocore"):
        other = [v for v in ("DYNACOORD_REDIS_URL", "DYNACOORD_MONGODB_URI") if os.environ.get(v)]
        # a Redis or MongoDB user trying the CLI on their store: the region is not the problem
        also = (
            f" ({other[0]} is set, but the CLI works on DynamoDB only; Redis and MongoDB are "
            "used from Python: docs/redis.md, docs/backends.md)"
            if other
            else ""
        )
        return 2, (
            "dynacoord: error: no AWS region: pass --region REGION (or set AWS_REGION or "
            f"AWS_DEFAULT_REGION){also}; nothing was sent"
        )
    if name in ("NoCredentialsError", "PartialCredentialsError") and module.startswith("botocore"):
        return 1, f"dynacoord: error: no AWS credentials ({exc}): configure them (AWS_PROFILE, ...)"
    if name == "ResponseParserError" and module.startswith("botocore"):
        return 1, (
            f"dynacoord: error: the endpoint answered something that is not the service's "
            f"response (is --endpoint-url pointing at DynamoDB Local for a stack command?): "
            f"{str(exc)[:300]}"
        )
    if not isinstance(exc, ConfigurationError) and (
        getattr(exc.__cause__, "operation_name", None) == "DescribeTable"
    ):
        # the backend's first-use check was refused: its message offers verify=False, a Python
        # option; say what the CLI needs instead
        error = getattr(exc.__cause__, "response", {}).get("Error", {})
        return 1, (
            f"dynacoord: error: cannot describe DynamoDB table {table!r} before its first use: "
            f"{error.get('Message') or exc}. The CLI checks the table first and needs "
            "dynamodb:DescribeTable on it (the policy of `dynacoord iam-policy` and the stack's "
            "AccessPolicy grant it)"
        )
    if isinstance(exc, ConfigurationError) and getattr(exc, "problems", None) is not None:
        return 1, error_line(exc)  # the table is wrong (first-use check): not the command line
    if isinstance(exc, (TypeError, ValueError)):
        return 2, error_line(exc)  # a bad value in the command line: nothing was sent
    return 1, error_line(exc)
