"""The Redis outbox's Lua scripts read each entry of their JSON argument by name. A name misspelt on
either side reads as nil in Lua without an error, so every name a script reads must be a field of
the entry type the store builds, and every field of that type must be read (none sent for
nothing). The scripts' behaviour is held by tests/contract/ and tests/test_outbox_gates.py."""

from __future__ import annotations

import re
from typing import Any

import pytest

from dynacoord.backends.redis import outbox as redis_outbox

# (script, the Lua expression an entry is read through, the entry's type)
ENTRIES = [
    ("publish", redis_outbox._PUBLISH, r"events\[i\]", redis_outbox._PublishEntry),
    ("claim", redis_outbox._CLAIM_MANY, r"\bspec", redis_outbox._ClaimSpec),
    ("claim event", redis_outbox._CLAIM_MANY, r"\be", redis_outbox._ClaimEntry),
    ("finish", redis_outbox._FINISH_MANY, r"\bo", redis_outbox._OutcomeEntry),
    ("extend", redis_outbox._EXTEND_MANY, r"held\[i\]", redis_outbox._ExtendEntry),
    ("retry group", redis_outbox._RETRY_GROUP, r"spec\[i\]", redis_outbox._RetryEntry),
]


def names_read(script: str, via: str) -> set[str]:
    dotted = re.findall(via + r"\.([A-Za-z_]\w*)", script)
    bracketed = re.findall(via + r"\['([A-Za-z_]\w*)'\]", script)
    return set(dotted) | set(bracketed)


def fields_of(entry: Any) -> set[str]:
    return set(entry.__required_keys__) | set(entry.__optional_keys__)


@pytest.mark.parametrize(
    ("script", "via", "entry"), [case[1:] for case in ENTRIES], ids=[case[0] for case in ENTRIES]
)
def test_a_script_reads_exactly_the_fields_its_entry_declares(
    script: str, via: str, entry: Any
) -> None:
    assert names_read(script, via) == fields_of(entry)


def test_no_script_reads_an_entry_by_position() -> None:
    for name, script, via, _entry in ENTRIES:
        assert not re.findall(via + r"\[\d+\]", script), name


def test_a_misspelt_name_is_caught() -> None:
    script = redis_outbox._FINISH_MANY.replace("o.gc_ms", "o.gcms")
    assert names_read(script, r"\bo") != fields_of(redis_outbox._OutcomeEntry)
