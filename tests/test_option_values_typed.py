"""The keyword shorthand of every options object is typed: each ``*OptionValues`` TypedDict
names exactly its dataclass's fields with the same types, so mypy checks
``backend.breaker(name, failure_treshold=3)`` as it checks ``BreakerOptions(...)``."""

from __future__ import annotations

import dataclasses
import typing
import warnings
from pathlib import Path

import pytest

from dynacoord.breaker import BreakerOptions, BreakerOptionValues
from dynacoord.errors import ConfigurationError
from dynacoord.idempotency import IdempotencyOptions, IdempotencyOptionValues
from dynacoord.outbox import DeliveryHooks
from dynacoord.outbox.options import WorkerKeywords, WorkerOptions, WorkerOptionValues

PAIRS = [
    (BreakerOptions, BreakerOptionValues),
    (IdempotencyOptions, IdempotencyOptionValues),
    (WorkerOptions, WorkerOptionValues),
]


@pytest.mark.parametrize(("options", "values"), PAIRS, ids=lambda c: c.__name__)
def test_the_typed_keywords_are_the_options_fields(options: type, values: type) -> None:
    fields = {f.name: f.type for f in dataclasses.fields(options) if f.init}
    declared = dict(values.__annotations__)
    assert set(declared) == set(fields), set(declared) ^ set(fields)
    for name, annotation in declared.items():
        # both modules use postponed annotations: the same text is the same type
        text = getattr(annotation, "__forward_arg__", annotation)
        assert text == fields[name], name
    assert values.__total__ is False


def test_the_worker_keywords_add_what_worker_takes_by_name() -> None:
    assert set(WorkerKeywords.__annotations__) - set(WorkerOptionValues.__annotations__) == {
        "options",
        "name",
        "hooks",
    }
    assert set(typing.get_type_hints(WorkerKeywords)) >= set(WorkerOptionValues.__annotations__)


def test_mypy_refuses_a_misspelled_option(tmp_path: Path) -> None:
    from mypy import api

    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        "from dynacoord.backends.dynamodb import DynamoDBBackend\n"
        "def f(backend: DynamoDBBackend) -> None:\n"
        "    backend.breaker('svc', failure_treshold=3)\n"
        "    backend.outbox.worker(print, batch_size='10')\n"
        "    backend.breaker('svc', reset_timeout=5.0)\n"
    )
    # the project's settings and cache: after make test's own mypy run only the snippet is new
    root = Path(__file__).resolve().parents[1]
    out, _, status = api.run(
        [
            str(snippet),
            "--config-file",
            str(root / "pyproject.toml"),
            "--cache-dir",
            str(root / ".mypy_cache"),
        ]
    )
    assert status == 1, out
    assert 'Unexpected keyword argument "failure_treshold"' in out, out
    assert '"batch_size"' in out and '"str"' in out, out
    assert out.count("error:") == 2, out


def test_the_per_hook_keywords_are_deprecated_and_refused_beside_hooks(mongo_database) -> None:
    from dynacoord.backends.mongo import MongoBackend

    backend = MongoBackend(mongo_database)
    seen: list[str] = []
    with pytest.warns(DeprecationWarning, match=r"hooks=DeliveryHooks\(on_failed=...\)"):
        worker = backend.outbox.worker(print, on_failed=lambda e: seen.append(e.id))
    assert worker.delivery.hooks.on_failed is not None
    with pytest.raises(ConfigurationError, match="hooks=DeliveryHooks"):
        backend.outbox.worker(print, hooks=DeliveryHooks(), on_error=lambda e, x: None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hooks = DeliveryHooks(on_failed=lambda e: None)
        assert backend.outbox.worker(print, hooks=hooks).delivery.hooks is hooks
