"""``dynacoord checkpoints list|show|cleanup|delete``."""

from __future__ import annotations

from typing import Any

from .common import CommandFailed, Context, UsageError, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("checkpoints", help="inspect and clean up task checkpoints")
    sub = group.add_subparsers(dest="checkpoints_command", required=True, metavar="COMMAND")

    list_ = add_command(sub, "list", _list, "list a task's checkpoints, oldest first")
    list_.add_argument("task_id")
    list_.add_argument("--limit", type=int, help="show at most this many (the oldest)")
    list_.add_argument("--data", action="store_true", help="include each checkpoint's data")

    show = add_command(
        sub, "show", _show, "show one checkpoint by id (<task_id>@<sequence>) or a task's latest"
    )
    show.add_argument("checkpoint", help="a checkpoint id, or a task id with --latest")
    show.add_argument("--latest", action="store_true", help="show the task's newest checkpoint")

    cleanup = add_command(sub, "cleanup", _cleanup, "delete all but a task's newest checkpoints")
    cleanup.add_argument("task_id")
    cleanup.add_argument("--keep", type=int, required=True, help="how many newest to keep")

    delete = add_command(sub, "delete", _delete, "delete every checkpoint of a task")
    delete.add_argument("task_id")
    delete.add_argument("--yes", action="store_true", help="required: confirm the deletion")


def _summary(checkpoint: Any, *, data: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": checkpoint.id,
        "task_id": checkpoint.task_id,
        "sequence": checkpoint.sequence,
        "progress": checkpoint.progress,
        "created_at": checkpoint.created_at,
        "expires_at": checkpoint.expires_at,
    }
    if data:
        out["data"] = checkpoint.data
    return out


def _list(ctx: Context) -> Any:
    limit = ctx.args.limit
    if limit is not None and limit < 0:
        raise UsageError("--limit must be >= 0")
    found = ctx.backend().checkpoints.list(ctx.args.task_id, limit=limit)
    rows = [_summary(c, data=ctx.args.data) for c in found]
    if ctx.json:
        return rows
    if not rows:
        ctx.progress(f"no checkpoints for task {ctx.args.task_id!r}")
    return [
        f"{c.id}\tprogress={'-' if c.progress is None else f'{c.progress:g}'}\t"
        f"created_at={c.created_at:.3f}" + (f"\tdata={row['data']!r}" if ctx.args.data else "")
        for c, row in zip(found, rows, strict=True)
    ]


def _show(ctx: Context) -> Any:
    checkpoints = ctx.backend().checkpoints
    if ctx.args.latest:
        latest = checkpoints.load_latest(ctx.args.checkpoint)
        if latest is None:
            raise CommandFailed(f"task {ctx.args.checkpoint!r} has no checkpoints")
        return _summary(latest, data=True)
    if "@" not in ctx.args.checkpoint:
        raise UsageError(
            f"not a checkpoint id: {ctx.args.checkpoint!r} (expected '<task_id>@<sequence>', as "
            f"`checkpoints list` prints); a task's newest: `dynacoord checkpoints show "
            f"{ctx.args.checkpoint} --latest`"
        )
    return _summary(checkpoints.load(ctx.args.checkpoint), data=True)


def _cleanup(ctx: Context) -> Any:
    if ctx.args.keep < 0:
        raise UsageError("--keep must be >= 0")
    deleted = ctx.backend().checkpoints.cleanup(ctx.args.task_id, ctx.args.keep)
    return {"task_id": ctx.args.task_id, "deleted": deleted, "kept_at_most": ctx.args.keep}


def _delete(ctx: Context) -> Any:
    if not ctx.args.yes:
        raise UsageError(
            f"checkpoints delete removes every checkpoint of task {ctx.args.task_id!r}: add --yes"
        )
    deleted = ctx.backend().checkpoints.delete_all(ctx.args.task_id)
    return {"task_id": ctx.args.task_id, "deleted": deleted}
