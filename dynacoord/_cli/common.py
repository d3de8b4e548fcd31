"""Shared plumbing of the CLI: the backend built from global options, output, and usage errors."""

from __future__ import annotations

import argparse
import base64
import dataclasses
import decimal
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ..errors import DynacoordError

__all__ = ["Command", "Context", "UsageError", "add_command", "emit", "parse_value"]


class UsageError(Exception):
    """Bad command-line input: exit code 2."""


class CommandFailed(Exception):  # noqa: N818 (a CLI outcome, not a library error)
    """The command ran and its answer is "no" (absent key, lock held, ...): exit code 1.

    ``result``, when given, is printed on stdout as a successful command's would be (the counts
    of an ``outbox work --once`` that marked events failed), before the error line."""

    def __init__(self, message: str, *, result: Any = None) -> None:
        super().__init__(message)
        self.result = result


@dataclasses.dataclass
class Context:
    """What a command handler gets: parsed args and lazily built AWS objects."""

    args: argparse.Namespace

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    def progress(self, message: str) -> None:
        """A progress line on stderr (never on stdout, which stays machine-readable)."""
        if not self.args.quiet:
            print(message, file=sys.stderr, flush=True)

    def client(self, service: str = "dynamodb") -> Any:
        import boto3
        from botocore.config import Config

        from ..backends.dynamodb import resilient_client_config

        # DYNACOORD_ENDPOINT_URL is DynamoDB's (and its streams'); only --endpoint-url given on
        # the command line also applies to other services (see cli._resolve_globals).
        if service in ("dynamodb", "dynamodbstreams"):
            endpoint = self.args.endpoint_url
        else:
            endpoint = getattr(self.args, "aws_endpoint_url", None)
        factory: Any = boto3.client
        # DynamoDB: from_env's client, so a CLI call's counting slot lasts its short window
        config = (
            resilient_client_config()
            if service in ("dynamodb", "dynamodbstreams")
            else Config(retries={"max_attempts": 8, "mode": "adaptive"})
        )
        return factory(
            service,
            region_name=self.args.region or None,
            endpoint_url=endpoint or None,
            config=config,
        )

    @property
    def table_name(self) -> str:
        return str(self.args.table)

    def layout(self) -> Any:
        """The table's :class:`~dynacoord.TableLayout`: ``--table-layout`` (the table and
        iam-policy commands) or ``DYNACOORD_TABLE_LAYOUT`` (JSON; unset: dynacoord's own)."""
        from .._table_schema import TableLayout

        text = getattr(self.args, "table_layout", None) or os.environ.get("DYNACOORD_TABLE_LAYOUT")
        return TableLayout.from_json(text)

    def backend(self) -> Any:
        from ..backends.dynamodb import DynamoDBBackend

        return DynamoDBBackend(
            self.client(),
            table_name=self.args.table,
            namespace=self.args.namespace,
            layout=self.layout(),
        )


Handler = Callable[[Context], Any]
Command = tuple[str, Handler]


#: ``--json`` and ``-q`` may also follow the command (``dynacoord lock show k --json``). Their
#: defaults are suppressed here, so when they are not given after the command the value given
#: before it (or the global default) stands.
_OUTPUT_FLAGS = argparse.ArgumentParser(add_help=False)
_OUTPUT_FLAGS.add_argument(
    "--json", action="store_true", default=argparse.SUPPRESS, help="print results as JSON"
)
_OUTPUT_FLAGS.add_argument(
    "-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help="no progress lines"
)


def add_command(
    subparsers: Any, name: str, handler: Handler, help_text: str
) -> argparse.ArgumentParser:
    """Add a leaf command whose handler returns a JSON-able result (printed by :func:`emit`)."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        name, help=help_text, description=help_text, parents=[_OUTPUT_FLAGS]
    )
    parser.set_defaults(handler=handler)
    return parser


def _default(obj: Any) -> Any:
    # Lossless: a Decimal with digits after the point keeps them (a float would turn 1.10 into
    # 1.1 and round 38-digit values), bytes keep every byte (a utf-8 decode would replace some).
    if isinstance(obj, decimal.Decimal):
        exponent = obj.as_tuple().exponent
        if isinstance(exponent, int) and exponent >= 0:
            return int(obj)
        return {"$decimal": str(obj)}
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "value") and isinstance(obj.value, str):  # enums
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def emit(ctx: Context, result: Any) -> None:
    """Print a result: JSON with ``--json``, else a readable rendering."""
    if result is None:
        return
    if ctx.json:
        print(json.dumps(result, default=_default, indent=2, sort_keys=True, ensure_ascii=False))
        return
    if isinstance(result, str):
        print(result)
        return
    if isinstance(result, dict):
        for key, value in result.items():
            rendered = value if isinstance(value, str) else json.dumps(value, default=_default)
            print(f"{key}: {rendered}")
        return
    if isinstance(result, list):
        for entry in result:
            print(entry if isinstance(entry, str) else json.dumps(entry, default=_default))
        return
    print(json.dumps(result, default=_default))


def parse_value(text: str) -> Any:
    """A CLI value: JSON when it parses as JSON, else the plain string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def env_default(name: str, fallback: str | None = None) -> str | None:
    return os.environ.get(name) or fallback


def error_line(exc: BaseException) -> str:
    # One prefix for every error; an exception dynacoord did not raise on purpose also names
    # its type, which is what a bug report needs.
    if isinstance(exc, (DynacoordError, CommandFailed)):
        return f"dynacoord: error: {exc}"
    return f"dynacoord: error: {type(exc).__name__}: {exc}"
