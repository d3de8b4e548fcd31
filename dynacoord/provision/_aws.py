"""The one place where provisioning meets AWS: every request of :mod:`dynacoord.provision` goes
through :func:`call`, which turns botocore's ``ClientError`` into dynacoord's errors (or into a
:class:`Refusal` the caller said it expects, such as "table not found"), and every wait goes
through :func:`wait_for`, on the caller's clock.

Why one point: the module used to catch ``ClientError`` at fifteen sites, each with its own
message, and the table waiter caught none, so an ``AccessDenied`` in the middle of
``ensure_table`` came out as a raw botocore error. Here a request either returns its response,
returns the refusal its caller expects, or raises :class:`~dynacoord.errors.BackendError` (or
the error the caller builds, such as :class:`~dynacoord.errors.StackDeploymentError`) naming
what was being done, with AWS's code and message, chained from the ``ClientError``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._clock import Clock, SystemClock
from ..errors import BackendError, DynacoordError

__all__ = ["Progress", "Refusal", "backend_error", "call", "noop", "request", "wait_for"]

logger = logging.getLogger("dynacoord.provision")

#: a callback that gets one human-readable line per step (the CLI prints them on stderr)
Progress = Callable[[str], None]

T = TypeVar("T")


def noop(_: str) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request AWS refused: its error code and message, and the ``ClientError`` itself."""

    code: str
    message: str
    cause: Exception

    @property
    def not_found(self) -> bool:
        return self.code in ("ResourceNotFoundException", "404", "NoSuchKey", "NotFound")


def _never(_: Refusal) -> bool:
    return False


def backend_error(what: str, refusal: Refusal) -> DynacoordError:
    """The default error of a refused request: ``BackendError`` with AWS's code."""
    return BackendError(f"cannot {what}: {refusal.message}", code=refusal.code)


def call(
    client: Any,
    operation: str,
    what: str,
    *,
    expect: Callable[[Refusal], bool] = _never,
    error: Callable[[str, Refusal], DynacoordError] = backend_error,
    **request: Any,
) -> dict[str, Any] | Refusal:
    """``client.<operation>(**request)``: its response; the :class:`Refusal` if AWS refused and
    ``expect(refusal)``; else ``error(what, refusal)`` raised from the ``ClientError`` (``what``
    completes "cannot ...": ``f"describe table {name!r}"``).

    An answer botocore cannot parse (``ResponseParserError``: an emulator's HTTP 500 page, the
    endpoint of another service) raises ``error(what, ...)`` too, with code
    ``ResponseParserError`` and a message naming the endpoint (``expect`` is not asked: it is
    no refusal of AWS's). Errors botocore raises before or without an answer (no region, no
    credentials, an unreachable endpoint) pass unchanged: the CLI names their fixes.
    """
    from botocore.exceptions import ClientError
    from botocore.parsers import ResponseParserError

    try:
        response: dict[str, Any] = getattr(client, operation)(**request)
    except ResponseParserError as exc:
        # The endpoint answered, but not with the service's response: an emulator's internal
        # error (moto's server answers an exception inside moto with an HTML page and HTTP
        # 500), or an endpoint of another service. Named here, with what was being done.
        refusal = Refusal("ResponseParserError", _unreadable(client, exc), exc)
        raise error(what, refusal) from exc
    except ClientError as exc:
        details = exc.response.get("Error", {})
        refusal = Refusal(
            str(details.get("Code", "")), str(details.get("Message", "")) or str(exc), exc
        )
        if expect(refusal):
            return refusal
        raise error(what, refusal) from exc
    return response


def _unreadable(client: Any, exc: Exception) -> str:
    """The message of an answer botocore could not parse: the endpoint, the service, and
    whether it was an internal server error (an HTML page with status 500)."""
    meta = getattr(client, "meta", None)
    endpoint = getattr(meta, "endpoint_url", None) or "the endpoint"
    service = getattr(getattr(meta, "service_model", None), "service_name", None) or "AWS"
    text = str(exc)
    if "500 Internal Server Error" in text:
        return (
            f"{endpoint} failed with an internal server error (HTTP 500) instead of a "
            f"{service} response; an emulator (moto's server, LocalStack) may not support this "
            "request: its log names the cause"
        )
    return (
        f"{endpoint} answered something that is not a {service} response (is it the "
        f"endpoint of another service?): {' '.join(text.split())[:200]}"
    )


def request(
    client: Any,
    operation: str,
    what: str,
    *,
    error: Callable[[str, Refusal], DynacoordError] = backend_error,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`call` with no refusal expected: the response, or the error raised."""
    result = call(client, operation, what, error=error, **kwargs)
    if isinstance(result, Refusal):  # pragma: no cover - call raises when nothing is expected
        raise error(what, result)
    return result


def wait_for(
    probe: Callable[[], tuple[T | None, str]],
    *,
    what: str,
    clock: Clock | None,
    timeout: float,
    progress: Progress,
    timed_out: Callable[[str], Exception],
    delay: float = 0.05,
    max_delay: float = 5.0,
) -> T:
    """Poll ``probe`` (``(result, state)``: a result ends the wait) until it gives a result;
    between polls report ``waiting for {what} ({state}) ...`` and sleep on ``clock`` (doubling
    ``delay`` up to ``max_delay``). After ``timeout`` seconds of ``clock``, raise
    ``timed_out(state)``. ``clock`` None: the system's."""
    clock = clock or SystemClock()
    deadline = clock.monotonic() + timeout
    while True:
        result, state = probe()
        if result is not None:
            return result
        if clock.monotonic() > deadline:
            raise timed_out(state)
        logger.debug("waiting for %s (%s)", what, state)
        progress(f"waiting for {what} ({state}) ...")
        clock.sleep(delay)
        delay = min(delay * 2, max_delay)
