"""The Lambda entry points of the bundled stack's outbox functions (``Relay=true``).

``dynacoord.serverless.relay`` is the stream relay (:meth:`Outbox.stream_handler`) and
``dynacoord.serverless.sweep`` the scheduled sweeper (:meth:`Outbox.sweep_handler`). The stack sets
their configuration in the environment; both are built once per container, at the first
invocation:

* ``DYNACOORD_TABLE``, ``DYNACOORD_NAMESPACE`` (and ``DYNACOORD_ENDPOINT_URL``): the backend,
  as :meth:`DynamoDBBackend.from_env` reads them;
* ``DYNACOORD_OUTBOX_HANDLERS``: ``MODULE:ATTRIBUTE`` of your handlers (a callable for every
  event, or a mapping of event type to callable) in a module of the code bundle
  (``dynacoord stack package``);
* ``DYNACOORD_OUTBOX_OPTIONS``: worker options as a JSON object (``{"max_attempts": 8}``; the
  names in :data:`dynacoord.outbox.options.STACK_OPTIONS`);
* ``DYNACOORD_HANDLER_SETTINGS``: settings for your handlers as a JSON object (stack parameter
  ``HandlerSettings``), read with :func:`handler_settings`;
* sweeper only: ``DYNACOORD_RECONCILE_HANDLER`` (``MODULE:ATTRIBUTE`` of a callback taking a
  stalled :class:`~dynacoord.runs.Run`; empty: no reconciling) and ``DYNACOORD_RECONCILE_AFTER``
  (seconds, default 300).

A configuration error raises :class:`~dynacoord.errors.ConfigurationError` at the first
invocation (the function's Errors metric and alarm show it); the events wait in the table.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import threading
from typing import Any

from .errors import ConfigurationError
from .outbox.options import stack_options
from .outbox.stream import BatchResponse, StreamHandler, SweepHandler

__all__ = ["handler_settings", "load_object", "outbox_options", "relay", "sweep"]

_SPEC = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$")

_relay: StreamHandler | None = None
_sweep: SweepHandler | None = None
#: Held while an entry point is built: invocations that arrive together in one process (a
#: runtime or a test that runs them in threads) would otherwise each build one, and each would
#: count its deliveries on its own worker (and check the table once more).
_build_lock = threading.Lock()


def load_object(spec: str, what: str = "handlers") -> Any:
    """Import ``MODULE:ATTRIBUTE`` (the attribute may be dotted) and return it."""
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ConfigurationError(f"{what} must be MODULE:ATTRIBUTE, got {spec!r}")
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot import {what} {spec!r}: {exc}") from exc
    return target


def outbox_options(text: str | None) -> dict[str, Any]:
    """The worker options of a JSON object (``DYNACOORD_OUTBOX_OPTIONS``), names checked."""
    if not text:
        return {}
    try:
        options = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"outbox options are not JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise ConfigurationError(f"outbox options must be a JSON object, got {text!r}")
    return stack_options(options)


def handler_settings() -> dict[str, Any]:
    """The settings the stack gives your handlers (``HandlerSettings``: the environment variable
    ``DYNACOORD_HANDLER_SETTINGS``, a JSON object); ``{}`` when unset. For a handlers module::

        settings = handler_settings()
        HANDLERS = SQSRelay(boto3.client("sqs"), settings["queue_url"])
    """
    text = os.environ.get("DYNACOORD_HANDLER_SETTINGS") or "{}"
    try:
        settings = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"DYNACOORD_HANDLER_SETTINGS is not JSON: {exc}") from exc
    if not isinstance(settings, dict):
        raise ConfigurationError(f"DYNACOORD_HANDLER_SETTINGS must be a JSON object, got {text!r}")
    return settings


def _handlers() -> Any:
    spec = os.environ.get("DYNACOORD_OUTBOX_HANDLERS", "")
    if not spec:
        raise ConfigurationError(
            "DYNACOORD_OUTBOX_HANDLERS is not set: give MODULE:ATTRIBUTE of your handlers "
            "(stack parameter RelayHandlers)"
        )
    return load_object(spec)


def _backend() -> Any:
    from .backends.dynamodb import DynamoDBBackend

    return DynamoDBBackend.from_env()


def relay(event: Any, context: Any) -> BatchResponse:
    """Lambda entry point of the stream relay (handler ``dynacoord.serverless.relay``)."""
    handler = _relay
    if handler is None:
        handler = _build_relay()
    return handler(event, context)


def _build_relay() -> StreamHandler:
    global _relay
    with _build_lock:
        if _relay is None:
            options = outbox_options(os.environ.get("DYNACOORD_OUTBOX_OPTIONS"))
            _relay = _backend().outbox.stream_handler(_handlers(), **options)
        return _relay


def sweep(event: Any, context: Any) -> dict[str, Any]:
    """Lambda entry point of the scheduled sweeper (handler ``dynacoord.serverless.sweep``)."""
    handler = _sweep
    if handler is None:
        handler = _build_sweep()
    return handler(event, context)


def _build_sweep() -> SweepHandler:
    global _sweep
    with _build_lock:
        if _sweep is not None:
            return _sweep
        options = outbox_options(os.environ.get("DYNACOORD_OUTBOX_OPTIONS"))
        backend = _backend()
        reconcile_spec = os.environ.get("DYNACOORD_RECONCILE_HANDLER", "")
        on_stalled = load_object(reconcile_spec, "reconcile handler") if reconcile_spec else None
        after_text = os.environ.get("DYNACOORD_RECONCILE_AFTER") or "300"
        try:
            after = float(after_text)
        except ValueError:
            after = math.nan
        if not math.isfinite(after) or after <= 0:
            raise ConfigurationError(
                f"DYNACOORD_RECONCILE_AFTER must be seconds > 0, got {after_text!r}"
            )
        _sweep = backend.outbox.sweep_handler(
            _handlers(),
            runs=backend.runs if on_stalled is not None else None,
            stalled_after=after,
            on_stalled=on_stalled,
            **options,
        )
        return _sweep


def _reset() -> None:
    """Forget the built handlers (tests: a new environment)."""
    global _relay, _sweep
    with _build_lock:
        _relay = None
        _sweep = None
