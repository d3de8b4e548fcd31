"""The module walk of ``Outbox.publish`` and of one delivered event (``python -m bench.walk``):
the dynacoord modules a call enters, in order (moto, one shard), how many distinct ones
(rooms) and how many entries into a module already seen other than the one just left
(returns). A measure of how often control crosses back and forth between modules, to compare
two versions of the code on the same machine; it is not a speed figure."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any


def walk(call: Callable[[], Any]) -> tuple[int, int, list[str]]:
    """(rooms, returns, the modules entered in order) of one call."""
    entered: list[str] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        path = frame.f_code.co_filename
        at = path.find("/dynacoord/")
        if at >= 0:
            module = path[at + 1 :].removesuffix(".py")
            if not entered or entered[-1] != module:
                entered.append(module)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    seen: set[str] = set()
    returns = 0
    for module in entered:
        returns += module in seen
        seen.add(module)
    return len(seen), returns, entered


def main() -> None:
    for name, value in (("AWS_DEFAULT_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "bench")):
        os.environ.setdefault(name, value)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    import boto3
    from moto import mock_aws

    from dynacoord.backends.dynamodb import DynamoDBBackend
    from dynacoord.outbox import Event
    from dynacoord.provision import create_table

    with mock_aws():
        client = boto3.client("dynamodb")
        create_table(client, "walk-table")
        outbox = DynamoDBBackend(client, table_name="walk-table", namespace="walk", shards=1).outbox
        outbox.publish(Event("warm", 0))  # first-use checks out of the walk
        outbox.worker(lambda event: None).run_once()
        worker = outbox.worker(lambda event: None)
        walked = Event("t", 1, id="walked")  # made before the walk: it walks publish alone
        for name, call in (
            ("publish", lambda: outbox.publish(walked)),
            ("delivered event", worker.run_once),
        ):
            rooms, returns, entered = walk(call)
            print(f"{name}: {rooms} rooms, {returns} returns")
            if "-v" in sys.argv:
                print("  " + " > ".join(entered))


if __name__ == "__main__":
    main()
