"""``dynacoord runs show|list|stalled|reconcile``."""

from __future__ import annotations

from typing import Any

from .common import Context, UsageError, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("runs", help="inspect workflow runs and reconcile stalled ones")
    sub = group.add_subparsers(dest="runs_command", required=True, metavar="COMMAND")

    show = add_command(sub, "show", _show, "show one run (exit 1 if it does not exist)")
    show.add_argument("run_id")

    list_ = add_command(sub, "list", _list, "list runs of one status, least recently updated first")
    list_.add_argument("--status", default="running", choices=("running", "completed", "failed"))
    list_.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")

    stalled = add_command(
        sub, "stalled", _stalled, "list running runs without an update for --older-than seconds"
    )
    stalled.add_argument("--older-than", type=float, required=True, help="seconds of silence")
    stalled.add_argument("--limit", type=int, help="at most this many")

    reconcile = add_command(
        sub,
        "reconcile",
        _reconcile,
        "hand each stalled run to an action: --fail it, or --queue-url: send it to SQS",
    )
    reconcile.add_argument("--older-than", type=float, required=True, help="seconds of silence")
    reconcile.add_argument("--limit", type=int, help="handle at most this many")
    action = reconcile.add_mutually_exclusive_group(required=True)
    action.add_argument("--fail", metavar="REASON", help="mark each stalled run failed")
    action.add_argument(
        "--queue-url",
        help='send {"run_id": ..., "context": ...} for each stalled run to this SQS queue',
    )


def _row(run: Any) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "status": run.status.value,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
        "ended_at": run.ended_at,
        "reconciles": run.reconciles,
        "context": run.context,
        "result": run.result,
        "error": run.error,
    }


def _line(run: Any) -> str:
    return f"{run.run_id}\t{run.status.value}\tupdated_at={run.updated_at:.3f}"


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UsageError("--limit must be >= 1")


def _show(ctx: Context) -> Any:
    from ..errors import RunNotFoundError

    run = ctx.backend().runs.get(ctx.args.run_id)
    if run is None:
        raise RunNotFoundError(f"run {ctx.args.run_id!r} not found", run_id=ctx.args.run_id)
    return _row(run)


def _list(ctx: Context) -> Any:
    _check_limit(ctx.args.limit)
    found = list(ctx.backend().runs.list(ctx.args.status, limit=ctx.args.limit))
    if not found:
        ctx.progress(f"no {ctx.args.status} runs")
    return [_row(r) for r in found] if ctx.json else [_line(r) for r in found]


def _stalled(ctx: Context) -> Any:
    _check_limit(ctx.args.limit)
    found = list(ctx.backend().runs.stalled(ctx.args.older_than, limit=ctx.args.limit))
    if not found:
        ctx.progress(f"no runs silent for {ctx.args.older_than:g}s")
    return [_row(r) for r in found] if ctx.json else [_line(r) for r in found]


def _reconcile(ctx: Context) -> Any:
    _check_limit(ctx.args.limit)
    runs = ctx.backend().runs
    if ctx.args.fail is not None:
        reason = ctx.args.fail

        def handler(run: Any) -> None:
            runs.fail(run.run_id, reason)

    else:
        from ..jobs import SQSJobQueue

        queue = SQSJobQueue(ctx.client("sqs"), ctx.args.queue_url)

        def handler(run: Any) -> None:
            queue.send({"run_id": run.run_id, "context": run.context})

    stats = runs.reconcile(ctx.args.older_than, handler, limit=ctx.args.limit)
    return {
        "scanned": stats.scanned,
        "stalled": stats.stalled,
        "reconciled": stats.reconciled,
        "failed": stats.failed,
        "failures": [f"{run_id}: {error}" for run_id, error in stats.failures],
    }
