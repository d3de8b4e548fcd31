"""An ``async def`` handler is refused when the worker or the stream relay is made (issue 49):
called, it returns a coroutine without running a line, and the event was stored completed (only
Python's "never awaited" warning remained). Plain callables, classes and objects whose
``__call__`` is plain are still taken."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from dynacoord import ManualClock
from dynacoord.errors import ConfigurationError
from dynacoord.outbox import Event


async def send(event: Event) -> None:  # pragma: no cover - never called
    pass


async def stream_of(event: Event) -> Any:  # pragma: no cover - never called
    yield event


class AsyncCallable:
    async def __call__(self, event: Event) -> None:  # pragma: no cover - never called
        pass


class PlainCallable:
    def __call__(self, event: Event) -> None:
        pass


ASYNC = {
    "async def": send,
    "async generator": stream_of,
    "partial of async def": functools.partial(send),
    "object with async __call__": AsyncCallable(),
    "async lambda in a mapping": {"t": send},
    "async catch-all": {"t": lambda e: None, "*": AsyncCallable()},
}


@pytest.fixture()
def outbox(moto_table: tuple[Any, str]) -> Any:
    from dynacoord.backends.dynamodb import DynamoDBBackend

    client, table = moto_table
    return DynamoDBBackend(client, table_name=table, clock=ManualClock()).outbox


@pytest.mark.parametrize("handlers", list(ASYNC.values()), ids=list(ASYNC))
def test_a_worker_refuses_an_async_handler(outbox: Any, handlers: Any) -> None:
    with pytest.raises(ConfigurationError, match="async") as caught:
        outbox.worker(handlers)
    assert "await" in str(caught.value) or "asyncio" in str(caught.value)


@pytest.mark.parametrize("handlers", list(ASYNC.values()), ids=list(ASYNC))
def test_the_stream_relay_and_the_sweeper_refuse_an_async_handler(
    outbox: Any, handlers: Any
) -> None:
    with pytest.raises(ConfigurationError, match="async"):
        outbox.stream_handler(handlers)
    with pytest.raises(ConfigurationError, match="async"):
        outbox.sweep_handler(handlers)


def test_nothing_is_claimed_or_completed_by_a_refused_worker(outbox: Any) -> None:
    outbox.publish(Event("t", 1, id="e1"))
    with pytest.raises(ConfigurationError):
        outbox.worker(send).run_once()
    assert outbox.get("e1").status.value == "pending"


def test_plain_callables_are_taken(outbox: Any) -> None:
    outbox.publish(Event("t", 1, id="e1"))
    got: list[str] = []
    assert outbox.worker(functools.partial(lambda tag, e: got.append(tag + e.id), "x")).run_once()
    assert got == ["xe1"]
    outbox.worker(PlainCallable())
    outbox.worker({"t": PlainCallable(), "*": print})
    outbox.worker(PlainCallable)  # a class: calling it makes an instance, not a coroutine
