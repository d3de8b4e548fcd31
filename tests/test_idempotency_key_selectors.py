"""Idempotency key selectors: a JMESPath expression that is one field name is evaluated without
jmespath, with the same answer."""

from __future__ import annotations

import pytest

# -- idempotency key selectors ---------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["order_id", "_x", "A1", "true", "null"])
@pytest.mark.parametrize(
    "event",
    [
        {"order_id": "o-1", "_x": 0, "A1": [1], "true": False, "null": {"a": 1}},
        {"order_id": None},
        {},
        ["order_id"],
        "order_id",
        7,
        None,
    ],
)
def test_a_bare_field_selector_gives_what_jmespath_gives(spec, event):
    # a JMESPath expression that is one field name is evaluated without jmespath: same answer
    import jmespath

    from dynacoord._invocation import _selector, jmespath_options

    assert _selector(spec, "key")(event) == jmespath.search(spec, event, options=jmespath_options())
    assert _selector(spec, "key").__name__ == f"jmespath({spec!r})"


def test_a_bare_field_selector_needs_the_event():
    from dynacoord._invocation import _selector

    with pytest.raises(TypeError, match="without a positional argument"):
        _selector("order_id", "key")(order_id="o-1")
