"""How long after a call started botocore may still send a retry of its request: the client's
retry window, read from its configuration.

A write that must recognise its own retry (a counting write's slot, dynacoord._writers) keeps
what recognises it for at least this long: a recognition window is never shorter than the
client's own retries (timeouts x attempts + backoff).

No botocore import at module level (the cold-start path; see ``_marshal.py``).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["client_window_ms", "retry_window_ms"]

#: botocore's standard and adaptive modes wait at most this long before one retry
#: (``botocore.retries.standard``: ``min(rand * 2**i, 20)`` seconds)
_BACKOFF_CAP_S = 20.0
#: the attempts of standard and adaptive modes when none are configured
_STANDARD_ATTEMPTS = 3
#: a timeout of None (botocore then waits without limit) counts as this many seconds
_NO_TIMEOUT_S = 3600.0


def _legacy_policy() -> tuple[int, float, float]:
    """(attempts, base delay s, growth) of botocore's legacy retries for DynamoDB, from
    botocore's own retry model (``_retry.json``: 10 attempts, 0.05 s doubling)."""
    import botocore.loaders

    model = botocore.loaders.create_loader().load_data("_retry")["retry"]
    policy = {**model.get("__default__", {}), **model.get("dynamodb", {}).get("__default__", {})}
    delay = policy.get("delay", {})
    base = delay.get("base", 1)
    return (
        int(policy.get("max_attempts", 5)),
        1.0 if base == "rand" else float(base),
        float(delay.get("growth_factor", 2)),
    )


def retry_window_ms(config: Any) -> int:
    """How long after a call started botocore may still send a retry of its request, from the
    client's configuration (``client.meta.config``): every attempt may take its connect and
    read timeouts, and every retry waits its mode's backoff ceiling first.

    ``(connect_timeout + read_timeout) x attempts + backoff``, where attempts is
    ``total_max_attempts`` (botocore turns ``max_attempts`` into it, plus one), else the mode's
    default (standard and adaptive: 3; legacy: DynamoDB's 10), and backoff is 20 s per retry in
    standard and adaptive mode (botocore's cap) and the sum of the legacy mode's exponential
    delays. botocore's defaults (60 s + 60 s, standard, 3 attempts) give 400 s; the client of
    ``DynamoDBBackend.from_env()`` (adaptive, ``max_attempts=8``: 9 attempts) 1,240 s.
    """

    def seconds(value: Any) -> float:
        return _NO_TIMEOUT_S if value is None else float(value)

    connect = seconds(getattr(config, "connect_timeout", 60))
    read = seconds(getattr(config, "read_timeout", 60))
    retries = getattr(config, "retries", None) or {}
    mode = retries.get("mode") or "standard"
    attempts = retries.get("total_max_attempts")
    if attempts is None and retries.get("max_attempts") is not None:
        attempts = int(retries["max_attempts"]) + 1
    if mode == "legacy":
        default, base, growth = _legacy_policy()
        attempts = max(1, int(attempts or default))
        backoff = sum(base * growth**i for i in range(attempts - 1))
    else:
        attempts = max(1, int(attempts or _STANDARD_ATTEMPTS))
        backoff = _BACKOFF_CAP_S * (attempts - 1)
    return math.ceil((attempts * (connect + read) + backoff) * 1000)


def client_window_ms(client: Any) -> int:
    """:func:`retry_window_ms` of a client (botocore's defaults for an object without a
    botocore configuration, such as a test double)."""
    meta = getattr(client, "meta", None)
    config = getattr(meta, "config", None)
    if config is None:
        from botocore.config import Config

        config = Config()
    return retry_window_ms(config)
