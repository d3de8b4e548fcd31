"""``dynacoord outbox stats|failed|pending|show|retry [--group G | --all]|work``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from .common import CommandFailed, Context, UsageError, add_command


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("outbox", help="inspect the outbox, retry failed events, work")
    sub = group.add_subparsers(dest="outbox_command", required=True, metavar="COMMAND")

    add_command(sub, "stats", _stats, "count pending (and due), in-flight and failed events")

    failed = add_command(sub, "failed", _failed, "list failed events, oldest failure first")
    failed.add_argument(
        "--limit",
        type=_limit,
        default=100,
        help="at most this many (default 100; a note on stderr when more are left)",
    )

    pending = add_command(sub, "pending", _pending, "list pending events, earliest due first")
    pending.add_argument(
        "--limit",
        type=_limit,
        default=100,
        help="at most this many (default 100; a note on stderr when more are left)",
    )
    pending.add_argument("--due", action="store_true", help="only events due now")

    show = add_command(sub, "show", _show, "show one event and its delivery state")
    show.add_argument("event_id")

    retry = add_command(
        sub,
        "retry",
        _retry,
        "put failed events back to pending (unknown ids are reported), or with --group an "
        "ordered group's failed events at the group's end, in their order",
    )
    retry.add_argument("event_ids", nargs="*", metavar="EVENT_ID")
    retry.add_argument(
        "--group",
        help="every failed ordered event of this group, delivered again in its original order "
        "after the group's pending events (reads the whole failed index)",
    )
    retry.add_argument(
        "--all",
        action="store_true",
        help="every failed event, page after page (an ordered group is retried whole, in its "
        "order)",
    )
    retry.add_argument(
        "--type",
        dest="event_types",
        action="append",
        metavar="TYPE",
        help="only failed events of this type (repeatable; implies --all)",
    )
    retry.add_argument(
        "--older-than",
        type=_seconds,
        metavar="S",
        help="only events that failed at least S seconds ago (implies --all)",
    )

    work = add_command(
        sub,
        "work",
        _work,
        "deliver due events to handlers or a relay; loops until SIGINT/SIGTERM unless --once "
        "or --until-idle",
    )
    mode = work.add_mutually_exclusive_group()
    mode.add_argument(
        "--once", action="store_true", help="one poll (one batch), then exit (cron, Lambda)"
    )
    mode.add_argument(
        "--until-idle",
        action="store_true",
        help="batch after batch until nothing is due, then exit with the counts (a drain; "
        "events retried later are not waited for)",
    )
    work.add_argument(
        "--handler",
        dest="handler_specs",
        action="append",
        default=[],
        metavar="[TYPE=]MODULE:FUNCTION",
        help="a handler to import; TYPE= limits it to one event type (repeatable); without "
        "TYPE=, MODULE:HANDLERS may name a mapping of event types to handlers (the relay's)",
    )
    work.add_argument("--sqs-queue-url", help="relay every event to this SQS queue")
    work.add_argument("--sns-topic-arn", help="relay every event to this SNS topic")
    work.add_argument("--event-bus", help="relay every event to this EventBridge bus")
    work.add_argument("--event-source", default="dynacoord", help="EventBridge source")
    work.add_argument("--batch-size", type=int, default=25)
    work.add_argument("--lease", type=float, default=30.0, help="claim lease in seconds")
    work.add_argument("--max-attempts", type=int, default=5)
    work.add_argument("--poll-interval", type=float, default=1.0)
    work.add_argument(
        "--on-missing-handler",
        choices=("leave", "fail", "retry", "skip"),
        default=None,
        help="what becomes of an event whose type no --handler names: leave it pending for a "
        "worker that has its handler (given back, no attempt counted), fail it at once, retry "
        "it (backoff; its attempts count, then failed) or skip it (completed, not delivered); "
        "required when every --handler names a TYPE (no catch-all handler)",
    )
    work.add_argument(
        "--per-event",
        action="store_true",
        help="claim and complete one event per request (batch_claim=False: more requests, "
        "the same write units per event on DynamoDB)",
    )


def _stats(ctx: Context) -> Any:
    return ctx.backend().outbox.stats().as_dict()


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _listed(ctx: Context, what: str, records: list[Any]) -> list[Any]:
    """The first ``--limit`` of ``records`` (one more was read): a listing cut there says so on
    stderr, or a reader takes the first 100 for all of them."""
    limit = ctx.args.limit
    if len(records) > limit:
        print(
            f"dynacoord: note: the first {limit} {what} events are listed and more are left: "
            "give a larger --limit, or see the counts with `dynacoord outbox stats`",
            file=sys.stderr,
        )
    return [r.as_dict() for r in records[:limit]]


def _failed(ctx: Context) -> Any:
    records = ctx.backend().outbox.failed(limit=ctx.args.limit + 1)
    return _listed(ctx, "failed", records)


def _pending(ctx: Context) -> Any:
    outbox = ctx.backend().outbox
    records = outbox.pending(limit=ctx.args.limit + 1, due_only=ctx.args.due)
    return _listed(ctx, "due" if ctx.args.due else "pending", records)


def _show(ctx: Context) -> Any:
    record = ctx.backend().outbox.get(ctx.args.event_id)
    if record is None:
        raise CommandFailed(f"no event {ctx.args.event_id!r} (never published, or expired)")
    return record.as_dict()


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _retry(ctx: Context) -> Any:
    ids, group = ctx.args.event_ids, ctx.args.group
    bulk = ctx.args.all or ctx.args.event_types or ctx.args.older_than is not None
    if [bool(ids), group is not None, bool(bulk)].count(True) != 1:
        raise UsageError(
            "outbox retry takes EVENT_ID..., --group GROUP or --all [--type T] [--older-than S], "
            "one of them"
        )
    if bulk:
        return _retry_all(ctx)
    if group is not None:
        moved = ctx.backend().outbox.retry_report(group=group)
        if moved.not_failed:
            raise CommandFailed(
                f"retried {len(moved.retried)}; moved by someone else meanwhile: "
                f"{', '.join(moved.not_failed)}"
            )
        return {"retried": moved.retried}
    with _unlogged("dynacoord.outbox.publisher", "retry: no such events"):
        report = ctx.backend().outbox.retry_report(ids)
    if report.not_found or report.not_failed:
        parts = [f"retried {len(report.retried)}"]
        if report.not_found:
            parts.append(f"not found: {', '.join(report.not_found)}")
        if report.not_failed:
            parts.append(f"not failed: {', '.join(report.not_failed)}")
        raise CommandFailed("; ".join(parts))
    return {"retried": report.retried}


@contextlib.contextmanager
def _unlogged(logger_name: str, prefix: str) -> Iterator[None]:
    """Drop the records of ``logger_name`` whose message starts with ``prefix`` meanwhile: the
    command says the same in its own error line, and two lines for one fact read as two."""

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(prefix)

    target = logging.getLogger(logger_name)
    target.addFilter(keep)
    try:
        yield
    finally:
        target.removeFilter(keep)


#: failed events read per round of ``retry --all``
_RETRY_PAGE = 100


def _retry_all(ctx: Context) -> Any:
    """Every failed event that matches, through the public listing and retry: each round lists
    the failed events oldest failure first (``Outbox.failed``) and retries the matching ones by
    id (``retry_report``), an ordered one's group whole (``retry_report(group=...)``, its order
    kept). Retried events leave the failed index, so the next round's listing starts with what
    is left; the events a filter passes over are skipped by id (each round reads them again),
    and an event is retried at most once per run (a worker may fail it again meanwhile)."""
    from .._clock import now_ms

    outbox = ctx.backend().outbox
    types = set(ctx.args.event_types or ())
    older_than = ctx.args.older_than
    cutoff_ms = None
    if older_than is not None:
        cutoff_ms = now_ms(outbox.clock) - int(older_than * 1000)
    seen: set[str] = set()
    groups: list[str] = []
    retried = others = 0
    while True:
        limit = len(seen) + _RETRY_PAGE
        listed = outbox.failed(limit=limit)
        ids: list[str] = []
        new_groups: list[str] = []
        too_new = False
        for record in listed:
            if record.id in seen:
                continue
            if cutoff_ms is not None and record.due_at_ms > cutoff_ms:
                too_new = True  # oldest failure first: every later one is newer still
                break
            seen.add(record.id)
            if types and record.type not in types:
                continue
            event = record.event
            if event.ordered and event.group is not None:
                if event.group not in groups and event.group not in new_groups:
                    new_groups.append(event.group)
            else:
                ids.append(record.id)
        if ids:
            report = outbox.retry_report(ids)
            retried += len(report.retried)
            others += len(report.not_found) + len(report.not_failed)
        for name in new_groups:
            moved = outbox.retry_report(group=name)
            seen.update(moved.retried)
            retried += len(moved.retried)
            others += len(moved.not_failed)
            groups.append(name)
        if ids or new_groups:
            ctx.progress(f"retried {retried} failed event(s) so far ...")
        # A full listing holds at least a page of events not seen before (the limit is the
        # seen ones plus a page), so every round makes progress until the index is read.
        if too_new or len(listed) < limit:
            break
    return {"retried": retried, "groups": groups, "moved_by_someone_else": others}


def _import(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"--handler needs MODULE:FUNCTION, got {spec!r}")
    # Like `python -m`: a module in the current directory is importable without PYTHONPATH=.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot import handler {spec!r}: {exc}") from exc
    if isinstance(target, Mapping):
        # the relay's RelayHandlers shape (MODULE:HANDLERS): event types to handlers, so the
        # runbook's drain runs the relay's own handlers
        bad = [str(t) for t, h in target.items() if not isinstance(t, str) or not callable(h)]
        if bad:
            raise UsageError(f"handler mapping {spec!r}: not a type -> callable: {bad}")
        return target
    if not callable(target):
        raise UsageError(f"handler {spec!r} is neither callable nor a mapping of event types")
    return target


def _handlers(ctx: Context) -> Any:
    args = ctx.args
    relays: list[Any] = []
    if args.sqs_queue_url:
        from ..relays import SQSRelay

        relays.append(SQSRelay(ctx.client("sqs"), args.sqs_queue_url))
    if args.sns_topic_arn:
        from ..relays import SNSRelay

        relays.append(SNSRelay(ctx.client("sns"), args.sns_topic_arn))
    if args.event_bus:
        from ..relays import EventBridgeRelay

        relays.append(
            EventBridgeRelay(ctx.client("events"), args.event_bus, source=args.event_source)
        )
    if len(relays) + (1 if args.handler_specs else 0) != 1:
        raise UsageError(
            "give either --handler (repeatable) or exactly one of --sqs-queue-url, "
            "--sns-topic-arn, --event-bus"
        )
    if relays:
        return relays[0]
    mapping: dict[str, Any] = {}
    for spec in args.handler_specs:
        event_type, sep, target = spec.partition("=")
        if not sep:
            event_type, target = "*", spec
        handler = _import(target)
        found = dict(handler) if isinstance(handler, Mapping) and not sep else {event_type: handler}
        if sep and isinstance(handler, Mapping):
            raise UsageError(f"--handler {spec!r}: TYPE= takes a callable, not a mapping")
        for name, function in found.items():
            if name in mapping:
                raise UsageError(f"two handlers for event type {name!r}")
            mapping[name] = function
    if "*" not in mapping and args.on_missing_handler is None:
        # The worker claims due events of every type; with handlers for some types only, the
        # others would be failed (or retried, or completed undelivered) by whatever default
        # applied. None leaves them alone, so the operator chooses before anything is claimed.
        named = ", ".join(sorted(mapping))
        raise UsageError(
            f"handlers for {named} only: events of other types would be claimed too; add "
            "--on-missing-handler leave|fail|retry|skip (or a catch-all --handler "
            "MODULE:FUNCTION); "
            "nothing was claimed"
        )
    return mapping


def _until_idle(ctx: Context, worker: Any) -> int:
    """Poll until a poll claims nothing (nothing due, or what is due is claimed by others or
    waits behind its group's head); SIGINT/SIGTERM stop it after the current event. Each poll
    reads the whole queue up to a batch, so one that claims nothing means nothing was due for
    this worker then; events a handler failed are due again only after their backoff."""
    previous = {
        sig: signal.signal(sig, lambda signum, frame: worker.stop())
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    handled = 0
    try:
        while not worker.stopping:
            batch = worker.run_once()
            if batch == 0:
                break
            handled += batch
            ctx.progress(f"{worker.name}: handled {handled} event(s) so far ...")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return handled


def _work(ctx: Context) -> Any:
    args = ctx.args
    handlers = _handlers(ctx)
    worker = ctx.backend().outbox.worker(
        handlers,
        batch_size=args.batch_size,
        lease=args.lease,
        max_attempts=args.max_attempts,
        poll_interval=args.poll_interval,
        on_missing_handler=args.on_missing_handler or "fail",
        batch_claim=not args.per_event,
    )
    if args.once:
        handled = worker.run_once()
    elif args.until_idle:
        handled = _until_idle(ctx, worker)
    else:
        ctx.progress(f"{worker.name}: working (SIGINT/SIGTERM to stop after the current event)")
        previous = {
            sig: signal.signal(sig, lambda signum, frame: worker.stop())
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            worker.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        handled = worker.delivered + worker.retried + worker.failed + worker.lost
    result = {
        "handled": handled,
        "delivered": worker.delivered,
        "retried": worker.retried,
        "failed": worker.failed,
        "lost_leases": worker.lost,
    }
    if (args.once or args.until_idle) and worker.failed:
        # A cron job's exit status is its alarm: a run that gave up on events is not a success.
        # (The loop's failures are in its log and in `outbox failed`; a stop exits 0.)
        raise CommandFailed(
            f"outbox work marked {worker.failed} event(s) failed (see `dynacoord outbox "
            "failed`, retry with `dynacoord outbox retry`)",
            result=result,
        )
    return result
