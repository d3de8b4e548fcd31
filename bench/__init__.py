"""dynacoord benchmarks: ``python -m bench`` (or ``make bench``) writes ``bench/results/``.

Sections (each a module with ``run(env) -> dict``): requests per operation, overhead over raw
boto3, outbox throughput, lock contention, import time and cold start, peers. A section that
fails is recorded with its error and the run goes on; the report always has every section.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ._harness import FULL, TINY, BenchEnv, Scale, bench_env, section_error

__all__ = ["FULL", "RESULTS_DIR", "SECTIONS", "TINY", "Scale", "run_all", "versions"]

logger = logging.getLogger(__name__)

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _section_runners() -> dict[str, Callable[[BenchEnv], dict[str, Any]]]:
    from . import (
        admission,
        coldstart,
        contention,
        costs,
        exactness,
        metrics,
        outbox,
        overhead,
        peers,
        request_counts,
        writecost,
    )

    return {
        "requests": request_counts.run,
        "overhead": overhead.run,
        "outbox": outbox.run,
        "contention": contention.run,
        "coldstart": coldstart.run,
        "peers": peers.run,
        "exactness": exactness.run,
        "metrics": metrics.run,
        "writecost": writecost.run,
        "costs": costs.run,
        "admission": admission.run,
    }


SECTIONS = (
    "requests",
    "overhead",
    "outbox",
    "contention",
    "coldstart",
    "peers",
    "exactness",
    "metrics",
    "writecost",
    "costs",
    "admission",
)


def _dist(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions(env: BenchEnv | None = None) -> dict[str, str]:
    """Machine and versions for the report."""
    out = {
        "python": sys.version.split()[0] + f" ({platform.python_implementation()})",
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu count": str(os.cpu_count()),
        "dynacoord": _dist("dynacoord"),
        "boto3": _dist("boto3"),
        "botocore": _dist("botocore"),
        "redis-py": _dist("redis"),
        "aws-lambda-powertools": _dist("aws-lambda-powertools"),
        "python-dynamodb-lock": _dist("python-dynamodb-lock"),
        "pybreaker": _dist("pybreaker"),
    }
    if env is not None:
        out["DynamoDB Local"] = env.ddb_version
        out["redis-server"] = env.redis.version if env.redis else f"unavailable ({env.redis_error})"
        out["Redis Cluster"] = (
            f"{len(env.redis_cluster.ports)} primaries, no replicas (local)"
            if env.redis_cluster
            else f"unavailable ({env.redis_cluster_error})"
        )
    try:
        load = os.getloadavg()
        out["load average at start (1/5/15 min)"] = " / ".join(f"{x:.2f}" for x in load)
    except OSError:
        pass
    return out


def run_all(
    scale: Scale = FULL,
    *,
    out_dir: Path | None = RESULTS_DIR,
    sections: Iterable[str] = SECTIONS,
    ddb: Any = None,
    command: str = "make bench",
    beside: str = "HEAD",
) -> dict[str, Any]:
    """Run the selected sections and (unless ``out_dir`` is None) write the report there,
    beside the results committed at the git revision ``beside``."""
    from .report import write

    selected = [s for s in SECTIONS if s in set(sections)]
    runners = _section_runners()
    started = time.perf_counter()
    results: dict[str, Any] = {"meta": {}, "sections": {}}
    with bench_env(scale, ddb=ddb) as env:
        results["meta"] = {
            "generated_at": datetime.datetime.now(datetime.timezone.utc).strftime(
                "%Y-%m-%d %H:%M UTC"
            ),
            "command": command,
            "scale": scale.as_dict(),
            "versions": versions(env),
        }
        for name in selected:
            t0 = time.perf_counter()
            logger.info("section %s ...", name)
            try:
                section = runners[name](env)
            except Exception as exc:
                logger.exception("section %s failed", name)
                section = section_error(exc)
            section["section_seconds"] = round(time.perf_counter() - t0, 1)
            results["sections"][name] = section
            logger.info("section %s done in %.1f s", name, section["section_seconds"])
    results["meta"]["duration_s"] = round(time.perf_counter() - started, 1)
    if out_dir is not None:
        write(results, out_dir, beside=beside)
    return results
