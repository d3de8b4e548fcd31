"""Section 3: outbox throughput.

2,000 events (full run) are published, then delivered by 1, 2 and 4 worker threads and by 2
worker processes with a no-op handler. Reported: events delivered per second, requests per
delivered event, and lost / duplicate deliveries (both must be 0).
"""

from __future__ import annotations

from typing import Any

from ._harness import BenchEnv

__all__ = ["run"]


def run(env: BenchEnv) -> dict[str, Any]:
    backend = env.backend()
    if not hasattr(backend, "outbox"):
        return {"status": "not landed", "error": "backend.outbox is not in this checkout"}
    raise NotImplementedError("outbox throughput not wired yet")
