"""Section 5: import time and first-operation latency (cold start).

Import time comes from ``python -X importtime`` in fresh subprocesses (median of several runs): the
cumulative microseconds of the top-level ``dynacoord`` import versus ``boto3`` alone, and the
cost of the first use of the DynamoDB backend (which is when dynacoord loads boto3).

First-operation latency is measured in a fresh subprocess too: import, client creation, the first
lock acquire (which pays botocore's lazy loading of the service model) and a second one, against
the same steps done with raw boto3 (``update_item`` of the same shape).

dynacoord runs three times: with its first-use table check as it comes (one DescribeTable sent
by the first write, just before it, outside a Lambda environment initialised ahead of its
requests; see ``backends/dynamodb/_verify.py``), with the check sent early (``verify="early"``:
when the backend is made, on a thread of its own, and waited for by the first write), and with
``verify=False``: the check's cost is read off the difference, and what sending it early saves
(or costs) off the first two.

The section runs on a table of its own, created empty when it starts and kept empty (the items
each process wrote are deleted after it): DynamoDB Local's DescribeTable slows as a table fills
(3.4 ms empty, 12.9 ms at 10,000 items, 30.2 ms at 30,000), so on the bench's shared table, after
the sections that fill it, the server's slowness would be counted as the check's, and a
regression of the check could hide behind a table that happened to be small.

All sides run as a deployed Lambda would: dynacoord from a compiled, non-editable copy (``.pyc``
present, as in a wheel install; an editable install under ``PYTHONDONTWRITEBYTECODE`` would
compile dynacoord from source on every start), and the time spent in the garbage collector is
reported apart (``gc.callbacks``).

The garbage collector makes one pair of bare processes a knife edge: CPython runs a full
collection (15-30 ms here) after a fixed number of allocations, and a bare raw-boto3 script may
end its window a few hundred allocations short of one that any other import would tip over. A
real handler's own imports and globals put it anywhere in that cycle. So the headline number is
measured over the cycle: before its clock starts, each pair of processes allocates the same K
long-lived objects, K spread evenly over one full-collection period; each side's cold start is
the mean over K of its median at that K. The bare pair (K = 0) is reported beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

from ._harness import BenchEnv, unique

__all__ = ["parse_importtime", "run"]

IMPORT_CASES = {
    "import dynacoord": ("import dynacoord", "dynacoord"),
    "import boto3": ("import boto3", "boto3"),
    "import dynacoord + DynamoDBBackend (loads boto3)": (
        "import dynacoord; dynacoord.DynamoDBBackend",
        "dynacoord",
    ),
}


def parse_importtime(stderr: str, package: str) -> tuple[float, list[str]]:
    """Cumulative import time (ms) of the top-level entries of ``package`` and its submodules.

    ``-X importtime`` prints ``import time: self | cumulative | name`` with the name indented by
    nesting depth; a module imported lazily later (``dynacoord.backends.dynamodb`` on first use)
    is its own top-level entry, so all top-level entries of the package are added up. Also returns
    the names of the heaviest nested modules (for the report).
    """
    total_us = 0
    nested: list[tuple[int, str]] = []
    children: list[tuple[int, str]] = []  # direct children seen since the last top-level entry
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        cumulative = int(parts[1].strip())
        raw_name = parts[2].rstrip()
        name = raw_name.strip()
        depth = len(raw_name) - len(raw_name.lstrip())
        if depth > 1:  # importtime prints children before their parent
            if depth <= 3:
                children.append((cumulative, name))
            continue
        if name == package or name.startswith(package + "."):
            total_us += cumulative
            nested.extend(children)
        children = []
    nested.sort(reverse=True)
    return total_us / 1000, [name for _, name in nested[:3]]


def _import_times(runs: int) -> list[dict[str, Any]]:
    rows = []
    env = dict(os.environ)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    for label, (code, package) in IMPORT_CASES.items():
        values: list[float] = []
        heaviest: list[str] = []
        for _ in range(runs):
            done = subprocess.run(
                [sys.executable, "-X", "importtime", "-c", code],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
                check=True,
            )
            ms, heaviest = parse_importtime(done.stderr, package)
            values.append(ms)
        rows.append(
            {
                "case": label,
                "code": code,
                "runs": runs,
                "median_ms": round(statistics.median(values), 2),
                "min_ms": round(min(values), 2),
                "heaviest_children": heaviest,
            }
        )
    return rows


_CHILD = r"""
import gc, json, sys, time
_gc = {"ms": 0.0, "full": 0}
_gc_start = [0.0]
def _on_gc(phase, info):
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        _gc["ms"] += (time.perf_counter() - _gc_start[0]) * 1000
        _gc["full"] += info.get("generation") == 2
gc.callbacks.append(_on_gc)
def _to_full(count, threshold):
    # CPython's generational trigger: each time gen0's count passes its threshold, gen2 is
    # collected if its count is over threshold, else gen1 if its count is, else gen0 (the
    # long-lived ratio that can postpone a full collection is left out)
    c0, c1, c2 = count
    th0, th1, th2 = threshold
    allocations = th0 - c0 + 1  # until the next trigger
    while c2 <= th2:
        if c1 > th1:
            c1, c2 = 0, c2 + 1
        else:
            c1 += 1
        allocations += th0 + 1
    return allocations
mode, endpoint, table, ns, pad = sys.argv[1:6]
# what a handler's own imports and globals would have allocated (see the module docstring)
_handler_objects = [{} for _ in range(int(pad))]
t0 = time.perf_counter()
creds = dict(aws_access_key_id="dynacoord", aws_secret_access_key="dynacoord", region_name="us-east-1")
if mode != "raw":
    import boto3
    import dynacoord
    from dynacoord import DynamoDBBackend
    assert "/dynacoord-compiled/" in dynacoord.__file__, dynacoord.__file__
else:
    import boto3
t1 = time.perf_counter()
client = boto3.client("dynamodb", endpoint_url=endpoint, **creds)
if mode != "raw":
    verify = {"dynacoord": True, "early": "early", "noverify": False}[mode]
    locks = DynamoDBBackend(client, table_name=table, namespace=ns, verify=verify).locks
    def op(key):
        assert locks.acquire(key, ttl=60) is not None
else:
    def op(key):
        now = int(time.time() * 1000)
        exp = now + 60000
        client.update_item(
            TableName=table,
            Key={"pk": {"S": "LOCK#" + ns + "#" + key}, "sk": {"S": "LOCK"}},
            ConditionExpression="attribute_not_exists(pk) OR expires_at_ms <= :now",
            UpdateExpression="SET #owner = :owner, expires_at_ms = :exp, #ttl = :ttl, "
            "fence = if_not_exists(fence, :base) + :one",
            ExpressionAttributeNames={"#owner": "owner", "#ttl": "ttl"},
            ExpressionAttributeValues={
                ":now": {"N": str(now)}, ":owner": {"S": "raw"}, ":exp": {"N": str(exp)},
                ":ttl": {"N": str(exp // 1000 + 3601)}, ":base": {"N": str(now * 1000)},
                ":one": {"N": "1"},
            },
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
t2 = time.perf_counter()
op("first")
t3 = time.perf_counter()
_count = gc.get_count()
op("second")
t4 = time.perf_counter()
print(json.dumps({"import_ms": (t1 - t0) * 1000, "client_ms": (t2 - t1) * 1000,
                  "first_op_ms": (t3 - t2) * 1000, "second_op_ms": (t4 - t3) * 1000,
                  "to_first_result_ms": (t3 - t0) * 1000, "gc_ms": _gc["ms"],
                  "gc_full_collections": _gc["full"],
                  "allocations_to_full_gc": _to_full(_count, gc.get_threshold())}))
"""


def _compiled_copy() -> str:
    """A compiled, non-editable copy of the dynacoord package (what a wheel install gives)."""
    import compileall
    import shutil
    import tempfile

    import dynacoord

    root = os.path.join(tempfile.mkdtemp(prefix="bench-"), "dynacoord-compiled")
    shutil.copytree(
        os.path.dirname(dynacoord.__file__),
        os.path.join(root, "dynacoord"),
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    compileall.compile_dir(root, quiet=1)
    return root


_FIELDS = (
    "import_ms",
    "client_ms",
    "first_op_ms",
    "second_op_ms",
    "to_first_result_ms",
    "gc_ms",
    "gc_full_collections",
    "allocations_to_full_gc",
)


def gc_period() -> int:
    """Allocations from one full collection to the next under this process's thresholds: every
    ``threshold0 + 1`` allocations collect gen0, every ``threshold1 + 1`` of those gen1, every
    ``threshold2 + 1`` of those everything."""
    import gc

    t0, t1, t2 = gc.get_threshold()
    return (t0 + 1) * (t1 + 1) * (t2 + 1)


#: each side: (its name in the report, the child's mode)
SIDES = (
    ("dynacoord", "dynacoord"),
    ("dynacoord, verify=False", "noverify"),
    ("raw boto3", "raw"),
    ('dynacoord, verify="early"', "early"),
)
WITH_CHECK, WITHOUT_CHECK, RAW, CHECK_SENT_EARLY = (name for name, _ in SIDES)


class _Children:
    """Runs the child script in fresh processes, dynacoord from a compiled copy, on ``table``
    (kept empty: each child's two lock items are deleted after it)."""

    def __init__(self, env: BenchEnv, table: str) -> None:
        self.env = env
        self.table = table
        self.cleaner = env.new_client(counted=False)
        self.child_env = dict(os.environ)
        self.child_env.pop("PYTHONDONTWRITEBYTECODE", None)
        self.child_env["PYTHONPATH"] = _compiled_copy()  # ahead of the editable install's finder

    def pair(self, pad: int, dynacoord_first: bool) -> dict[str, dict[str, float]]:
        """One run of each side at the same padding; the order alternates between calls so that
        a warmer page cache does not favour one side."""
        order = list(SIDES) if dynacoord_first else list(reversed(SIDES))
        out = {}
        for name, mode in order:
            ns = unique("cold")
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    _CHILD,
                    mode,
                    self.env.ddb.endpoint_url,
                    self.table,
                    ns,
                    str(pad),
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
                env=self.child_env,
                cwd=self.child_env["PYTHONPATH"],  # `-c` puts the cwd first on sys.path
            )
            out[name] = json.loads(done.stdout.strip().splitlines()[-1])
            for key in ("first", "second"):
                self.cleaner.delete_item(
                    TableName=self.table,
                    Key={"pk": {"S": f"LOCK#{ns}#{key}"}, "sk": {"S": "LOCK"}},
                )
        return out

    def items(self) -> int:
        """Items in the table (0 while the cleaning works)."""
        return int(self.cleaner.scan(TableName=self.table, Select="COUNT")["Count"])


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    return {field: statistics.median(s[field] for s in samples) for field in _FIELDS}


def _first_op(children: _Children, runs: int) -> list[dict[str, Any]]:
    """The bare pair (no padding), median of ``runs`` pairs."""
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in SIDES}
    for i in range(runs):
        for mode, sample in children.pair(0, dynacoord_first=i % 2 == 0).items():
            results[mode].append(sample)
    rows = []
    for mode, samples in results.items():
        row: dict[str, Any] = {"mode": mode, "runs": len(samples)}
        row.update({k: round(v, 2) for k, v in _medians(samples).items()})
        rows.append(row)
    return rows


def _over_gc_phase(children: _Children, phases: int, runs: int) -> dict[str, Any]:
    """Each side's cold start as a mean over the GC cycle (see the module docstring)."""
    period = gc_period()
    pads = [j * period // phases for j in range(phases)]
    per_pad: dict[str, list[dict[str, float]]] = {name: [] for name, _ in SIDES}
    for j, pad in enumerate(pads):
        samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in SIDES}
        for i in range(runs):
            for mode, sample in children.pair(pad, dynacoord_first=(i + j) % 2 == 0).items():
                samples[mode].append(sample)
        for mode in per_pad:
            per_pad[mode].append(_medians(samples[mode]))
    sides = {
        mode: {field: statistics.fmean(m[field] for m in medians) for field in _FIELDS}
        for mode, medians in per_pad.items()
    }
    dc, bare, raw = sides[WITH_CHECK], sides[WITHOUT_CHECK], sides[RAW]
    early = sides[CHECK_SENT_EARLY]
    return {
        "period_allocations": period,
        "paddings": pads,
        "runs_per_padding": runs,
        "sides": [
            {"mode": mode, **{k: round(v, 2) for k, v in row.items()}}
            for mode, row in sides.items()
        ],
        "ratio": round(dc["to_first_result_ms"] / raw["to_first_result_ms"], 3),
        "ratio_without_gc": round(
            (dc["to_first_result_ms"] - dc["gc_ms"]) / (raw["to_first_result_ms"] - raw["gc_ms"]),
            3,
        ),
        "ratio_without_check": round(bare["to_first_result_ms"] / raw["to_first_result_ms"], 3),
        "ratio_without_check_without_gc": round(
            (bare["to_first_result_ms"] - bare["gc_ms"])
            / (raw["to_first_result_ms"] - raw["gc_ms"]),
            3,
        ),
        "ratio_check_sent_early": round(early["to_first_result_ms"] / raw["to_first_result_ms"], 3),
        "check_ms": round(dc["first_op_ms"] - bare["first_op_ms"], 2),
        "check_sent_early_ms": round(early["first_op_ms"] - bare["first_op_ms"], 2),
        "per_padding_ratio": [
            round(d["to_first_result_ms"] / r["to_first_result_ms"], 3)
            for d, r in zip(per_pad[WITH_CHECK], per_pad[RAW], strict=True)
        ],
        "per_padding_ratio_without_check": [
            round(d["to_first_result_ms"] / r["to_first_result_ms"], 3)
            for d, r in zip(per_pad[WITHOUT_CHECK], per_pad[RAW], strict=True)
        ],
    }


def run(env: BenchEnv) -> dict[str, Any]:
    from dynacoord.provision import create_table

    imports = _import_times(env.scale.import_runs)
    setup = env.new_client(counted=False)
    table = unique("cold")
    create_table(setup, table)  # empty, and kept empty (see the module docstring)
    try:
        children = _Children(env, table)
        children.pair(0, dynacoord_first=True)  # warm-up: the server's first requests are slow
        first = _first_op(children, env.scale.first_op_runs)
        phase = _over_gc_phase(children, env.scale.gc_phases, env.scale.gc_phase_runs)
        items_left = children.items()
    finally:
        setup.delete_table(TableName=table)
    by_case = {r["case"]: r["median_ms"] for r in imports}
    by_mode = {r["mode"]: r for r in first}
    boto3_ms = by_case.get("import boto3") or float("nan")

    def bare_ratio(side: str, *, gc: bool) -> float:
        a, b = by_mode[side], by_mode[RAW]
        if gc:
            return round(a["to_first_result_ms"] / b["to_first_result_ms"], 3)
        return round(
            (a["to_first_result_ms"] - a["gc_ms"]) / (b["to_first_result_ms"] - b["gc_ms"]), 3
        )

    return {
        "status": "ok",
        "table": {
            "fresh": True,
            "items_when_done": items_left,
            "note": "a table of the section's own, created empty and kept empty",
        },
        "imports": imports,
        "first_operation": first,
        "import_ratio_dynacoord_vs_boto3": round(by_case["import dynacoord"] / boto3_ms, 3),
        "import_ratio_with_backend_vs_boto3": round(
            by_case["import dynacoord + DynamoDBBackend (loads boto3)"] / boto3_ms, 3
        ),
        # the headline: over the GC cycle, as a handler with imports of its own would see it
        "first_result_ratio": phase["ratio"],
        "first_result_ratio_without_gc": phase["ratio_without_gc"],
        # the same without the first-use table check (verify=False)
        "first_result_ratio_without_check": phase["ratio_without_check"],
        "first_result_ratio_without_check_without_gc": phase["ratio_without_check_without_gc"],
        # the same with the check sent early (verify="early")
        "first_result_ratio_check_sent_early": phase["ratio_check_sent_early"],
        # the check's cost: dynacoord's first operation with it minus without it (sent by the
        # first write: all of it; sent early: what is left of it when the first write is ready)
        "check_ms": phase["check_ms"],
        "check_sent_early_ms": phase["check_sent_early_ms"],
        "over_gc_phase": phase,
        # the bare pair, on whatever edge of the cycle a bare script happens to stand
        "bare_first_result_ratio": bare_ratio(WITH_CHECK, gc=True),
        "bare_first_result_ratio_without_gc": bare_ratio(WITH_CHECK, gc=False),
        "bare_first_result_ratio_without_check": bare_ratio(WITHOUT_CHECK, gc=True),
    }
