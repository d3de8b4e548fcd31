"""Request metrics of the Redis backend: a thin proxy of the client that times each request.

It is installed by :class:`~dynacoord.backends.redis._conn.RedisConn` only when the backend has a
metrics listener (``RedisBackend(..., metrics=...)``); without one the stores talk to the client
directly and nothing is measured. What is timed, each as one request:

* the commands the stores send directly (``HMGET``, ``HGETALL``, ``DEL``, ...);
* every Lua script run on its own (``EVALSHA``, falling back to ``EVAL``);
* every pipeline's ``execute`` (``PIPELINE``: one round trip).

Not timed: the per-node pipelines of a Redis Cluster listing (they go through node connections
the cluster client hands out).
"""

from __future__ import annotations

import time
from typing import Any

from ...metrics import Metrics, measure_request

__all__ = ["TimedRedis"]

#: client methods that are one request each, with the command name they report
_COMMANDS = {
    name: name.upper()
    for name in (
        "get",
        "set",
        "hget",
        "hgetall",
        "hmget",
        "hset",
        "exists",
        "zrangebylex",
        "zrevrangebylex",
        "zlexcount",
        "zrange",
        "zrangebyscore",
        "zcard",
        "zscore",
        "scan",
        "eval",
        "evalsha",
        "ping",
    )
}
_COMMANDS["delete"] = "DEL"


class TimedRedis:
    """Forwards everything to ``client``; times the requests listed in the module docstring."""

    def __init__(self, client: Any, metrics: Metrics) -> None:
        self._client = client
        self._metrics = metrics

    def _timed(self, method: Any, operation: str) -> Any:
        metrics = self._metrics
        dimensions = {"Backend": "redis", "Operation": operation}

        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                result = method(*args, **kwargs)
            except Exception:
                measure_request(metrics, dimensions, start, failed=True)
                raise
            measure_request(metrics, dimensions, start)
            return result

        return call

    def register_script(self, source: Any) -> Any:
        return _TimedScript(self._client.register_script(source), self)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        pipe = self._client.pipeline(*args, **kwargs)
        # The pipeline is ours (made for this call): time its one round trip in place, so that
        # redis-py still sees a real Pipeline (it registers scripts on it by isinstance).
        pipe.execute = self._timed(pipe.execute, "PIPELINE")
        return pipe

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        operation = _COMMANDS.get(name)
        if operation is None or not callable(attribute):
            return attribute
        return self._timed(attribute, operation)

    def __repr__(self) -> str:
        return f"TimedRedis({self._client!r})"


class _TimedScript:
    """A registered script whose standalone runs are timed (runs queued on a pipeline are
    timed by the pipeline's ``execute``)."""

    def __init__(self, script: Any, owner: TimedRedis) -> None:
        self._script = script
        self._run = owner._timed(script, "EVALSHA")

    def __call__(self, keys: Any = None, args: Any = None, client: Any = None) -> Any:
        if client is not None:
            return self._script(keys=keys, args=args, client=client)
        return self._run(keys=keys, args=args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._script, name)
