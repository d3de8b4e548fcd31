"""What an idempotent call learns from the Lambda invocation it runs in.

Two things, both read before the claim: the invocation's context, whose remaining time bounds the
in-progress lease (a decorated handler's own second argument, or the one registered for the
functions it calls), and the values selected from the event (the key and the payload), by a
callable or by a JMESPath expression with ``json()`` and ``base64()`` added for Lambda bodies.
:mod:`dynacoord.idempotency` and :mod:`dynacoord.aws_lambda` use them; users import the public
names from :mod:`dynacoord.idempotency`.
"""

from __future__ import annotations

import contextvars
import importlib
import json
import re
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError, InvalidKeyError

__all__ = [
    "Selector",
    "compile_jmespath",
    "jmespath_options",
    "lambda_context",
    "register_lambda_context",
]


def _is_lambda_context(value: Any) -> bool:
    return callable(getattr(value, "get_remaining_time_in_millis", None))


def _lambda_context(args: tuple[Any, ...]) -> Any | None:
    """The context of a Lambda-style call ``handler(event, context)``, else None."""
    if len(args) >= 2 and _is_lambda_context(args[1]):
        return args[1]
    return None


#: The Lambda context of the invocation running in this thread (see register_lambda_context).
_CURRENT_CONTEXT: contextvars.ContextVar[Any | None] = contextvars.ContextVar(
    "dynacoord_lambda_context", default=None
)


def register_lambda_context(context: Any) -> None:
    """Tell idempotent functions that are not handlers themselves which Lambda invocation they
    run in, so their in-progress lease ends with the invocation (as for a decorated handler).

    Call it at the start of the handler (``register_lambda_context(context)``); a decorated
    handler ``(event, context)`` and the :mod:`dynacoord.aws_lambda` batch helpers do it for
    the functions they call. A context whose remaining time is 0 or less (a previous
    invocation's, left registered in a warm container) is ignored.
    """
    if not _is_lambda_context(context):
        raise TypeError(
            "context must be the Lambda context object (it has get_remaining_time_in_millis), "
            f"got {type(context).__name__}"
        )
    _CURRENT_CONTEXT.set(context)


def lambda_context() -> Any | None:
    """The registered Lambda context of this invocation, or None (none, or it has run out)."""
    context = _CURRENT_CONTEXT.get()
    if context is None or context.get_remaining_time_in_millis() <= 0:
        return None
    return context


Selector = Callable[..., Any]

_jmespath_options: Any = None


def jmespath_options() -> Any:
    """``jmespath.Options`` with dynacoord's functions for Lambda events:

    * ``json(text)``: parse a JSON string (an API Gateway or SQS ``body``):
      ``json(body).order_id``;
    * ``base64(text)``: decode base64 to UTF-8 text (a Kinesis record's ``data``):
      ``json(base64(kinesis.data)).id``.
    """
    global _jmespath_options
    if _jmespath_options is None:
        # jmespath ships with botocore; imported by name because it has no type stubs.
        jmespath = importlib.import_module("jmespath")
        functions = importlib.import_module("jmespath.functions")

        class _Functions(functions.Functions):  # type: ignore[misc, name-defined]
            @functions.signature({"types": ["string"]})  # type: ignore[untyped-decorator]
            def _func_json(self, text: str) -> Any:
                return json.loads(text)

            @functions.signature({"types": ["string"]})  # type: ignore[untyped-decorator]
            def _func_base64(self, text: str) -> str:
                import base64

                return base64.b64decode(text).decode("utf-8")

        _jmespath_options = jmespath.Options(custom_functions=_Functions())
    return _jmespath_options


def compile_jmespath(spec: str, what: str) -> Callable[[Any], Any]:
    """A compiled JMESPath expression (with :func:`jmespath_options`) as a one-argument callable;
    ConfigurationError if it does not parse."""
    jmespath = importlib.import_module("jmespath")
    try:
        compiled = jmespath.compile(spec)
    except Exception as exc:  # jmespath's ParseError / LexerError
        raise ConfigurationError(
            f"{what} is not a valid JMESPath expression {spec!r}: {exc}"
        ) from exc
    options = jmespath_options()

    def search(value: Any) -> Any:
        try:
            return compiled.search(value, options=options)
        except ValueError as exc:  # json() of text that is not JSON, base64() of bad text
            raise InvalidKeyError(
                f"{what} {spec!r} could not be evaluated on this event: {exc}", key=spec
            ) from exc
        except Exception as exc:  # jmespath's JMESPathTypeError: json() of a non-string
            if type(exc).__module__.startswith("jmespath"):
                raise InvalidKeyError(
                    f"{what} {spec!r} could not be evaluated on this event: {exc}", key=spec
                ) from exc
            raise

    search.__name__ = f"jmespath({spec!r})"
    return search


def _without_event(what: str, spec: str) -> TypeError:
    return TypeError(
        f"idempotency {what} {spec!r} is a JMESPath expression on the event, but the function "
        "was called without a positional argument"
    )


#: a JMESPath expression that is one unquoted field name: evaluated without jmespath
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _field_selector(name: str, what: str) -> Selector:
    """The selector of the JMESPath expression ``name`` (a bare field): what JMESPath gives,
    the field of a mapping, else None, without its parser and interpreter on every call."""

    def field(*args: Any, **kwargs: Any) -> Any:
        if not args:
            raise _without_event(what, name)
        try:
            return args[0].get(name)
        except AttributeError:
            return None

    field.__name__ = f"jmespath({name!r})"
    return field


def _selector(spec: Any, what: str) -> Selector:
    """A callable over the function's arguments from a callable or a JMESPath expression."""
    if callable(spec):
        return spec  # type: ignore[no-any-return]
    if isinstance(spec, str):
        if _FIELD_NAME.fullmatch(spec):
            return _field_selector(spec, what)
        compiled = compile_jmespath(spec, what)

        def search(*args: Any, **kwargs: Any) -> Any:
            if not args:
                raise _without_event(what, spec)
            return compiled(args[0])

        search.__name__ = f"jmespath({spec!r})"
        return search
    raise ConfigurationError(
        f"{what} must be a callable or a JMESPath expression string, got {type(spec).__name__}"
    )
