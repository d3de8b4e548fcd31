"""The recognition window of counting writes and the slot pool (dynacoord._writers).

A counting write is recognised by its slot's token for as long as its client may still re-send
it: the window is read from the client's own configuration (DESIGN.md section 1: "A recognition
window is never shorter than the client's own retries"), and a slot is leased for one call, so
an item holds a slot per call in flight, not per thread ever created.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from botocore.config import Config

from dynacoord import _writers
from dynacoord.backends.dynamodb._retry_window import client_window_ms, retry_window_ms

# -- the window, from the client's configuration ----------------------------------------------


def _client(config: Config | None = None) -> Any:
    import boto3

    return boto3.client(
        "dynamodb",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        config=config,
    )


def test_botocore_defaults_give_a_window_longer_than_every_retry() -> None:
    # standard mode, 3 attempts of 60 s connect + 60 s read, two backoffs of at most 20 s
    window = client_window_ms(_client())
    assert window == 3 * 120_000 + 2 * 20_000
    assert window > 60_000  # the previous constant: shorter than one default read timeout


@pytest.mark.parametrize(
    ("retries", "attempts", "backoff_s"),
    [
        ({"mode": "standard", "max_attempts": 4}, 5, 4 * 20),  # max_attempts counts retries
        ({"mode": "standard", "total_max_attempts": 6}, 6, 5 * 20),
        ({"mode": "adaptive", "max_attempts": 8}, 9, 8 * 20),  # DynamoDBBackend.from_env()
        ({"mode": "legacy"}, 10, 0.05 * (2**9 - 1)),  # DynamoDB's legacy policy: 10 attempts
    ],
)
def test_the_window_covers_timeouts_times_attempts_plus_backoff(
    retries: dict[str, Any], attempts: int, backoff_s: float
) -> None:
    config = Config(connect_timeout=3, read_timeout=7.5, retries=retries)
    window = client_window_ms(_client(config))
    assert window >= attempts * 10_500 + backoff_s * 1000
    assert window == pytest.approx(attempts * 10_500 + backoff_s * 1000, abs=1)


def test_a_timeout_of_none_is_not_a_short_window() -> None:
    config = Config(connect_timeout=None, read_timeout=None, retries={"mode": "standard"})
    assert retry_window_ms(config) >= 3 * 2 * 3_600_000


def test_from_env_counts_within_its_own_clients_retries(monkeypatch) -> None:
    from dynacoord.backends.dynamodb import DynamoDBBackend

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    backend = DynamoDBBackend.from_env()
    config = backend.client.meta.config
    attempts = config.retries["total_max_attempts"]
    floor = attempts * (config.connect_timeout + config.read_timeout) * 1000
    assert backend.table.count_window_ms >= floor + (attempts - 1) * 20_000


def test_a_token_says_until_when_its_call_may_retry() -> None:
    now = 1_764_230_000_000  # epoch ms
    saved = _writers._pool[0]
    _writers._pool[0] = _writers._Pool()  # fresh slots: none carries a later token yet
    try:
        slot, token = _writers.lease(now, 400_000)
        _writers.release(slot)
    finally:
        _writers._pool[0] = saved
    assert _writers.token_ms(token) == now + 400_000
    # a token of the previous design: made at its time, held for 60 s
    assert _writers.token_ms(now * 10**6 + 5) == now + 60_000


# -- the pool: a slot per call in flight ------------------------------------------------------


def test_calls_that_never_overlap_share_one_slot_whatever_the_threads() -> None:
    names = set()

    def call() -> None:
        slot, _ = _writers.lease(0, 1)
        names.add(slot.name)
        _writers.release(slot)

    for _ in range(50):  # a new thread per request
        t = threading.Thread(target=call)
        t.start()
        t.join()
    assert len(names) == 1


def test_calls_in_flight_hold_distinct_slots_and_a_slots_tokens_increase() -> None:
    held = [_writers.lease(5, 10) for _ in range(4)]
    assert len({slot.name for slot, _ in held}) == 4
    for slot, _ in held:
        _writers.release(slot)
    again = [_writers.lease(5, 10) for _ in range(4)]  # the same clock: tokens still move on
    assert {slot.name for slot, _ in again} == {slot.name for slot, _ in held}
    before = {slot.name: token for slot, token in held}
    for slot, token in again:
        assert token > before[slot.name]
        _writers.release(slot)
