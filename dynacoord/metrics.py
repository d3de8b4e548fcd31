"""Metrics: what every primitive did, for CloudWatch, for logs, or for a sink of your own.

A backend takes ``metrics=`` (``DynamoDBBackend(client, metrics=EMFMetrics(namespace="Orders"))``,
``RedisBackend(..., metrics=...)``, ``MongoBackend(..., metrics=...)``) and hands it to every
primitive it builds. The listener interface is one method::

    class Metrics:
        def emit(self, name, value, unit, dimensions): ...   # one data point
        def flush(self): ...                                  # write out what is buffered

Subclass :class:`Metrics` and override :meth:`~Metrics.emit` to feed anything else
(OpenTelemetry, StatsD, Prometheus: docs/metrics.md has an OpenTelemetry example).

The default is :data:`NO_METRICS`: its ``enabled`` is False, so a backend or primitive built
with it skips even the timing of requests (``make bench`` shows the cost: none measurable).

Names, units and dimensions are listed in docs/metrics.md. Two families:

* per store request (dimensions ``Backend``, ``Operation``): ``StoreRequestLatency``
  (Milliseconds), ``StoreRequestErrors`` (Count), and on DynamoDB with
  ``consumed_capacity=True`` ``ConsumedCapacity`` (Count, capacity units);
* per primitive (dimensions ``Primitive``, ``DynacoordNamespace``): ``LockAcquired``,
  ``LockWait``, ``LockContended``, ``CacheHit``, ``IdempotencyReplay``, ``OutboxDelivered``, ...

A listener that raises never breaks the primitive that reported: the error is logged once per
listener (the first time) and its data points are dropped.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TextIO, TypeVar

from .errors import ConfigurationError

__all__ = [
    "NO_METRICS",
    "EMFMetrics",
    "LoggingMetrics",
    "Metrics",
    "MetricsScope",
    "NoMetrics",
    "check_metrics",
    "measure_request",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

#: CloudWatch's unit names that dynacoord emits
COUNT = "Count"
MILLISECONDS = "Milliseconds"


class Metrics:
    """The listener interface: every method of the base class does nothing.

    ``emit`` receives one data point: a metric ``name`` (``"LockAcquired"``), its ``value``, a
    CloudWatch ``unit`` (``"Count"`` or ``"Milliseconds"``) and the ``dimensions`` it belongs
    to (str to str; do not keep or mutate the mapping, it is shared). ``flush`` writes out what
    is buffered; call it at the end of an invocation (:meth:`flush_after` does).
    """

    #: False only on the no-op: primitives skip measuring altogether when it is False
    enabled: bool = True
    #: True: every DynamoDB request asks for its consumed capacity (``ReturnConsumedCapacity``)
    #: and reports it as ``ConsumedCapacity``. Off by default: DynamoDB has to compute and send
    #: it, which made each request ~13 % slower on DynamoDB Local (``make bench``, section 8)
    consumed_capacity: bool = False

    def emit(self, name: str, value: float, unit: str, dimensions: Mapping[str, str]) -> None:
        """One data point (override this)."""

    def flush(self) -> None:
        """Write out buffered data points (override this if you buffer)."""

    def scope(self, **dimensions: str) -> MetricsScope:
        """A reporter whose data points all carry ``dimensions`` (what primitives hold)."""
        if not self.enabled:
            return NO_SCOPE
        return MetricsScope(self, dimensions)

    def flush_after(self, func: Callable[P, R]) -> Callable[P, R]:
        """Decorator for a Lambda handler: :meth:`flush` when each invocation ends (also when it
        raises), so each invocation's data points are written by that invocation."""

        @functools.wraps(func)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return func(*args, **kwargs)
            finally:
                self.flush()

        return wrapper


class NoMetrics(Metrics):
    """The default listener: records nothing, and tells primitives not to measure."""

    enabled = False

    def __repr__(self) -> str:
        return "NO_METRICS"


#: the shared no-op listener (the default of every backend)
NO_METRICS: Metrics = NoMetrics()


#: listeners that raised once already: a broken sink is logged once, not per data point. Held
#: weakly, so a new listener made where a collected one lived is not taken for it (as an id is).
_broken_listeners: weakref.WeakSet[Metrics] = weakref.WeakSet()
#: the same for listeners that cannot be held weakly or hashed (by id, kept alive with it)
_broken_pinned: dict[int, Metrics] = {}
#: makes "seen broken?" and "mark broken" one step: two threads reporting through a broken
#: listener at once would otherwise both find it unmarked and both log
_broken_lock = threading.Lock()


def _listener_failed(metrics: Metrics, name: str) -> None:
    with _broken_lock:
        try:
            if metrics in _broken_listeners:
                return
            _broken_listeners.add(metrics)
        except TypeError:  # no weak reference or no hash: pin it, so its id cannot be reused
            if id(metrics) in _broken_pinned:
                return
            _broken_pinned[id(metrics)] = metrics
    logger.exception(
        "metrics listener %r failed; data point %r dropped (logged once per listener)",
        metrics,
        name,
    )


class MetricsScope:
    """A listener plus fixed dimensions: ``scope.count("CacheHit")``. Never raises."""

    __slots__ = ("_dimensions", "_metrics", "enabled")

    def __init__(self, metrics: Metrics, dimensions: Mapping[str, str]) -> None:
        self._metrics = metrics
        self._dimensions = dict(dimensions)
        self.enabled = metrics.enabled

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    def emit(self, name: str, value: float, unit: str) -> None:
        try:
            self._metrics.emit(name, value, unit, self._dimensions)
        except Exception:
            _listener_failed(self._metrics, name)

    def count(self, name: str, value: float = 1) -> None:
        self.emit(name, value, COUNT)

    def milliseconds(self, name: str, value: float) -> None:
        self.emit(name, value, MILLISECONDS)

    def __repr__(self) -> str:
        return f"MetricsScope({self._metrics!r}, {self._dimensions!r})"


class _NoScope(MetricsScope):
    """The scope of :data:`NO_METRICS`: every method returns at once."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(NO_METRICS, {})

    def emit(self, name: str, value: float, unit: str) -> None:
        return None

    def count(self, name: str, value: float = 1) -> None:
        return None

    def milliseconds(self, name: str, value: float) -> None:
        return None


#: the scope every primitive uses when no listener was given
NO_SCOPE: MetricsScope = _NoScope()


def check_metrics(value: Any) -> Metrics:
    """``metrics=`` of a backend: None means :data:`NO_METRICS`; anything else must be a
    :class:`Metrics` (subclass it and override ``emit``)."""
    if value is None:
        return NO_METRICS
    if not isinstance(value, Metrics):
        raise ConfigurationError(
            f"metrics must be a dynacoord.metrics.Metrics (subclass it and override emit()), "
            f"got {type(value).__name__}"
        )
    return value


def measure_request(
    metrics: Metrics,
    dimensions: Mapping[str, str],
    start: float,
    *,
    failed: bool = False,
    capacity: float | None = None,
) -> None:
    """Report one store request that began at ``time.perf_counter()`` == ``start``: its latency,
    whether it failed (an error, not a refused condition) and its consumed capacity. Used by
    the request helper of each backend; never raises."""
    elapsed_ms = (time.perf_counter() - start) * 1000
    try:
        metrics.emit("StoreRequestLatency", elapsed_ms, MILLISECONDS, dimensions)
        if failed:
            metrics.emit("StoreRequestErrors", 1, COUNT, dimensions)
        if capacity is not None:
            metrics.emit("ConsumedCapacity", capacity, COUNT, dimensions)
    except Exception:
        _listener_failed(metrics, "StoreRequestLatency")


class LoggingMetrics(Metrics):
    """Each data point as one log line (for scripts and local runs)::

    metric LockAcquired=1 Count Primitive=lock DynacoordNamespace=orders
    """

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        level: int = logging.INFO,
        consumed_capacity: bool = False,
    ) -> None:
        self.logger = logger if logger is not None else logging.getLogger("dynacoord.metrics")
        self.level = level
        self.consumed_capacity = consumed_capacity

    def emit(self, name: str, value: float, unit: str, dimensions: Mapping[str, str]) -> None:
        if self.logger.isEnabledFor(self.level):
            dims = " ".join(f"{k}={v}" for k, v in dimensions.items())
            self.logger.log(self.level, "metric %s=%g %s %s", name, value, unit, dims)


#: EMF limits (CloudWatch): metrics per document, values per metric, dimensions per set
_EMF_MAX_METRICS = 100
_EMF_MAX_VALUES = 100
_EMF_MAX_DIMENSIONS = 30


class EMFMetrics(Metrics):
    """CloudWatch Embedded Metric Format: JSON lines on stdout that Lambda (or the CloudWatch
    agent) turns into CloudWatch metrics, with no API call and no dependency.

    Data points are buffered per dimension set and written by :meth:`flush`: at the end of each
    invocation (decorate the handler with :meth:`~Metrics.flush_after`, or call ``flush()``),
    when a metric reaches 100 values (the format's limit), and when the process exits.
    Counts are summed per flush; timings keep every value. ``default_dimensions`` are added to
    every data point (for example ``{"Service": "orders"}``).

    One document per dimension set::

        {"_aws": {"Timestamp": 1700000000000, "CloudWatchMetrics": [{"Namespace": "Orders",
          "Dimensions": [["Primitive", "DynacoordNamespace"]],
          "Metrics": [{"Name": "LockAcquired", "Unit": "Count"}]}]},
         "Primitive": "lock", "DynacoordNamespace": "default", "LockAcquired": 3}
    """

    def __init__(
        self,
        namespace: str,
        *,
        default_dimensions: Mapping[str, str] | None = None,
        stream: TextIO | None = None,
        flush_at_exit: bool = True,
        consumed_capacity: bool = False,
    ) -> None:
        if not isinstance(namespace, str) or not 1 <= len(namespace) <= 255:
            raise ConfigurationError(
                f"namespace must be a CloudWatch namespace of 1 to 255 characters, got "
                f"{namespace!r}"
            )
        if namespace.startswith("AWS/"):
            raise ConfigurationError(f"namespace {namespace!r}: 'AWS/' is reserved for AWS")
        defaults = dict(default_dimensions or {})
        for key, val in defaults.items():
            if not isinstance(key, str) or not isinstance(val, str) or not key or not val:
                raise ConfigurationError(
                    f"default_dimensions must map non-empty str to non-empty str, got "
                    f"{key!r}: {val!r}"
                )
        self.namespace = namespace
        self.default_dimensions = defaults
        self.consumed_capacity = consumed_capacity
        self._stream = stream
        #: guards the buffer (held for a dict update, never during a write)
        self._lock = threading.Lock()
        #: held from taking data points out of the buffer until they are written (taken before
        #: _lock): a flush that finds the buffer emptied by another thread's flush still in the
        #: middle of its write waits for that write, so when flush() returns every point
        #: emitted before it is written (each invocation's, when invocations share the listener).
        #: Reentrant: a stream that reports through this listener while it writes cannot
        #: deadlock its own thread.
        self._flush_lock = threading.RLock()
        # (dimension items) -> metric name -> (unit, values)
        self._buffer: dict[tuple[tuple[str, str], ...], dict[str, tuple[str, list[float]]]] = {}
        if flush_at_exit:
            import atexit

            ref = weakref.ref(self)

            def at_exit() -> None:
                me = ref()
                if me is not None:
                    me.flush()

            atexit.register(at_exit)

    def emit(self, name: str, value: float, unit: str, dimensions: Mapping[str, str]) -> None:
        dims = tuple({**self.default_dimensions, **dimensions}.items())
        full = False
        with self._lock:
            group = self._buffer.setdefault(dims, {})
            entry = group.get(name)
            if entry is None:
                group[name] = (unit, [value])
            elif unit == COUNT:
                entry[1][0] += value
            else:
                entry[1].append(value)
                full = len(entry[1]) >= _EMF_MAX_VALUES
        if full:
            self._write_full(dims, name)

    def _write_full(self, dims: tuple[tuple[str, str], ...], name: str) -> None:
        """Write a metric that reached the format's 100 values (under the flush lock, as a flush)."""
        with self._flush_lock:
            with self._lock:
                group = self._buffer.get(dims)
                entry = None if group is None else group.get(name)
                if group is None or entry is None or len(entry[1]) < _EMF_MAX_VALUES:
                    return  # a flush in between wrote it
                del group[name]
                lines = self._documents({dims: {name: entry}})
            self._write(lines)

    def flush(self) -> None:
        with self._flush_lock:
            with self._lock:
                buffer, self._buffer = self._buffer, {}
            lines = self._documents(buffer)
            if lines:
                self._write(lines)

    def _documents(
        self, buffer: Mapping[tuple[tuple[str, str], ...], Mapping[str, tuple[str, list[float]]]]
    ) -> list[str]:
        import json

        timestamp = int(time.time() * 1000)
        lines = []
        for dims, group in buffer.items():
            dim_names = [k for k, _v in dims][:_EMF_MAX_DIMENSIONS]
            # A timing can hold more than 100 values when threads add to it while the one that
            # reached 100 waits to write it: the extra values go into further documents.
            longest = max((len(values) for _unit, values in group.values()), default=0)
            for offset in range(0, longest, _EMF_MAX_VALUES):
                names = [name for name, (_unit, values) in group.items() if len(values) > offset]
                for start in range(0, len(names), _EMF_MAX_METRICS):
                    chunk = names[start : start + _EMF_MAX_METRICS]
                    doc: dict[str, Any] = {
                        "_aws": {
                            "Timestamp": timestamp,
                            "CloudWatchMetrics": [
                                {
                                    "Namespace": self.namespace,
                                    "Dimensions": [dim_names],
                                    "Metrics": [{"Name": n, "Unit": group[n][0]} for n in chunk],
                                }
                            ],
                        }
                    }
                    doc.update(dims)
                    for n in chunk:
                        values = group[n][1][offset : offset + _EMF_MAX_VALUES]
                        doc[n] = values[0] if len(values) == 1 else values
                    lines.append(json.dumps(doc, separators=(",", ":")))
        return lines

    def _write(self, lines: list[str]) -> None:
        stream = self._stream if self._stream is not None else sys.stdout
        stream.write("".join(line + "\n" for line in lines))
        stream.flush()

    def __repr__(self) -> str:
        return f"EMFMetrics(namespace={self.namespace!r})"
