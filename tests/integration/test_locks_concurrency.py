"""Mutual exclusion under real contention on real servers: Amazon DynamoDB Local, redis-server,
a 3-primary Redis Cluster, and MongoDB when ``MONGODB_URI`` is set."""

from __future__ import annotations

import threading
import time

import pytest

from tests.backends_fixtures import EXTRA_CONTRACT_BACKENDS

THREADS = 8
ROUNDS = 50
REAL_SERVERS = [
    "dynamodb",
    "redis",
    "redis_cluster",
    *(k for k in EXTRA_CONTRACT_BACKENDS if k == "mongodb"),
]


@pytest.fixture(params=REAL_SERVERS)
def server_backend(request):
    if request.param == "dynamodb":
        return request.getfixturevalue("ddb_backend")
    return request.getfixturevalue(f"{request.param}_backend_factory")()


@pytest.mark.integration
def test_8_threads_x_50_acquisitions_no_overlap_and_increasing_fences(server_backend):
    locks = server_backend.locks
    inside = 0
    inside_guard = threading.Lock()
    violations = []
    fences: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(n: int) -> None:
        try:
            start.wait()
            for _ in range(ROUNDS):
                lease = locks.acquire("hot", ttl=10, owner=f"t{n}", timeout=60)
                assert lease is not None
                nonlocal inside
                with inside_guard:
                    inside += 1
                    if inside != 1:
                        violations.append(inside)
                    fences.append(lease.fence)
                time.sleep(0.001)  # a critical section with a width, so an overlap can show
                with inside_guard:
                    inside -= 1
                assert lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert violations == []
    assert len(fences) == THREADS * ROUNDS
    # Fences were recorded inside the critical section, so their order is the acquisition order.
    assert all(a < b for a, b in zip(fences, fences[1:]))
