"""A trace that crosses the outbox: the publisher's trace context travels in the event, and
every delivery runs its handler inside a span linked to it.

**Publishing.** ``outbox.publish`` (directly and inside ``backend.transaction()``) records the
context of the caller in the event's ``metadata``, under the header names the propagators use,
so the metadata is itself a carrier (``propagate.extract(event.metadata)`` works, and so does it
on the ``metadata`` of a relayed envelope):

* ``traceparent`` (and ``tracestate`` when there is one): W3C Trace Context of the active
  OpenTelemetry span, when OpenTelemetry is installed and a span is active;
* ``X-Amzn-Trace-Id``: in AWS Lambda, the function's X-Ray header (``_X_AMZN_TRACE_ID``) when
  that is all there is (no OpenTelemetry, or no active span).

An event whose metadata already holds one of these keys keeps its own (the caller's context
wins). The keys count against the event's size like any metadata: at most 55 bytes for
``traceparent``, 512 for ``tracestate`` and 256 for the X-Ray header (longer ones are not
recorded); an event that would fit without them but not with them is stored without them, so
tracing never makes a publish fail. A publish retried under another trace is still the same
event: the trace keys are not compared when a clash is recognised.

**Delivering.** The worker, the stream relay and the sweeper run each handler inside a span of
kind ``CONSUMER`` named ``process {event type}`` with the messaging attributes
``messaging.system = "dynacoord"``, ``messaging.operation.type = "process"``,
``messaging.message.id`` (the event id) and ``dynacoord.outbox.event_type``,
``dynacoord.outbox.attempt`` and ``dynacoord.outbox.group``. The span is *linked* to the
publisher's context; when no span is active around the delivery (a worker loop), the
publisher's span is also its parent, so publish and delivery are one trace; inside an active
span (a Lambda invocation's), that span stays the parent and the link joins the two traces. A
handler's exception is recorded on the span, which gets an error status. Every attempt links
to the same publisher.

**Off and absent.** OpenTelemetry is optional (``pip install 'dynacoord[otel]'``, the API
package only). Nothing is imported until the first publish or delivery; then
``opentelemetry.trace`` once, guarded. Without it (and outside Lambda), or with
``DYNACOORD_TRACING=off`` in the environment, or after :func:`disable`, publish and delivery
check one module flag and do nothing else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "MAX_TRACESTATE_BYTES",
    "MAX_XRAY_HEADER_BYTES",
    "TRACEPARENT",
    "TRACESTATE",
    "TRACE_KEYS",
    "XRAY_TRACE_HEADER",
    "disable",
    "enable",
    "forwarded",
    "is_enabled",
]

#: the metadata key of the W3C ``traceparent`` header (55 bytes)
TRACEPARENT = "traceparent"
#: the metadata key of the W3C ``tracestate`` header
TRACESTATE = "tracestate"
#: the metadata key of Lambda's X-Ray trace header, recorded when there is no OpenTelemetry span
XRAY_TRACE_HEADER = "X-Amzn-Trace-Id"
#: every metadata key tracing writes
TRACE_KEYS = (TRACEPARENT, TRACESTATE, XRAY_TRACE_HEADER)
#: W3C's limit on ``tracestate`` (32 members of up to 256 bytes may be cut to this); longer
#: ones are not recorded
MAX_TRACESTATE_BYTES = 512
#: longer X-Ray headers are not recorded
MAX_XRAY_HEADER_BYTES = 256

#: Whether a publish looks for a context to record: True until the first publish finds out
#: (no OpenTelemetry and not in Lambda, or tracing turned off) that there can be none.
capturing = True
#: Whether a delivery opens a span: True until the first delivery finds no OpenTelemetry (or
#: tracing turned off).
spanning = True

_decided = False
_turned_off = False
_in_lambda = False
_trace: Any = None  # the opentelemetry.trace module, once imported
_tracer: Any = None
_provider: Any = None  # the tracer provider given to enable(), else the global one
_make_state: Any = None  # TraceState.from_header
_span_kind: Any = None  # SpanKind.CONSUMER
_error_status: Callable[[str], Any] | None = None

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_XRAY_ROOT = re.compile(r"1-([0-9a-f]{8})-([0-9a-f]{24})")
_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_OFF = frozenset({"0", "off", "false", "no", "disabled"})


def disable() -> None:
    """Turn tracing off for this process: publish records nothing, delivery opens no span and
    the relays forward no context. Nothing is imported."""
    global capturing, spanning, _decided, _turned_off
    capturing = spanning = False
    _decided = _turned_off = True


def enable(*, tracer_provider: Any = None) -> None:
    """Turn tracing back on (the default): the next publish or delivery looks again for
    OpenTelemetry and the environment (``DYNACOORD_TRACING`` still applies). Delivery spans come
    from ``tracer_provider`` when given, else from the global provider
    (``opentelemetry.trace.set_tracer_provider``)."""
    global capturing, spanning, _decided, _turned_off, _provider
    capturing = spanning = True
    _decided = _turned_off = False
    _provider = tracer_provider


def is_enabled() -> bool:
    """Whether publish records a context or delivery opens spans (deciding it now, which may
    import OpenTelemetry)."""
    if not _decided:
        _decide()
    return capturing or spanning


def _decide() -> None:
    """Read the environment and import OpenTelemetry once; set the flags."""
    global capturing, spanning, _decided, _turned_off, _in_lambda
    global _trace, _tracer, _make_state, _span_kind, _error_status
    _decided = True
    if os.environ.get("DYNACOORD_TRACING", "").strip().lower() in _OFF:
        capturing = spanning = False
        _turned_off = True
        return
    trace: Any
    try:
        from opentelemetry import trace as otel_trace
        from opentelemetry.trace import SpanKind, Status, StatusCode, TraceState
    except ImportError:
        trace = None
    else:
        trace = otel_trace
    _trace = trace
    if trace is not None:
        # The global one: a proxy until the application sets its provider, then its tracer.
        provider = _provider if _provider is not None else trace.get_tracer_provider()
        _tracer = provider.get_tracer("dynacoord")
        _make_state = TraceState.from_header
        _span_kind = SpanKind.CONSUMER
        _error_status = lambda text: Status(StatusCode.ERROR, text)  # noqa: E731
    _in_lambda = "AWS_LAMBDA_FUNCTION_NAME" in os.environ
    capturing = trace is not None or _in_lambda
    spanning = trace is not None


# -- publishing ---------------------------------------------------------------------------------


def capture() -> dict[str, str] | None:
    """The caller's trace context as metadata entries, or None when there is none."""
    if not _decided:
        _decide()
        if not capturing:
            return None
    if _trace is not None:
        context = _trace.get_current_span().get_span_context()
        if context.is_valid:
            carrier = {
                TRACEPARENT: f"00-{context.trace_id:032x}-{context.span_id:016x}-"
                f"{int(context.trace_flags):02x}"
            }
            if context.trace_state:
                state = context.trace_state.to_header()
                if state and len(state.encode("utf-8", "replace")) <= MAX_TRACESTATE_BYTES:
                    carrier[TRACESTATE] = state
            return carrier
    if _in_lambda:
        header = os.environ.get("_X_AMZN_TRACE_ID")
        if header and header.isascii() and len(header) <= MAX_XRAY_HEADER_BYTES:
            return {XRAY_TRACE_HEADER: header}
    return None


def has_trace(metadata: Mapping[str, Any]) -> bool:
    """Whether ``metadata`` holds one of the trace keys."""
    return TRACEPARENT in metadata or XRAY_TRACE_HEADER in metadata or TRACESTATE in metadata


def without_trace(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` without the trace keys."""
    return {k: v for k, v in metadata.items() if k not in TRACE_KEYS}


# -- the context carried ------------------------------------------------------------------------


def _w3c(metadata: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """(trace id, span id, flags) of a valid ``traceparent`` in ``metadata``, hex; or None."""
    value = metadata.get(TRACEPARENT)
    if not isinstance(value, str):
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest is not None):
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id, int(flags, 16)


def _xray(metadata: Mapping[str, Any]) -> tuple[str, str, int] | None:
    """(trace id, span id, flags) of an ``X-Amzn-Trace-Id`` with a Root and a Parent; or None.
    X-Ray's ``Root=1-{8 hex}-{24 hex}`` is the 32-hex trace id split after its 8th digit."""
    value = metadata.get(XRAY_TRACE_HEADER)
    if not isinstance(value, str):
        return None
    fields: dict[str, str] = {}
    for part in value.split(";"):
        name, _, field_value = part.partition("=")
        fields[name.strip()] = field_value.strip()
    root = _XRAY_ROOT.fullmatch(fields.get("Root", ""))
    parent = fields.get("Parent", "")
    if root is None or _SPAN_ID.fullmatch(parent) is None:
        return None
    trace_id = root.group(1) + root.group(2)
    if trace_id == "0" * 32 or parent == "0" * 16:
        return None
    return trace_id, parent, 1 if fields.get("Sampled") == "1" else 0


def forwarded(metadata: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """What a relay forwards for an event of this ``metadata``: (traceparent, tracestate, X-Ray
    header), each None when there is none; the one converted from the other where only one was
    recorded (the ids are the same 128 and 64 bits in both formats). Pure string work: no
    OpenTelemetry needed. All None when tracing was turned off."""
    if not metadata:
        return None, None, None
    if not _decided:
        _decide()
    if _turned_off:
        return None, None, None
    w3c = _w3c(metadata)
    if w3c is not None:
        trace_id, span_id, flags = w3c
        state = metadata.get(TRACESTATE)
        xray = f"Root=1-{trace_id[:8]}-{trace_id[8:]};Parent={span_id};Sampled={flags & 1}"
        return str(metadata[TRACEPARENT]), state if isinstance(state, str) and state else None, xray
    xray_ids = _xray(metadata)
    if xray_ids is not None:
        trace_id, span_id, flags = xray_ids
        return f"00-{trace_id}-{span_id}-{flags:02x}", None, str(metadata[XRAY_TRACE_HEADER])
    return None, None, None


# -- delivering ---------------------------------------------------------------------------------


def _publisher(metadata: Mapping[str, Any]) -> Any:
    """The publisher's span context carried in ``metadata`` (remote), or None."""
    ids = _w3c(metadata)
    state = None
    if ids is not None:
        raw_state = metadata.get(TRACESTATE)
        if isinstance(raw_state, str) and raw_state:
            state = _make_state([raw_state])
    else:
        ids = _xray(metadata)
        if ids is None:
            return None
    trace_id, span_id, flags = ids
    return _trace.SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=_trace.TraceFlags(flags),
        trace_state=state,
    )


def run_handler(handler: Callable[[Any], Any], event: Any) -> None:
    """``handler(event)`` inside a consumer span linked to the event's publisher (see the
    module docstring); a handler's exception is recorded on the span, which gets an error
    status, and raised again."""
    if not _decided:
        _decide()
    if not spanning:
        handler(event)
        return
    trace = _trace
    metadata = event.metadata
    publisher = _publisher(metadata) if metadata else None
    links = None
    parent = None
    if publisher is not None:
        links = [trace.Link(publisher)]
        if not trace.get_current_span().get_span_context().is_valid:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(publisher))
    attributes: dict[str, Any] = {
        "messaging.system": "dynacoord",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": event.id,
        "dynacoord.outbox.event_type": event.type,
        "dynacoord.outbox.attempt": event.attempt,
    }
    if event.group is not None:
        attributes["dynacoord.outbox.group"] = event.group
    with _tracer.start_as_current_span(
        f"process {event.type}",
        context=parent,
        kind=_span_kind,
        attributes=attributes,
        links=links,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            handler(event)
        except Exception as exc:
            span.record_exception(exc)
            span.set_attribute("error.type", type(exc).__qualname__)
            assert _error_status is not None
            span.set_status(_error_status(f"{type(exc).__name__}: {exc}"))
            raise
