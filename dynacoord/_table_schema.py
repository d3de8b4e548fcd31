"""What a dynacoord table must look like, checked on a DescribeTable answer, and
the :class:`TableLayout` that names the table's key attributes.

Shared by :func:`dynacoord.provision.verify_table` (the ``table verify`` command) and the
DynamoDB backend's check on first use, so both name a problem in the same words. Pure functions
over the ``Table`` dict: no request, no boto3 import.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "DEFAULT_LAYOUT",
    "GSI_NAME",
    "TTL_ATTRIBUTE",
    "TableLayout",
    "key_schema_problems",
    "schema_problems",
    "ttl_problem",
]

GSI_NAME = "gsi1"
TTL_ATTRIBUTE = "ttl"

#: the attributes dynacoord's items use for their own data: a layout name equal to one of them
#: would make an item's key and its data one attribute (``w:`` starts the writer slots)
_DYNACOORD_ATTRIBUTES = frozenset(
    [
        "attempts",
        "c",
        "completed_by",
        "completed_ms",
        "created_ms",
        "ctx",
        "data",
        "due_ms",
        "end_ttl_ms",
        "end_ttl_s",
        "ended_ms",
        "error",
        "event_group",
        "event_id",
        "event_type",
        "expected",
        "failed_ms",
        "failures",
        "fence",
        "finished_by",
        "gen",
        "gone",
        "kind",
        "last",
        "last_error",
        "lease_token",
        "m",
        "manual_retries",
        "members",
        "metadata",
        "n",
        "next_seq",
        "occurred_at_ms",
        "opened_at_ms",
        "owner",
        "payload",
        "payload_hash",
        "place",
        "progress",
        "published",
        "published_ms",
        "reconciles",
        "released_by",
        "released_owner",
        "req",
        "req_from",
        "reset",
        "result",
        "retried_by",
        "retry_due_ms",
        "run_id",
        "seq",
        "shards",
        "start",
        "state",
        "status",
        "successes",
        "token",
        "trial_calls",
        "trial_round",
        "trial_started_ms",
        "updated_ms",
        "v",
        "value",
        "wgen",
    ]
)
#: characters a key prefix may not hold: IAM wildcards and variables (the LeadingKeys condition
#: is written with the prefix), and the quote and backslash of the stack's JSON stream filter
_PREFIX_FORBIDDEN = frozenset('*?$"\\')
_MAX_PREFIX_CHARS = 64


#: TableLayout's fields, in the order of its constructor and ``repr``
_LAYOUT_FIELDS = ("pk", "sk", "index", "index_pk", "index_sk", "ttl", "expires_at", "prefix")


class TableLayout:
    """The names of the table's key attributes, index and expiry attributes, and a key prefix:
    how dynacoord lives in a single table you already have.

    ``TableLayout()`` is dynacoord's own schema (``pk``/``sk``, index ``gsi1`` on
    ``gsi1pk``/``gsi1sk``, TTL on ``ttl``, expiry in ``expires_at_ms``, no prefix) and costs
    nothing: the backend sends exactly the requests it sends without a layout. Any other layout
    is applied at one point, a wrapper around the client (``backends/dynamodb/_layout.py``):
    attribute names in keys, items and expressions are renamed, the index name replaced, and
    ``prefix`` put before every partition key (``pk`` and ``index_pk``) value dynacoord writes
    or queries, so its items sit apart from yours (``prefix="DC#"``: ``DC#LOCK#default#job``).
    Answers are translated back. Redis and MongoDB keep their own key schema.
    """

    # Written out, not a frozen dataclass: the backend's import defines this class, and a
    # dataclass's methods are generated from source when it is defined, about a millisecond of
    # every cold start. Frozen all the same: ``dataclasses.FrozenInstanceError`` on assignment.
    __slots__ = _LAYOUT_FIELDS

    pk: str
    sk: str
    index: str
    index_pk: str
    index_sk: str
    ttl: str
    expires_at: str
    prefix: str

    def __init__(
        self,
        *,
        pk: str = "pk",
        sk: str = "sk",
        index: str = GSI_NAME,
        index_pk: str = "gsi1pk",
        index_sk: str = "gsi1sk",
        ttl: str = TTL_ATTRIBUTE,
        expires_at: str = "expires_at_ms",
        prefix: str = "",
    ) -> None:
        put = object.__setattr__
        put(self, "pk", pk)
        put(self, "sk", sk)
        put(self, "index", index)
        put(self, "index_pk", index_pk)
        put(self, "index_sk", index_sk)
        put(self, "ttl", ttl)
        put(self, "expires_at", expires_at)
        put(self, "prefix", prefix)
        self._check()

    def _values(self) -> tuple[str, ...]:
        return tuple(getattr(self, name) for name in _LAYOUT_FIELDS)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _LAYOUT_FIELDS)
        return f"TableLayout({fields})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_layout_of, (dict(zip(_LAYOUT_FIELDS, self._values(), strict=True)),))

    def replace(self, **changes: str) -> TableLayout:
        """This layout with the fields given by name changed (checked as a new one is)."""
        return TableLayout(**{**dict(zip(_LAYOUT_FIELDS, self._values(), strict=True)), **changes})

    def _check(self) -> None:
        names = self.attribute_names()
        for field, default in _DEFAULT_NAMES.items():
            value = names[default]
            _check_attribute_name(field, value)
            if value != default and (
                value in _DYNACOORD_ATTRIBUTES or value.startswith(("w:", "c:", "f:"))
            ):
                raise ConfigurationError(
                    f"TableLayout.{field}={value!r} is an attribute dynacoord's items use for "
                    "their own data; choose another name"
                )
        # A name of the default schema in another role (pk="sk") would be read back as that
        # other attribute.
        for field, default in _DEFAULT_NAMES.items():
            value = names[default]
            if value in _DEFAULT_NAMES.values() and value != default:
                raise ConfigurationError(
                    f"TableLayout.{field}={value!r} is the default name of another attribute; "
                    "choose another name"
                )
        seen: dict[str, str] = {}
        for field, default in _DEFAULT_NAMES.items():
            value = names[default]
            if value in seen:
                raise ConfigurationError(
                    f"TableLayout.{field}={value!r} is also TableLayout.{seen[value]}: every "
                    "attribute needs a name of its own"
                )
            seen[value] = field
        index = self.index
        if (
            not isinstance(index, str)
            or not 3 <= len(index) <= 255
            or not all(c.isascii() and (c.isalnum() or c in "_.-") for c in index)
        ):
            raise ConfigurationError(
                f"TableLayout.index must be a DynamoDB index name (3 to 255 characters of "
                f"a-z A-Z 0-9 _ . -), got {index!r}"
            )
        prefix = self.prefix
        if not isinstance(prefix, str) or len(prefix) > _MAX_PREFIX_CHARS:
            raise ConfigurationError(
                f"TableLayout.prefix must be a str of at most {_MAX_PREFIX_CHARS} characters, "
                f"got {prefix!r}"
            )
        bad = sorted({c for c in prefix if c in _PREFIX_FORBIDDEN or not c.isprintable()})
        if bad:
            raise ConfigurationError(
                f"TableLayout.prefix {prefix!r} holds {''.join(bad)!r}: a prefix may not hold "
                "IAM wildcards or variables (* ? $), quotes, backslashes or control characters"
            )

    @property
    def is_default(self) -> bool:
        """Whether this is dynacoord's own schema (no translation at all)."""
        return self == DEFAULT_LAYOUT

    def attribute_names(self) -> dict[str, str]:
        """dynacoord's name of each attribute -> this layout's name for it."""
        return {
            "pk": self.pk,
            "sk": self.sk,
            "gsi1pk": self.index_pk,
            "gsi1sk": self.index_sk,
            "ttl": self.ttl,
            "expires_at_ms": self.expires_at,
        }

    def to_json(self) -> str:
        """The layout as a JSON object of its fields that differ from the default (what
        ``DYNACOORD_TABLE_LAYOUT`` and ``--table-layout`` take); ``{}`` for the default."""
        changed = {
            name: value
            for name, value in zip(_LAYOUT_FIELDS, self._values(), strict=True)
            if value != getattr(DEFAULT_LAYOUT, name)
        }
        return json.dumps(changed, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> TableLayout:
        """A layout from a JSON object of its fields (``{"pk": "PK", "sk": "SK", "index":
        "GSI1", "index_pk": "GSI1PK", "index_sk": "GSI1SK", "prefix": "DC#"}``); empty text or
        ``{}`` is the default layout."""
        if text is None or not text.strip():
            return DEFAULT_LAYOUT
        try:
            fields = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"the table layout is not JSON: {exc}") from exc
        if not isinstance(fields, dict):
            raise ConfigurationError(f"the table layout must be a JSON object, got {text!r}")
        known = list(_LAYOUT_FIELDS)
        unknown = sorted(set(fields) - set(known))
        if unknown:
            raise ConfigurationError(
                f"unknown table layout field(s) {unknown}; the fields are {', '.join(known)}"
            )
        for name, value in fields.items():
            if not isinstance(value, str):
                raise ConfigurationError(
                    f"table layout field {name!r} must be a string, got {value!r}"
                )
        layout = cls(**fields)
        return DEFAULT_LAYOUT if layout == DEFAULT_LAYOUT else layout


def _layout_of(fields: dict[str, str]) -> TableLayout:
    """A pickled layout, made again."""
    return TableLayout(**fields)


#: TableLayout field -> dynacoord's (default) attribute name
_DEFAULT_NAMES = {
    "pk": "pk",
    "sk": "sk",
    "index_pk": "gsi1pk",
    "index_sk": "gsi1sk",
    "ttl": "ttl",
    "expires_at": "expires_at_ms",
}


def _check_attribute_name(field: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"TableLayout.{field} must be a non-empty str, got {value!r}")
    if len(value.encode("utf-8", "surrogatepass")) > 255:
        raise ConfigurationError(
            f"TableLayout.{field} must be at most 255 bytes (a DynamoDB key attribute name), "
            f"got {len(value.encode('utf-8', 'surrogatepass'))} bytes"
        )
    if not value.isprintable() or '"' in value or "\\" in value:
        # printable: a name is shown in messages; no quote or backslash: the stack's stream
        # filter is JSON written with the partition key's name
        raise ConfigurationError(
            f"TableLayout.{field}={value!r} holds a control character, a quote or a backslash"
        )


DEFAULT_LAYOUT = TableLayout()


def key_schema_problems(
    what: str,
    key_schema: Sequence[Mapping[str, Any]],
    hash_name: str,
    range_name: str,
    types: Mapping[str, str],
) -> list[str]:
    """The problems of one key schema (the table's or an index's): names, order and types."""
    problems: list[str] = []
    actual = [(k.get("AttributeName"), k.get("KeyType")) for k in key_schema]
    if actual != [(hash_name, "HASH"), (range_name, "RANGE")]:
        rendered = " + ".join(f"{name} ({kind})" for name, kind in actual) or "empty"
        problems.append(
            f"{what} key schema is {rendered}, expected {hash_name} (HASH) + {range_name} (RANGE)"
        )
    for name, _ in actual:
        if name in (hash_name, range_name) and types.get(str(name)) != "S":
            problems.append(
                f"{what} key attribute {name!r} has type {types.get(str(name))}, expected S"
            )
    return problems


def schema_problems(
    table: Mapping[str, Any], *, statuses: bool = True, layout: TableLayout = DEFAULT_LAYOUT
) -> list[str]:
    """The problems of a DescribeTable ``Table``: key schema and types, the index ``gsi1`` (key
    schema, projection ALL) and, with ``statuses``, the table's and the index's status; with a
    ``layout``, its names instead of dynacoord's."""
    problems: list[str] = []
    index_name = layout.index
    status = table.get("TableStatus")
    if statuses and status != "ACTIVE":
        problems.append(f"table status is {status}, expected ACTIVE")
    types = {
        str(a["AttributeName"]): str(a["AttributeType"])
        for a in table.get("AttributeDefinitions", [])
    }
    problems += key_schema_problems(
        "table", table.get("KeySchema", []), layout.pk, layout.sk, types
    )
    indexes = {g.get("IndexName"): g for g in table.get("GlobalSecondaryIndexes", [])}
    gsi = indexes.get(index_name)
    if gsi is None:
        problems.append(f"global secondary index {index_name!r} is missing")
    else:
        problems += key_schema_problems(
            f"index {index_name}",
            gsi.get("KeySchema", []),
            layout.index_pk,
            layout.index_sk,
            types,
        )
        projection = gsi.get("Projection", {}).get("ProjectionType")
        if projection != "ALL":
            problems.append(f"index {index_name} projection is {projection}, expected ALL")
        index_status = gsi.get("IndexStatus", "ACTIVE")
        if statuses and index_status != "ACTIVE":
            problems.append(f"index {index_name} status is {index_status}, expected ACTIVE")
    return problems


def ttl_problem(description: Mapping[str, Any], layout: TableLayout) -> str | None:
    """What is wrong with a ``DescribeTimeToLive`` answer's ``TimeToLiveDescription`` for
    ``layout`` (None: TTL is on the layout's ``ttl``). TTL on another attribute is the
    application's: the fix is the layout's ``ttl`` name, never turning that TTL off."""
    status = description.get("TimeToLiveStatus", "DISABLED")
    if status not in ("ENABLED", "ENABLING"):
        return (
            f"TTL is {status}, expected enabled on attribute {layout.ttl!r} (expired items "
            "are never garbage-collected; ensure_table or `dynacoord table create` enables it)"
        )
    other = str(description.get("AttributeName"))
    if other == layout.ttl:
        return None
    fixed = layout.replace(ttl=other)
    changed = json.loads(fixed.to_json())
    arguments = ", ".join(f"{name}={value!r}" for name, value in changed.items())
    return (
        f"TTL is enabled on attribute {other!r}, expected {layout.ttl!r} (dynacoord's items "
        f"are never garbage-collected): give dynacoord that attribute, TableLayout({arguments}) "
        f"from Python, --table-layout '{fixed.to_json()}' (or DYNACOORD_TABLE_LAYOUT) on the "
        f"command line, TtlAttribute={other} for the stack; keep your TTL on (turning it off "
        "would stop your own items expiring)"
    )
