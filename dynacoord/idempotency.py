"""Idempotency: run a function once per key and replay its stored result to duplicates.

Policy lives here (keys and payload hashes, leases, waiting, the decorator); a backend supplies an
:class:`IdempotencyStore` whose methods are one round trip each.

A record per key moves through two states::

    (absent) --claim--> IN_PROGRESS (token, lease) --complete(token)--> COMPLETED (result, ttl)
                             |                                              |
                             +--release(token): the function raised          +-- expires: absent
                             +--lease expires: absent (a crashed call)

* **claim** is one conditional write that succeeds only if the key is absent or expired. When it
  is refused, the same request returns the record that refused it, so a replay of a completed key
  costs exactly one request (``ReturnValuesOnConditionCheckFailure`` on DynamoDB).
* **complete** and **release** are conditional on the claim's random token. Timeline of the race
  this closes::

      A claims (token a) ... stalls past its lease ......... A completes(a) -> refused
                            B claims (token b), runs, completes(b) -> stored

  Without the token, A's late write would overwrite B's record (or delete B's claim).

Requests per decorated call: first call 2 writes (claim, complete); replay 1 (the refused claim);
a failing call 2 (claim, release).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar

from typing_extensions import ParamSpec, Unpack

from . import codec, keys
from ._clock import Clock, SystemClock, now_ms
from ._compat import StrEnum
from ._invocation import _CURRENT_CONTEXT as _CURRENT_CONTEXT
from ._invocation import (
    Selector,
    _lambda_context,
    _selector,
    lambda_context,
    register_lambda_context,
)
from ._invocation import compile_jmespath as compile_jmespath
from ._invocation import jmespath_options as jmespath_options
from ._items import member_reader
from ._raised import RaisedWrites
from ._typed import OutputType
from ._typed import output_type as output_type_of
from ._unstorable import (
    UNSTORABLE_PREFIX,
    Refused,
    fix_for,
    not_replayable,
    type_name,
    unstorable_marker,
    with_article,
)
from ._validate import (
    check_bool,
    check_int,
    check_str,
    non_negative_seconds,
    option_names,
    options_with,
    ttl_to_ms,
)
from .errors import (
    ConfigurationError,
    IdempotencyInProgressError,
    IdempotencyKeyMismatchError,
    IdempotencyValueError,
    InvalidKeyError,
    InvalidValueError,
)
from .metrics import NO_SCOPE, MetricsScope

# ``_CURRENT_CONTEXT``, ``compile_jmespath`` and ``jmespath_options`` are imported ``as`` themselves
# to re-export them: aws_lambda shares the invocation's context, and the JMESPath helpers are
# documented under this module.
__all__ = [
    "DEFAULT_IN_PROGRESS_TTL",
    "Claim",
    "ClaimResult",
    "Idempotency",
    "IdempotencyOptions",
    "IdempotencyRecord",
    "IdempotencyStatus",
    "IdempotencyStore",
    "OutputType",
    "hash_payload",
    "lambda_context",
    "register_lambda_context",
]

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


#: The in-progress lease of a plain function call when ``in_progress_ttl`` is not given (seconds).
#: In a Lambda handler the default is the invocation's remaining time instead.
DEFAULT_IN_PROGRESS_TTL = 60.0


class IdempotencyStatus(StrEnum):
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"


_status = member_reader(IdempotencyStatus)


@dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """A stored idempotency record. ``result_text`` is codec-encoded (COMPLETED only)."""

    key: str
    status: IdempotencyStatus
    #: IN_PROGRESS: end of the lease; COMPLETED: when the stored result expires
    expires_at_ms: int
    payload_hash: str | None = None
    result_text: str | None = None
    #: the claim token (IN_PROGRESS only)
    token: str | None = None

    @property
    def expires_at(self) -> float:
        return self.expires_at_ms / 1000

    @property
    def completed(self) -> bool:
        return self.status is IdempotencyStatus.COMPLETED

    @property
    def unstorable(self) -> str | None:
        """The type name of a result that could not be stored (the call ran, its result was not
        kept: see ``@idempotent``), else None."""
        marker = unstorable_marker(self.result_text)
        return None if marker is None else marker[0]

    @property
    def result(self) -> Any:
        """The stored result, decoded (None while in progress). Raises
        :class:`IdempotencyValueError` for a record whose result could not be stored."""
        if self.result_text is None:
            return None
        marker = unstorable_marker(self.result_text)
        if marker is not None:
            raise IdempotencyValueError(not_replayable(self.key, *marker), key=self.key)
        return codec.decode(self.result_text)

    def live(self, now_ms: int) -> bool:
        return now_ms < self.expires_at_ms

    @classmethod
    def from_item(cls, key: str, item: Mapping[str, Any] | None) -> IdempotencyRecord | None:
        """The record a stored item holds (the same field names on every backend), or None if
        there is none (or its status is unknown). Expiry is the caller's to judge."""
        if not item or "status" not in item:
            return None
        try:
            status = _status(item["status"])
        except ValueError:
            return None
        payload_hash = item.get("payload_hash")
        return cls(
            key,
            status,
            int(item.get("expires_at_ms", 0)),
            str(payload_hash) if payload_hash else None,
            str(item["result"]) if "result" in item else None,
            str(item["token"]) if "token" in item else None,
        )


@dataclass(frozen=True, slots=True)
class Claim:
    """A held claim on a key: pass it to :meth:`Idempotency.complete` or :meth:`~Idempotency.release`."""

    key: str
    token: str
    expires_at_ms: int
    payload_hash: str | None = None

    @property
    def expires_at(self) -> float:
        return self.expires_at_ms / 1000


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The outcome of one claim attempt: our new ``claim``, or the ``existing`` record that refused it.

    ``existing`` may be None on a refusal only if the store could not return the record.
    """

    claim: Claim | None
    existing: IdempotencyRecord | None = None

    @property
    def claimed(self) -> bool:
        return self.claim is not None


class IdempotencyStore(Protocol):
    """Storage for idempotency records. Every method is one request to the store."""

    def claim(
        self, key: str, token: str, payload_hash: str | None, lease_ms: int, now_ms: int
    ) -> ClaimResult:
        """Write an IN_PROGRESS record if the key is absent or expired; else return the record."""
        ...

    def complete(self, key: str, token: str, result_text: str, ttl_ms: int, now_ms: int) -> bool:
        """Turn our IN_PROGRESS record (matching ``token``) into COMPLETED; False if not ours."""
        ...

    def release(self, key: str, token: str) -> bool:
        """Delete our IN_PROGRESS record (matching ``token``); False if it is not ours any more."""
        ...

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record, read consistently (expired too: the caller decides)."""
        ...

    def delete(self, key: str) -> bool:
        """Delete the record whatever its state; True if one existed."""
        ...


def _canonical(value: Any) -> str:
    # Canonical JSON of a codec value: dict order must not change a key or a payload hash.
    return json.dumps(
        json.loads(codec.encode(value)), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )


def hash_payload(value: Any) -> str:
    """The payload hash stored with a claim: SHA-256 of the canonical codec encoding of ``value``."""
    return hashlib.sha256(_canonical(value).encode("utf-8")).hexdigest()


def _claim_token() -> str:
    """A claim token: 128 random bits as 32 hex digits (the form of ``uuid.uuid4().hex``, without
    building a UUID object on every claim)."""
    return os.urandom(16).hex()


def _check_claim(claim: Any) -> None:
    if not isinstance(claim, Claim):
        raise TypeError(
            f"claim must be the Claim returned by try_claim, got {type(claim).__name__}"
        )


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict, tuple)) and len(value) == 0)


@dataclass(frozen=True, kw_only=True, slots=True)
class IdempotencyOptions:
    """How ``@idempotent`` runs a function once per key (see :meth:`Idempotency.idempotent` for
    what each does). Checked when made: a wrong value raises at once, naming the option.

    ``@backend.idempotent(key="order_id", ttl=60)`` and
    ``@backend.idempotent(IdempotencyOptions(ttl=60), key="order_id")`` are the same; one
    object can serve many functions (each keeps its own local cache)."""

    #: seconds a completed result is replayed
    ttl: float = 3600
    #: seconds a running call holds its key (None: 60, or the Lambda invocation's remaining time)
    in_progress_ttl: float | None = None
    #: a callable or JMESPath selecting what must be equal on a replay (None: nothing compared)
    payload: str | Callable[..., Any] | None = None
    #: a duplicate of a running call polls for its result instead of raising at once
    wait: bool = False
    #: seconds a waiting duplicate polls at most
    wait_timeout: float = 30.0
    #: a key that comes out None or empty raises (False: the function runs unprotected)
    raise_on_no_key: bool = True
    #: the type of the result, or a ``(to_store, from_store)`` pair (None: codec values only)
    output_type: Any = None
    #: replay completed results from process memory (no request)
    use_local_cache: bool = False
    #: completed results the local cache keeps, per decorated function
    local_cache_max_items: int = 256
    #: ``f(result, record)`` called on every replay; what it returns is returned
    response_hook: Callable[[Any, IdempotencyRecord], Any] | None = None
    # what the checks made, kept for the decorator: not options themselves
    _payload: Selector | None = field(default=None, init=False, repr=False, compare=False)
    _output: OutputType | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ttl_to_ms(self.ttl)
        if self.in_progress_ttl is not None:
            ttl_to_ms(self.in_progress_ttl, "in_progress_ttl")
        if self.payload is not None:
            object.__setattr__(self, "_payload", _selector(self.payload, "payload"))
        check_bool(self.wait, "wait")
        non_negative_seconds(self.wait_timeout, "wait_timeout")
        check_bool(self.raise_on_no_key, "raise_on_no_key")
        if self.output_type is not None:
            object.__setattr__(self, "_output", output_type_of(self.output_type))
        if check_bool(self.use_local_cache, "use_local_cache"):
            check_int(self.local_cache_max_items, "local_cache_max_items", minimum=1)
        if self.response_hook is not None and not callable(self.response_hook):
            raise ConfigurationError(
                f"response_hook must be callable, got {type(self.response_hook).__name__}"
            )

    @classmethod
    def of(
        cls, base: IdempotencyOptions | None = None, /, **values: Unpack[IdempotencyOptionValues]
    ) -> IdempotencyOptions:
        """``base`` (or the defaults) with ``values`` in place of its own; an unknown name is
        refused with the list of known ones."""
        hint = (
            " (the key is given by name: @idempotent(key=...))"
            if callable(base) or isinstance(base, str)
            else ""
        )
        return options_with(cls, base, values, what="idempotency", hint=hint)

    @property
    def ttl_ms(self) -> int:
        return ttl_to_ms(self.ttl)

    @property
    def in_progress_ms(self) -> int | None:
        if self.in_progress_ttl is None:
            return None
        return ttl_to_ms(self.in_progress_ttl, "in_progress_ttl")


#: every option's name, in declaration order
OPTION_NAMES = option_names(IdempotencyOptions)


class IdempotencyOptionValues(TypedDict, total=False):
    """:class:`IdempotencyOptions` by name, for the keyword shorthand
    (``@backend.idempotent(key="id", ttl=60)``); mypy checks each name and type."""

    ttl: float
    in_progress_ttl: float | None
    payload: str | Callable[..., Any] | None
    wait: bool
    wait_timeout: float
    raise_on_no_key: bool
    output_type: Any
    use_local_cache: bool
    local_cache_max_items: int
    response_hook: Callable[[Any, IdempotencyRecord], Any] | None


@dataclass(frozen=True, kw_only=True, slots=True)
class _Compiled:
    """One decorated function's options, in the form its calls use (made once, at decoration)."""

    key: Selector
    key_spec: str
    payload: Selector | None
    ttl_ms: int
    in_progress_ms: int | None
    wait: bool
    wait_timeout: float
    raise_on_no_key: bool
    output: OutputType | None = None
    local: _LocalCache | None = None
    response_hook: Callable[[Any, IdempotencyRecord], Any] | None = None


class _LocalCache:
    """A bounded in-process LRU of completed records (``use_local_cache=True``): a replay in
    the same process (a warm Lambda container) costs no request. Entries expire with the
    record; a record deleted or changed in the store is not seen until the entry expires."""

    def __init__(self, max_items: int) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, IdempotencyRecord] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, now_ms: int) -> IdempotencyRecord | None:
        with self._lock:
            record = self._items.get(key)
            if record is None:
                return None
            if not record.live(now_ms):
                del self._items[key]
                return None
            self._items.move_to_end(key)
            return record

    def put(self, record: IdempotencyRecord) -> None:
        with self._lock:
            self._items[record.key] = record
            self._items.move_to_end(record.key)
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)


class Idempotency:
    """Idempotency records over an :class:`IdempotencyStore`. Reached as ``backend.idempotency``.

    The decorator :meth:`idempotent` (also ``backend.idempotent``) is what most code uses; the
    claim / complete / release methods are the same steps for code that is not one function call.
    """

    #: first delay and cap of the polling backoff of ``wait=True`` (seconds)
    backoff_initial = 0.05
    backoff_max = 1.0

    def __init__(
        self,
        store: IdempotencyStore,
        *,
        clock: Clock | None = None,
        metrics: MetricsScope | None = None,
    ) -> None:
        self._store = store
        self.clock: Clock = clock or SystemClock()
        self._metrics = metrics if metrics is not None else NO_SCOPE
        # the tokens of this process's claims whose call raised: the next claim of the key
        # with the same payload here is their retry (see dynacoord._raised for who may reuse one)
        self._raised = RaisedWrites()

    register_lambda_context = staticmethod(register_lambda_context)

    # -- store-level API ----------------------------------------------------------------------

    def try_claim(
        self,
        key: str,
        *,
        lease: float = DEFAULT_IN_PROGRESS_TTL,
        payload_hash: str | None = None,
    ) -> ClaimResult:
        """Claim ``key`` for ``lease`` seconds (one conditional write).

        Returns our :class:`Claim`, or the live record that holds the key (COMPLETED with a result,
        or IN_PROGRESS by someone else). An expired record of either kind counts as absent.
        """
        keys.validate_key(key, "idempotency key")
        lease_ms = ttl_to_ms(lease, "lease")
        if payload_hash is not None:
            check_str(payload_hash, "payload_hash")
        return self._claim(key, lease_ms, payload_hash)

    def _claim(self, key: str, lease_ms: int, payload_hash: str | None) -> ClaimResult:
        now = now_ms(self.clock)
        # the token of this process's earlier claim of the key that raised, if any: this call
        # is that claim's retry
        token = self._raised.take(key, payload_hash, now) or _claim_token()
        try:
            outcome = self._store.claim(key, token, payload_hash, lease_ms, now)
        except BaseException:
            # Maybe applied (a lost answer after the client's retries): never "not written".
            # The next claim of this key here carries the same token and recognises it.
            self._raised.keep(key, token, payload_hash, now + lease_ms)
            raise
        existing = outcome.existing
        if (
            outcome.claim is None
            and existing is not None
            and existing.status is IdempotencyStatus.IN_PROGRESS
            and existing.token == token
        ):
            # Our own claim: the first attempt was written but its response was lost, and the
            # client's retry was refused by it (or the call raised, and this is its retry by
            # the same process). Without this the call would block its own key.
            outcome = ClaimResult(Claim(key, token, existing.expires_at_ms, payload_hash))
        if outcome.claim is not None:
            logger.debug("idempotency key %r claimed", key)
        return outcome

    def complete(self, claim: Claim, result: Any, *, ttl: float = 3600) -> bool:
        """Store ``result`` for the claimed key for ``ttl`` seconds (one conditional write).

        Raises :class:`IdempotencyValueError` (nothing written) if ``result`` is not a codec value
        or is too large. Returns False if the claim was lost (its lease expired and another call
        took the key over): the other call's record is left alone.
        """
        _check_claim(claim)
        return self._complete(claim, result, ttl_to_ms(ttl))

    @staticmethod
    def _check_size(claim: Claim, text: str) -> None:
        # A cheap bound first (UTF-8 takes at most 4 bytes a character; 1 KB covers the names,
        # the namespace and the numbers): the estimate is made only when the bound cannot tell.
        chars = len(text) + len(claim.key) + len(claim.payload_hash or "")
        if 4 * chars + 1024 <= codec.DYNAMODB_ITEM_LIMIT:
            return
        codec.check_item_size(
            {
                "pk": f"IDEMP#{'x' * keys.MAX_NAMESPACE_CHARS}#{claim.key}",
                "sk": "IDEMP",
                "status": "COMPLETED",
                "result": text,
                "payload_hash": claim.payload_hash or "",
                "expires_at_ms": 10**15,
                "ttl": 10**12,
                "created_ms": 10**15,
                "completed_ms": 10**15,
            },
            key=claim.key,
        )

    def _complete(self, claim: Claim, result: Any, ttl_ms: int) -> bool:
        try:
            text = codec.encode(result)
            self._check_size(claim, text)
        except InvalidValueError as exc:
            raise IdempotencyValueError(
                f"the result for idempotency key {claim.key!r} cannot be stored: {exc}",
                key=claim.key,
            ) from exc
        ok = self._store.complete(claim.key, claim.token, text, ttl_ms, now_ms(self.clock))
        if not ok:
            logger.warning(
                "idempotency claim on %r was lost before completion (lease expired and taken "
                "over); the result was not stored",
                claim.key,
            )
        return ok

    def release(self, claim: Claim) -> bool:
        """Give the key up without storing a result (one conditional delete).

        False if the claim had already been lost; another call's claim is never deleted.
        """
        _check_claim(claim)
        return self._store.release(claim.key, claim.token)

    def get(self, key: str) -> IdempotencyRecord | None:
        """The live record of ``key`` (one consistent read), or None."""
        keys.validate_key(key, "idempotency key")
        record = self._store.get(key)
        if record is None or not record.live(now_ms(self.clock)):
            return None
        return record

    def delete(self, key: str) -> bool:
        """Forget ``key`` whatever its state (operator action); True if a record existed."""
        keys.validate_key(key, "idempotency key")
        return self._store.delete(key)

    # -- the decorator ------------------------------------------------------------------------

    def idempotent(
        self,
        options: IdempotencyOptions | None = None,
        *,
        key: str | Callable[..., Any],
        **option_values: Unpack[IdempotencyOptionValues],
    ) -> Callable[[Callable[P, R]], Callable[P, R]]:
        """Make a function (or a Lambda handler ``(event, context)``) run once per key.

        Its options are ``options`` (an :class:`IdempotencyOptions`) with ``option_values`` in
        place of its own, by name (``ttl=60, wait=True``: each name of
        :class:`IdempotencyOptions`); an unknown name is refused. This is the one definition:
        ``backend.idempotent`` forwards here.

        ``key``: a callable taking the function's arguments, or a JMESPath expression applied to
        the first positional argument (the Lambda event), e.g. ``"body.order_id"``, or
        ``"json(body).order_id"`` when the body is a JSON string (``json()`` and ``base64()``
        are added to JMESPath: see :func:`jmespath_options`). Non-string values are turned into
        canonical JSON text. A key that comes out None or empty raises
        :class:`~dynacoord.errors.InvalidKeyError` (the function does not run unprotected);
        ``raise_on_no_key=False`` runs it without idempotency instead (logged as a warning).
        Keys are shared by every function of the namespace: put the operation into the key
        (``"charge:" + order_id``) when two functions could see the same ids.

        ``ttl``: how long (seconds) a completed result is replayed. ``in_progress_ttl``: the lease
        of a running call, after which a crashed call's claim can be taken over (default
        :data:`DEFAULT_IN_PROGRESS_TTL`). In a Lambda invocation the lease is bounded by
        ``context.get_remaining_time_in_millis()`` and defaults to it: the context is the
        handler's second argument, or the one given to :func:`register_lambda_context` (a
        decorated handler registers its own for the idempotent functions it calls).

        ``payload``: a callable or JMESPath selecting what must be the same on a replay; a
        different payload under the same key raises :class:`IdempotencyKeyMismatchError`.

        A duplicate arriving while the first call runs raises :class:`IdempotencyInProgressError`,
        or with ``wait=True`` polls (backoff) for the result up to ``wait_timeout`` seconds (and
        takes over if the first call fails or its lease runs out). An exception in the function
        releases the claim (errors are not cached) and propagates.

        The result is stored with the codec (JSON-compatible values, bytes, Decimal; tuples come
        back as lists). ``output_type`` stores other results: a dataclass, a pydantic model,
        ``datetime``, ``UUID``, an ``Enum``, ``list[...]`` of them, or a ``(to_store,
        from_store)`` pair (see :mod:`dynacoord._typed`); a replay returns a value of that type
        equal to the first call's. A result that cannot be stored raises
        :class:`IdempotencyValueError` naming its type and the fix, after the function ran: the
        record is completed as *unstorable*, so duplicates raise the same error instead of
        running the side effects again (``backend.idempotency.delete(key)`` frees the key).

        ``use_local_cache=True`` keeps up to ``local_cache_max_items`` completed records of this
        function in process memory (LRU, each until its ``ttl``): a replay in the same process
        costs no request. ``response_hook(result, record)`` is called on every replay (not on a
        first call) and its return value is returned instead, e.g. to mark replayed responses.
        """
        opts = IdempotencyOptions.of(options, **option_values)
        compiled = _Compiled(
            key=_selector(key, "key"),
            key_spec=key if isinstance(key, str) else getattr(key, "__name__", repr(key)),
            payload=opts._payload,
            ttl_ms=opts.ttl_ms,
            in_progress_ms=opts.in_progress_ms,
            wait=opts.wait,
            wait_timeout=float(opts.wait_timeout),
            raise_on_no_key=opts.raise_on_no_key,
            output=opts._output,
            local=_LocalCache(opts.local_cache_max_items) if opts.use_local_cache else None,
            response_hook=opts.response_hook,
        )

        def decorator(func: Callable[P, R]) -> Callable[P, R]:
            @functools.wraps(func)
            def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
                return self._call(func, compiled, args, kwargs)

            if compiled.local is not None:
                wrapper.local_cache = compiled.local  # type: ignore[attr-defined]
            return wrapper

        return decorator

    def _key_of(self, func: Callable[..., Any], options: _Compiled, raw: Any) -> str | None:
        """The idempotency key of the selected value ``raw`` (None: run without idempotency)."""
        if _is_empty(raw):
            message = (
                f"idempotency key {options.key_spec!r} of {getattr(func, '__qualname__', func)!r} "
                f"is {raw!r} for this call"
            )
            if options.raise_on_no_key:
                raise InvalidKeyError(
                    message + ": refusing to run it without idempotency "
                    "(pass raise_on_no_key=False to allow that)",
                    key=raw,
                )
            logger.warning("%s: running it WITHOUT idempotency", message)
            return None
        key = raw if isinstance(raw, str) else _canonical(raw)
        return keys.validate_key(key, "idempotency key")

    def _call(
        self,
        func: Callable[..., R],
        options: _Compiled,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> R:
        key = self._key_of(func, options, options.key(*args, **kwargs))
        if key is None:
            return func(*args, **kwargs)
        payload_hash = (
            None if options.payload is None else hash_payload(options.payload(*args, **kwargs))
        )
        if options.local is not None:
            cached = options.local.get(key, now_ms(self.clock))
            if cached is not None:
                self._check_payload(cached, payload_hash)
                self._metrics.count("IdempotencyLocalHit")
                return self._replay(options, cached)  # type: ignore[no-any-return]
        own_context = _lambda_context(args) if len(args) >= 2 else None
        if own_context is None:
            # the registered context, if any (lambda_context() also checks its remaining time)
            context = None if _CURRENT_CONTEXT.get() is None else lambda_context()
            return self._claim_and_run(func, options, args, kwargs, key, payload_hash, context)
        # A decorated handler: the idempotent functions it calls share its invocation's deadline.
        registered = _CURRENT_CONTEXT.set(own_context)
        try:
            return self._claim_and_run(func, options, args, kwargs, key, payload_hash, own_context)
        finally:
            _CURRENT_CONTEXT.reset(registered)

    def _claim_and_run(
        self,
        func: Callable[..., R],
        options: _Compiled,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: str,
        payload_hash: str | None,
        context: Any | None,
    ) -> R:
        lease_ms = options.in_progress_ms
        wait_timeout = options.wait_timeout
        if context is not None:
            # Lambda ends the invocation at this point, so the claim cannot be live after it.
            remaining_ms = max(1, int(context.get_remaining_time_in_millis()))
            lease_ms = remaining_ms if lease_ms is None else min(lease_ms, remaining_ms)
            wait_timeout = min(wait_timeout, remaining_ms / 1000)
        if lease_ms is None:
            lease_ms = ttl_to_ms(DEFAULT_IN_PROGRESS_TTL)
        wait = options.wait
        # Only a waiting call has a deadline (without wait a duplicate in progress raises at once).
        deadline = self.clock.monotonic() + wait_timeout if wait else 0.0
        delay = self.backoff_initial
        refusals = 0
        while True:
            outcome = self._claim(key, lease_ms, payload_hash)
            if outcome.claim is not None:
                self._metrics.count("IdempotencyFirstCall")
                return self._run(func, options, args, kwargs, outcome.claim)
            record = outcome.existing
            if record is None:
                # Refused without the record (a store that cannot return it): read it instead.
                record = self.get(key)
                if record is None and refusals < 3:
                    refusals += 1
                    continue  # freed in between: claim again
            while True:
                if record is not None:
                    if payload_hash is not None:
                        self._check_payload(record, payload_hash)
                    if record.status is IdempotencyStatus.COMPLETED:
                        logger.debug("idempotency key %r replayed", key)
                        if options.local is not None and record.unstorable is None:
                            options.local.put(record)
                        return self._replay(options, record)  # type: ignore[no-any-return]
                remaining = deadline - self.clock.monotonic() if wait else 0.0
                if remaining <= 0:
                    self._metrics.count("IdempotencyInProgress")
                    raise IdempotencyInProgressError(
                        f"a call with idempotency key {key!r} is already in progress"
                        + (
                            f" (its lease ends at {record.expires_at:.3f})"
                            if record is not None
                            else ""
                        ),
                        key=key,
                        expires_at=None if record is None else record.expires_at,
                    )
                # Equal jitter: waiters poll spread out, but never hammer the item.
                self.clock.sleep(min(remaining, delay / 2 + random.uniform(0, delay / 2)))
                delay = min(self.backoff_max, delay * 2)
                record = self.get(key)
                if record is None:
                    break  # released (the call failed) or its lease expired: try to claim it

    def _replay(self, options: _Compiled, record: IdempotencyRecord) -> Any:
        """The result a duplicate gets from a completed record."""
        self._metrics.count("IdempotencyReplay")
        # record.unstorable and record.result, read once
        text = record.result_text
        if text is not None and text.startswith(UNSTORABLE_PREFIX):
            kind, fix = unstorable_marker(text) or ("?", None)
            raise IdempotencyValueError(
                not_replayable(record.key, kind, fix, duplicate=True), key=record.key
            )
        data = None if text is None else codec.decode(text)
        if options.output is not None:
            try:
                data = options.output.from_store(data)
            except Exception as exc:
                raise IdempotencyValueError(
                    f"the stored result of idempotency key {record.key!r} cannot be read back "
                    f"as {options.output.name}: {exc}",
                    key=record.key,
                ) from exc
        if options.response_hook is not None:
            return options.response_hook(data, record)
        return data

    def _check_payload(self, record: IdempotencyRecord, payload_hash: str | None) -> None:
        if (
            payload_hash is not None
            and record.payload_hash is not None
            and record.payload_hash != payload_hash
        ):
            raise IdempotencyKeyMismatchError(
                f"idempotency key {record.key!r} was already used with a different payload",
                key=record.key,
            )

    def _encode(self, options: _Compiled, claim: Claim, result: Any) -> str | Refused:
        """The codec text of ``result`` for ``claim``, or why it cannot be stored and the fix."""
        data = result
        try:
            if options.output is not None:
                data = options.output.to_store(result)
            text = codec.encode(data)
            self._check_size(claim, text)
        except Exception as exc:
            return Refused(exc, fix_for(exc, options.output, result, data))
        return text

    def _run(
        self,
        func: Callable[..., R],
        options: _Compiled,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        claim: Claim,
    ) -> R:
        try:
            result = func(*args, **kwargs)
        except BaseException:
            # Errors are not cached: free the key so that a retry runs the function again.
            try:
                self._store.release(claim.key, claim.token)
            except Exception:
                logger.exception(
                    "could not release idempotency claim %r after the function failed; "
                    "it blocks the key until %r",
                    claim.key,
                    claim.expires_at,
                )
            raise
        text = self._encode(options, claim, result)
        if isinstance(text, Refused):
            # The side effects happened: never let a duplicate run them again. The record is
            # completed with a marker that makes every duplicate raise with the same advice.
            self._metrics.count("IdempotencyUnstorable")
            kind = type_name(result)
            marker = f"{UNSTORABLE_PREFIX}{kind};{text.fix}"
            try:
                self._store.complete(
                    claim.key, claim.token, marker, options.ttl_ms, now_ms(self.clock)
                )
            except Exception:
                logger.exception("could not mark idempotency key %r as unstorable", claim.key)
            name = getattr(func, "__qualname__", repr(func))
            raise IdempotencyValueError(
                f"{name} returned {with_article(kind)} for idempotency key {claim.key!r}, which cannot be "
                f"stored ({text.cause}). Fix: {text.fix}. This call's side effects ran; its "
                "duplicates raise this error instead of running again, until the record expires "
                f"or backend.idempotency.delete({claim.key!r})",
                key=claim.key,
            ) from text.cause
        try:
            stored = self._store.complete(
                claim.key, claim.token, text, options.ttl_ms, now_ms(self.clock)
            )
        except Exception:
            # The function ran (its side effects happened): its result must reach the caller.
            # The claim stays IN_PROGRESS until its lease ends, then the key is free again.
            logger.exception(
                "could not store the result for idempotency key %r; the key stays in progress "
                "until %r",
                claim.key,
                claim.expires_at,
            )
            return result
        if not stored:
            logger.warning(
                "idempotency claim on %r was lost before completion (lease expired and taken "
                "over); the result was not stored",
                claim.key,
            )
        elif options.local is not None:
            completed_at = now_ms(self.clock)
            options.local.put(
                IdempotencyRecord(
                    key=claim.key,
                    status=IdempotencyStatus.COMPLETED,
                    expires_at_ms=completed_at + options.ttl_ms,
                    payload_hash=claim.payload_hash,
                    result_text=text,
                )
            )
        return result
