"""Render the results of one run as ``REPORT.md`` (and write ``results.json``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["SECTION_TITLES", "render", "summary", "write"]

SECTION_TITLES = {
    "requests": "1. Requests per operation",
    "overhead": "2. Overhead over the raw boto3 floor",
    "outbox": "3. Outbox throughput",
    "contention": "4. Lock contention",
    "coldstart": "5. Import time and cold start",
    "peers": "6. Peers in the same run",
    "exactness": "7. The cost of exact counting (lost responses)",
    "metrics": "8. What metrics cost",
    "writecost": "9. What a write costs at a sustained rate (WCU/RCU by AWS's rules)",
    "costs": "10. What each operation costs on DynamoDB, and the ceiling of one key",
    "admission": "11. Admission and leadership beside the peers (requests and units per call)",
}


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for row in rows:
        out.append("| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |")
    return out


def _paired(r: dict[str, Any]) -> str:
    """The paired ratio with its 95 % bootstrap interval."""
    lo, hi = r.get("ratio_paired_ci95") or (None, None)
    text = f"{r['ratio_paired']:.3f}"
    return text if lo is None else f"{text} ({lo:.3f}-{hi:.3f})"


def _not_measured(section: dict[str, Any] | None) -> list[str]:
    if section is None:
        return ["**Not measured in this run** (section not selected)."]
    status = section.get("status", "error")
    return [f"**Not measured in this run** ({status}): `{section.get('error', 'no reason given')}`"]


def _missing(section: dict[str, Any]) -> list[str]:
    missing = section.get("missing") or {}
    if not missing:
        return []
    lines = ["", "Primitives not measured (not in this checkout, or their setup failed):", ""]
    lines += [f"* {name}: `{reason}`" for name, reason in sorted(missing.items())]
    return lines


# -- sections ---------------------------------------------------------------------------------------


def _requests(s: dict[str, Any]) -> list[str]:
    lines = [
        "Counted on the wire with a botocore `before-send` hook (so a retried request counts "
        "twice). *min* is the fewest requests the operation can take with its semantics; "
        "**above** flags an operation that takes more.",
        "",
    ]
    rows = []
    for r in s.get("rows", []):
        if "error" in r:
            rows.append(
                [r["primitive"], r["operation"], "error", _fmt(r.get("minimum")), "", r["error"]]
            )
            continue
        apis = ", ".join(f"{k} x{v}" if v != 1 else k for k, v in r["apis"].items())
        count = f"{r['requests']}" + (" (varies)" if r.get("varies") else "")
        flag = "**above**" if r["above_minimum"] else "ok"
        rows.append(
            [
                r["primitive"],
                r["operation"],
                count,
                r["minimum"],
                flag,
                f"{apis}; {r['why']}" if r["why"] else apis,
            ]
        )
    lines += _table(
        ["primitive", "operation", "requests", "min", "", "requests sent; why the minimum"], rows
    )
    flagged = s.get("flagged") or []
    lines += ["", f"Operations above their minimum: {', '.join(flagged) if flagged else 'none'}."]
    lines += _missing(s)
    lines += ["", "### The same operations on the Redis backend", ""]
    if s.get("redis_error"):
        return [*lines, f"Not measured: `{s['redis_error']}`"]
    ddb = {(r["primitive"], r["operation"]): r for r in s.get("rows", [])}
    cluster = {(r["primitive"], r["operation"]): r for r in s.get("redis_cluster_rows", [])}

    def trips(r: dict[str, Any]) -> str:
        if "requests" not in r:
            return f"`{r.get('error', '?')}`" if r else "-"
        return f"{r['requests']}" + (" (varies)" if r.get("varies") else "")

    redis_rows = []
    for r in s.get("redis_rows", []):
        d = ddb.get((r["primitive"], r["operation"]), {})
        c = cluster.get((r["primitive"], r["operation"]), {})
        redis_rows.append(
            [r["primitive"], r["operation"], d.get("requests", "-"), trips(r), trips(c)]
        )
    lines += [
        "Round trips to `redis-server` counted in redis-py's connection (a pipeline or a Lua "
        "script call is one), after a first pass that loaded the scripts. The cluster column "
        "runs the same operations on a 3-primary Redis Cluster (docs/redis.md): a round trip is "
        "one send to one node (redis-py pipelines a cluster batch per node)"
        + (f"; not measured: `{s['redis_cluster_error']}`" if s.get("redis_cluster_error") else "")
        + ".",
        "",
    ]
    lines += _table(
        [
            "primitive",
            "operation",
            "DynamoDB requests",
            "Redis round trips",
            "Redis Cluster round trips",
        ],
        redis_rows,
    )
    return lines


def _above_text(r: dict[str, Any], target: float) -> str:
    """One operation over the target: its ratio, by how much, the extra time, the paired view."""
    lo, hi = r.get("ratio_paired_ci95") or (None, None)
    interval = "" if lo is None else f", 95 % interval {lo:.3f}-{hi:.3f}"
    return (
        f"{r['primitive']} {r['operation']}: ratio {r['ratio_median']:.3f}, "
        f"{(r['ratio_median'] - target) * 100:.1f} points over the {target:.2f} target "
        f"(+{r['extra_ms_median'] * 1000:.0f} µs per call; paired ratio "
        f"{r['ratio_paired']:.3f}{interval})"
    )


def _above(s: dict[str, Any]) -> list[dict[str, Any]]:
    """The operations above the target, judged on the ratio of medians (worst first)."""
    good = [r for r in s.get("rows", []) if "ratio_median" in r]
    return sorted(
        (r for r in good if r["ratio_median"] > s.get("target", 1.10)),
        key=lambda r: -r["ratio_median"],
    )


def _coverage(s: dict[str, Any], requests: dict[str, Any] | None) -> list[str]:
    """Which single-request operations of section 1 have no pair here, and why."""
    lines = ["", f"**Coverage.** {s.get('exclusion_rule', '')}"]
    if requests is None or requests.get("status") != "ok":
        return [*lines, "Section 1 was not measured in this run, so coverage is not checked."]
    single = [
        (r["primitive"], r["operation"])
        for r in requests.get("rows", [])
        if r.get("requests") == 1 and not r.get("varies")
    ]
    paired = {(r["primitive"], r["operation"]) for r in s.get("rows", []) if "ratio_median" in r}
    excluded = s.get("excluded") or {}
    unpaired = [op for op in single if op not in paired]
    lines[-1] += (
        f" Section 1 counts {len(single)} operations at one request; "
        f"{len(single) - len(unpaired)} of them are paired above."
    )
    if unpaired:
        lines += ["", "Single-request operations without a pair in this run:", ""]
        lines += [
            f"* {p} {o}: {excluded.get(f'{p} {o}', 'no pair (its setup or measurement failed)')}"
            for p, o in unpaired
        ]
    else:
        lines[-1] += " None is left out."
    return lines


def _overhead(s: dict[str, Any], requests: dict[str, Any] | None = None) -> list[str]:
    target = f"{s.get('target', 1.10):.2f}"
    lines = [
        f"Each single-request operation against the same request made directly with the same "
        f"boto3 client: for locks the raw parameters are written out by hand (same API, "
        f"expressions and return options); for the other primitives the request dynacoord sent "
        f"was captured (botocore `before-parameter-build`) and is replayed with its key swapped "
        f"for the raw side's own key (and a claim token for its own claim's), the parameters "
        f"built before the clock starts (so that floor is the bare client call); where the key "
        f"is a hash of the arguments (`@cached`) each raw request is captured from dynacoord "
        f"for the raw side's own key. The outbox's `Event` objects, like the raw side's "
        f"requests, are made before the clock starts. "
        f"{s.get('samples')} samples per side after {s.get('warmup')} warm-up (fewer where the "
        f"*n* column says so), interleaved A/B (order alternating every sample). Both sides pay "
        f"the same request-counting hook. A heavy request (a raw warm-up median of 5 ms or more) "
        f"is sent after an idle gap (*settle ms*, half that median) so that it meets a server "
        f"done with the one before (DynamoDB Local shares the machine's cores); lighter ones are "
        f"timed back to back.",
        "",
        f"**Overhead is *ratio (median)* = median dynacoord latency / median raw latency; "
        f"it is the number judged against the target ≤ {target} (bold: "
        f"above).** *paired* = median of the per-sample ratios of back-to-back pairs, with its "
        f"95 % bootstrap interval: informational (the pairs share the machine's busy moments, so "
        f"it is steadier), it judges nothing.",
        "",
    ]
    rows = []
    for r in s.get("rows", []):
        if "error" in r:
            rows.append([r["primitive"], r["operation"], "error", *[""] * 8, r["error"]])
            continue
        d, w = r["dynacoord"], r["raw"]
        median = f"{r['ratio_median']:.3f}"
        rows.append(
            [
                r["primitive"],
                r["operation"],
                r["raw_api"],
                d["n"],
                d["median_ms"],
                w["median_ms"],
                d["p95_ms"],
                w["p95_ms"],
                median if r["within_target"] else f"**{median}**",
                _paired(r),
                f"{r['ratio_p95']:.3f}",
                r.get("settle_ms") or "",
            ]
        )
    lines += _table(
        [
            "primitive",
            "operation",
            "raw call",
            "n",
            "median ms",
            "raw median ms",
            "p95 ms",
            "raw p95 ms",
            "ratio (median)",
            "paired (95 % CI)",
            "ratio (p95)",
            "settle ms",
        ],
        rows,
    )
    above = _above(s)
    good = [r for r in s.get("rows", []) if "ratio_median" in r]
    lines += [
        "",
        f"**Within the {target} target (ratio of medians): {len(good) - len(above)} of "
        f"{len(good)}.** Above it:" + (" none." if not above else ""),
    ]
    if above:
        lines += ["", *(f"* {_above_text(r, s.get('target', 1.10))}" for r in above)]
    lines += _coverage(s, requests)
    lines += _missing(s)
    lines += [
        "",
        "### The Redis backend vs raw redis-py (informational)",
        "",
        "The same method: the one command dynacoord's Redis backend sends (captured at "
        "`execute_command`; scripts are EVALSHA) replayed with redis-py on the same client, key "
        "swapped, interleaved A/B. A loopback Redis round trip takes a fraction of a millisecond, so dynacoord's "
        "fixed Python cost per call (validation, codec, the script wrapper) shows as a large "
        "ratio; the absolute extra microseconds are the useful number. The target is for "
        "DynamoDB.",
        "",
    ]
    redis_rows = []
    for r in s.get("redis_rows", []):
        if "error" in r:
            redis_rows.append(
                [r["primitive"], r["operation"], f"`{r['error']}`", "", "", "", "", ""]
            )
            continue
        d, w = r["dynacoord"], r["raw"]
        redis_rows.append(
            [
                r["primitive"],
                r["operation"],
                r["raw_api"],
                f"{d['median_ms']:.3f}",
                f"{w['median_ms']:.3f}",
                f"{r['extra_ms_median'] * 1000:.0f}",
                f"{r['ratio_median']:.3f}",
                _paired(r),
            ]
        )
    if redis_rows:
        lines += _table(
            [
                "primitive",
                "operation",
                "raw command",
                "median ms",
                "raw median ms",
                "extra µs",
                "ratio (median)",
                "paired",
            ],
            redis_rows,
        )
    for name, reason in sorted((s.get("redis_missing") or {}).items()):
        lines += ["", f"Not measured ({name}): `{reason}`"]
    return lines


def _outbox(s: dict[str, Any]) -> list[str]:
    lines = [
        f"{s.get('events')} events per configuration, no-op handler. Publishing them, "
        f"{s.get('batch_per_publish')} events per `outbox.publish` call (one TransactWriteItems): "
        f"{_fmt(s.get('publish_events_per_s'))} events/s, "
        f"{_fmt(s.get('publish_requests_per_event'), 3)} requests per event.",
        "",
    ]
    rows = []
    for r in s.get("rows", []):
        if "error" in r:
            rows.append(
                [r["workers"], r.get("design"), "error", "", "", "", "", "", "", r["error"]]
            )
            continue
        rows.append(
            [
                r["workers"],
                r.get("design", "batched"),
                r["delivered"],
                r["seconds"],
                r["events_per_s"],
                r["requests_per_event"],
                _fmt(r.get("write_units_per_event")),
                f"{r['lost']} / {r['duplicates']}",
                r.get("lease_lost_reports"),
                _fmt(r.get("claim_refusals_per_event"), 3),
            ]
        )
    lines += _table(
        [
            "workers",
            "design",
            "delivered",
            "seconds",
            "events/s",
            "requests per delivered event",
            "table write units per event",
            "lost / duplicates (must be 0)",
            "lease lost",
            "refused items per event",
        ],
        rows,
    )
    lines += _outbox_ratios(s.get("rows", []), "requests")
    if s.get("note"):
        lines += ["", s["note"]]
    r = s.get("redis")
    if r:
        lines += ["", "### The same delivery on the Redis backend (informational)", ""]
        if r.get("status") != "ok":
            return [*lines, f"Not measured: `{r.get('error')}`"]
        lines += [
            f"Worker threads only; publishing: {_fmt(r.get('publish_events_per_s'))} events/s, "
            f"{_fmt(r.get('publish_round_trips_per_event'), 3)} round trips per event.",
            "",
        ]
        lines += _table(
            [
                "workers",
                "design",
                "delivered",
                "seconds",
                "events/s",
                "round trips per delivered event",
                "lost (must be 0)",
                "duplicates (must be 0)",
                "lease lost",
            ],
            [
                [
                    x["workers"],
                    x.get("design", "batched"),
                    x["delivered"],
                    x["seconds"],
                    x["events_per_s"],
                    x["requests_per_event"],
                    x["lost"],
                    x["duplicates"],
                    x.get("lease_lost_reports"),
                ]
                for x in r.get("rows", [])
                if "delivered" in x
            ],
        )
        lines += _outbox_ratios(r.get("rows", []), "round trips")
    return lines


def _contention(s: dict[str, Any]) -> list[str]:
    lines = [
        f"{s['threads']} threads, one key, {s['seconds']} s; each loop: blocking `acquire` "
        f"(ttl {s['ttl_s']} s, backoff with jitter), {s['critical_section_ms']:.0f} ms critical "
        "section, `release`. Exclusion is checked in-process by each holder; fences must rise "
        "in the order the critical sections were entered. The Redis column runs the same loop "
        "on the Redis backend (informational).",
        "",
    ]
    r = s.get("redis") or {}
    redis_ok = r.get("status") == "ok"

    def both(key: str, fmt: Any = None) -> list[Any]:
        conv = fmt or (lambda v: v)
        return [conv(s[key]), conv(r[key]) if redis_ok else "-"]

    def per_thread(v: list[int]) -> str:
        return ", ".join(str(x) for x in v)

    lines += _table(
        ["metric", "DynamoDB Local", "Redis"],
        [
            ["successful acquisitions", *both("acquisitions")],
            ["acquisitions per second", *both("acquisitions_per_s")],
            ["per thread", *both("per_thread", per_thread)],
            ["fairness (min / max per thread)", *both("fairness_min_max")],
            ["mutual-exclusion violations (must be 0)", *both("mutual_exclusion_violations")],
            ["fence-order violations (must be 0)", *both("fence_order_violations")],
            ["releases that found the lock lost", *both("lost_releases")],
            ["acquire calls that timed out (1 s)", *both("acquire_timeouts")],
            [
                "requests (round trips) per successful acquisition",
                s["requests_per_acquisition"],
                r.get("round_trips_per_acquisition", "-"),
            ],
            ["errors", *both("error_count")],
        ],
    )
    if s.get("errors"):
        lines += ["", "First errors: " + "; ".join(f"`{e}`" for e in s["errors"])]
    rows = [x for x in s.get("rows", []) if "error" not in x]
    if rows:
        lines += [
            "",
            "Side by side in the same run (one key, DynamoDB Local; the previous design is "
            "dynacoord without the FIFO hand-off between threads of a process):",
            "",
        ]
        lines += _table(
            [
                "lock",
                "threads",
                "acquisitions/s",
                "fairness",
                "p50 wait ms",
                "p95 wait ms",
                "requests/acquisition",
                "timeouts (1 s)",
                "violations",
            ],
            [
                [
                    x["name"],
                    x["threads"],
                    x["acquisitions_per_s"],
                    x["fairness_min_max"],
                    x["p50_wait_ms"],
                    x["p95_wait_ms"],
                    x["requests_per_acquisition"],
                    x["acquire_timeouts"],
                    x["violations"],
                ]
                for x in rows
            ],
        )
    for x in s.get("rows", []):
        if "error" in x:
            lines += ["", f"{x['name']} not measured: `{x['error']}`"]
    h = s.get("handoff")
    if h:
        lines += [
            "",
            f"Hand-off across processes ({h['rounds']} rounds): a holder in another process "
            f"takes the lock for {h['ttl_s']:.0f} s and releases it after {h['hold_s']} s; its "
            f"waiter has it {h['p50_wait_after_release_s']} s after the release at the median, "
            f"{h['p95_wait_after_release_s']} s at p95 (at most "
            f"{h['max_wait_after_release_s']} s). Requests per round, holder and waiter: "
            + ", ".join(f"{k} {v}" for k, v in h["requests_per_round"].items())
            + " (the waiter looks with consistent reads, not refused writes).",
        ]
    if r and not redis_ok:
        lines += ["", f"Redis not measured: `{r.get('error')}`"]
    elif r.get("errors"):
        lines += ["", "First Redis errors: " + "; ".join(f"`{e}`" for e in r["errors"])]
    return lines


def _coldstart(s: dict[str, Any]) -> list[str]:
    lines = [
        "`python -X importtime` in fresh subprocesses, median of the runs (cumulative time of the top-level package entries):",
        "",
    ]
    lines += _table(
        ["case", "runs", "median ms", "min ms", "heaviest children"],
        [
            [r["case"], r["runs"], r["median_ms"], r["min_ms"], ", ".join(r["heaviest_children"])]
            for r in s["imports"]
        ],
    )
    lines += [
        "",
        f"`import dynacoord` / `import boto3`: **{_fmt(s['import_ratio_dynacoord_vs_boto3'], 3)}**; "
        f"with the DynamoDB backend loaded (which imports boto3): "
        f"**{_fmt(s['import_ratio_with_backend_vs_boto3'], 3)}**.",
        "",
        "First operation in a fresh process (a lock acquire vs a raw `update_item` of the same shape), "
        "bare processes (nothing allocated before the clock starts), median of the runs; "
        "dynacoord from a compiled non-editable copy (`.pyc` present, as a wheel install gives); "
        "time in the garbage collector shown apart:",
        "",
    ]
    lines += _table(
        [
            "",
            "runs",
            "imports ms",
            "client ms",
            "first op ms",
            "second op ms",
            "start to first result ms",
            "of it in GC ms",
            "full GCs",
            "allocations left before a full GC",
        ],
        [
            [
                r["mode"],
                r["runs"],
                r["import_ms"],
                r["client_ms"],
                r["first_op_ms"],
                r["second_op_ms"],
                r["to_first_result_ms"],
                r.get("gc_ms", "-"),
                r.get("gc_full_collections", "-"),
                r.get("allocations_to_full_gc", "-"),
            ]
            for r in s["first_operation"]
        ],
    )
    lines += [
        "",
        "Bare pair, start to first result, dynacoord / raw boto3: "
        f"**{_fmt(s.get('bare_first_result_ratio'), 3)}**; without the time in the garbage "
        f"collector: **{_fmt(s.get('bare_first_result_ratio_without_gc'), 3)}**.",
        "",
        "*Allocations left before a full GC*: how many more container objects the process "
        "could create after its first result before CPython's generational trigger runs a full "
        "collection (from `gc.get_count()`). A side whose window ends a few hundred allocations "
        "short of one is on a knife edge: any import or request that allocates a little more "
        "pays the whole collection inside the window.",
    ]
    phase = s.get("over_gc_phase")
    if phase:
        lines += [
            "",
            "Over the garbage collector's cycle (the headline): a handler's own imports and "
            "globals put a real process anywhere in CPython's full-collection cycle "
            f"({phase['period_allocations']} allocations here), so before its clock starts each "
            "pair of processes allocates the same K long-lived objects, K at "
            f"{len(phase['paddings'])} points spread evenly over one cycle, "
            f"{phase['runs_per_padding']} pairs at each; each side's figure is the mean over K "
            "of its median at that K:",
            "",
        ]
        lines += _table(
            [
                "",
                "imports ms",
                "client ms",
                "first op ms",
                "start to first result ms",
                "of it in GC ms",
                "full GCs",
            ],
            [
                [
                    r["mode"],
                    r["import_ms"],
                    r["client_ms"],
                    r["first_op_ms"],
                    r["to_first_result_ms"],
                    r["gc_ms"],
                    r["gc_full_collections"],
                ]
                for r in phase["sides"]
            ],
        )
        lines += [
            "",
            f"Start to first result over the cycle, dynacoord / raw boto3: "
            f"**{_fmt(phase['ratio'], 3)}**; without the time in the garbage collector: "
            f"**{_fmt(phase['ratio_without_gc'], 3)}**. At each K: "
            + ", ".join(_fmt(r, 3) for r in phase["per_padding_ratio"])
            + ".",
        ]
        if phase.get("ratio_check_sent_early") is not None:
            sides = {r["mode"]: r for r in phase["sides"]}

            def after_client(mode: str) -> float:
                # from the client's creation to the first result: the backend's making (where
                # an early check starts its thread) and the first operation
                return float(sides[mode]["client_ms"] + sides[mode]["first_op_ms"])

            bare = after_client("dynacoord, verify=False")
            early = after_client('dynacoord, verify="early"')
            lines += [
                "",
                "The first-use table check as it comes is sent by the first write, just before "
                f"it: it cost {_fmt(phase['check_ms'], 2)} ms of the first operation and "
                f"{_fmt(after_client('dynacoord') - bare, 2)} ms from the client's creation to "
                "the first result. Sent early "
                '(`verify="early"`: when the backend is made, on a thread of its own) it cost '
                f"{_fmt(early - bare, 2)} ms of that, and the ratio is "
                f"{_fmt(phase['ratio_check_sent_early'], 3)}; without the check "
                f"(`verify=False`) {_fmt(phase['ratio_without_check'], 3)}.",
            ]
    return lines


def _peer_rows(name: str, case: str, r: dict[str, Any]) -> list[Any]:
    d, p = r["dynacoord_stats"], r["peer_stats"]
    return [
        name,
        case,
        d["median_ms"],
        p["median_ms"],
        d["p95_ms"],
        p["p95_ms"],
        f"**{r['ratio_median']:.3f}**",
        _paired(r),
        f"{r['ratio_p95']:.3f}",
        f"{r['requests_dynacoord']} / {r['requests_peer']}",
    ]


def _exactness(s: dict[str, Any]) -> list[str]:
    lines = [
        f"A counter incremented {s['increments']} times at {s['rate_hz']:.0f}/s with "
        "`counters.increment` (one writer slot per writer kept on the item, so a retried "
        "increment counts once) and, interleaved, a raw `UpdateItem ADD` of a token-free "
        "counter, on DynamoDB Local.",
        "",
    ]
    lines += _table(
        ["", "dynacoord (exact)", "raw ADD (no recognition)"],
        [
            ["requests per increment", s["requests_per_increment"], 1],
            ["item size at the end (bytes)", s["item_bytes"], s["raw_item_bytes"]],
            ["writer slots on the item", s["tokens_on_item"], "-"],
            ["WCU per increment (reported)", s["wcu_per_increment"], s["raw_wcu_per_increment"]],
            ["median latency ms", s["median_ms"], s["raw_median_ms"]],
        ],
    )
    lines += ["", f"Latency ratio (median): **{_fmt(s['ratio_median'], 3)}**."]
    return lines


def _metrics(s: dict[str, Any]) -> list[str]:
    lines = [
        "The default listener is `NO_METRICS` (disabled): no request is timed and a primitive's "
        f"report is an empty call. One no-op report costs {s['noop_report_ns']} ns and the "
        f"request helper's `enabled` check {s['enabled_check_ns']} ns; a lock acquire + release "
        f"passes through 3 such hooks, **{s['noop_share_of_lock_cycle']:.5%}** of its median "
        f"{_fmt(s['lock_cycle_ms'], 3)} ms on DynamoDB Local: nothing measurable.",
        "",
        "With a listener (interleaved A/B against the default in the same run; ratio = with "
        "listener / default, median of pairs with its 95 % interval):",
        "",
    ]
    lines += _table(
        ["operation", "listener", "median ms", "default median ms", "ratio", "95 % CI"],
        [
            [
                r["operation"],
                r["listener"],
                r["median_ms"],
                r["default_median_ms"],
                _fmt(r["ratio"], 3),
                f"{_fmt(r['ci_low'], 3)}..{_fmt(r['ci_high'], 3)}",
            ]
            for r in s["rows"]
        ],
    )
    tracing = s.get("tracing")
    if tracing:
        lines += [
            "",
            "Tracing (dynacoord.tracing): off, or without OpenTelemetry, a publish and a delivery "
            f"each check one flag, {tracing['off_check_ns']} ns. On, without a server: recording "
            f"the context {_fmt(tracing['capture_ns'] / 1000, 2)} µs in a span "
            f"({_fmt(tracing['capture_no_span_ns'] / 1000, 2)} µs with none active), a consumer "
            f"span {_fmt(tracing['consumer_span_linked_ns'] / 1000, 1)} µs linked to its "
            f"publisher ({_fmt(tracing['consumer_span_unlinked_ns'] / 1000, 1)} µs without a "
            "link), against "
            f"{_fmt(tracing.get('sdk_linked_span_ns', float('nan')) / 1000, 1)} µs for the "
            "OpenTelemetry SDK to record a bare linked span (recording, no exporter). The "
            "table's last row is a publish + delivery in a span, tracing on vs off.",
        ]
    return lines


def _peers(s: dict[str, Any]) -> list[str]:
    lines = [
        "Same server, same run, interleaved A/B. Ratio = dynacoord / peer (below 1: dynacoord is "
        "faster). Requests: dynacoord / peer, for one call (DynamoDB requests, or Redis round trips "
        "for the Redis comparison).",
        "",
    ]
    rows: list[list[Any]] = []
    failures: list[str] = []
    notes: list[str] = []
    for r in s.get("rows", []):
        label = f"{r['name']} — {r.get('peer', '')}"
        if r.get("status") != "ok":
            failures.append(f"* {label}: **{r.get('status')}**: `{r.get('error')}`")
            continue
        if "rows" in r:
            for sub in r["rows"]:
                rows.append(_peer_rows(label, sub["case"], sub))
        else:
            rows.append(_peer_rows(label, "", r))
        if r.get("note"):
            notes.append(f"* {r['name']}: {r['note']}")
    lines += _table(
        [
            "comparison",
            "case",
            "dynacoord median ms",
            "peer median ms",
            "dynacoord p95 ms",
            "peer p95 ms",
            "ratio (median)",
            "paired",
            "ratio (p95)",
            "requests",
        ],
        rows,
    )
    if failures:
        lines += ["", "Not compared:", "", *failures]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return lines


def _writecost(s: dict[str, Any]) -> list[str]:
    lines = [
        "DynamoDB Local, ManualClock advancing 1/rate s per call, units by AWS's rules from the "
        "requests sent and the items' sizes read around every write (bench/_units.py). "
        "`counters.increment` beside a plain `UpdateItem ADD` (no recognition of a retried "
        "write) and the previous design (every token of the last 1-2 minutes on the item; its "
        "steady state seeded as two minutes at the rate leave it). WCU per call over the second "
        "half of the calls.",
        "",
    ]
    rows = []
    for r in s["counters"]:
        previous = (
            f"refused ({r['previous_refused']})"
            if r["previous_refused"]
            else f"{_fmt(r['previous_wcu'])} WCU, {r['previous_item_bytes']} B"
        )
        rows.append(
            [
                f"{r['rate']}/s",
                f"{r['calls']} ({r['simulated_s']} s)",
                f"**{_fmt(r['wcu'])}**",
                _fmt(r["requests"]),
                r["item_bytes"],
                f"{_fmt(r['raw_wcu'])} WCU, {r['raw_item_bytes']} B",
                previous,
                f"{_fmt(r['cache_incr_wcu'])} + {_fmt(r['cache_incr_index_wcu'])}",
            ]
        )
    lines += _table(
        [
            "rate",
            "calls (simulated)",
            "WCU / increment",
            "requests / increment",
            "item B",
            "plain ADD",
            "previous design",
            "cache.incr WCU table + index",
        ],
        rows,
    )
    lines += [
        "",
        "Breaker: a closed call's read units after sustained failures (threshold never reached)",
        "",
    ]
    lines += _table(
        [
            "failures/s",
            "failures (simulated)",
            "item B",
            "RCU / closed call (default: eventual)",
            "consistent_reads=True",
            "state_cache=1 s (20 calls/s)",
        ],
        [
            [
                r["failures_per_s"],
                f"{r['failures']} ({r['simulated_s']} s)",
                r["item_bytes"],
                f"**{_fmt(r['rcu_per_closed_call'])}**",
                _fmt(r["rcu_per_closed_call_consistent"]),
                _fmt(r["rcu_per_closed_call_state_cache_1s"]),
            ]
            for r in s["breaker"]
        ],
    )
    policies = s.get("breaker_policies") or []
    if policies:
        lines += [
            "",
            "Breaker policies: cost per call (consecutive failures, the default; FailureRate "
            "with its defaults: counts kept per process and written once a flush_interval of "
            "1 s, or at once on a failure that could trip)",
            "",
        ]
        lines += _table(
            [
                "policy",
                "rate",
                "processes",
                "failing",
                "requests / call",
                "RCU / call",
                "WCU / call",
                "item B",
            ],
            [
                [
                    r["policy"],
                    f"{r['rate']}/s",
                    r["processes"],
                    r["failing"],
                    _fmt(r["requests_per_call"]),
                    _fmt(r["rcu_per_call"]),
                    f"**{_fmt(r['wcu_per_call'])}**",
                    r["item_bytes"],
                ]
                for r in policies
            ],
        )
    writers = s.get("writers") or []
    if writers:
        shapes = {
            "threads": "threads of one process, writing at once",
            "processes": "processes (a slot pool each)",
            "thread_per_request": "a new thread per request",
        }
        lines += [
            "",
            "Writers: WCU per write against the number of writers (100 writes/s on the "
            "ManualClock); a slot per call in flight (~19 bytes), so the item grows with the "
            "calls in flight and the processes in the window, never with the threads created",
            "",
        ]
        lines += _table(
            ["op", "writers", "shape", "writes", "WCU / write", "index WCU", "slots", "item B"],
            [
                [
                    f"`{'counters.increment' if r['op'] == 'increment' else 'cache.incr'}`",
                    r["writers"],
                    shapes.get(r["shape"], r["shape"]),
                    r["writes"],
                    f"**{_fmt(r['wcu_per_write'])}**",
                    _fmt(r["index_wcu_per_write"]),
                    r["slots"],
                    r["item_bytes"],
                ]
                for r in writers
            ],
        )
    by_process = s.get("breaker_processes") or []
    if by_process:
        lines += [
            "",
            "Breakers from many processes: 100 calls/s round-robin over N processes (a breaker "
            "and a slot pool each), one call in ten failing; FailureRate flushes after every "
            "call (the end of a Lambda invocation), or with flush_interval=20 s and no flush()",
            "",
        ]
        lines += _table(
            ["policy", "processes", "requests / call", "RCU / call", "WCU / call", "item B"],
            [
                [
                    r["policy"]
                    + (
                        ", flush() every call"
                        if r.get("flush_every_call")
                        else f", flush_interval={r['flush_interval']:g} s, no flush()"
                        if r.get("flush_interval")
                        else ""
                    ),
                    r["processes"],
                    _fmt(r["requests_per_call"]),
                    _fmt(r["rcu_per_call"]),
                    f"**{_fmt(r['wcu_per_call'])}**",
                    r["item_bytes"],
                ]
                for r in by_process
            ],
        )
    pt = s.get("powertools") or {}
    if pt.get("status") == "ok":
        lines += [
            "",
            f"Breakers side by side ({pt['peer']}): 4 processes on one breaker name, threshold 5; "
            "closed calls after each process read once; then failures only, round-robin, until "
            "a call is refused without being made.",
            "",
        ]
        lines += _table(
            [
                "",
                "requests / closed call",
                "RCU / closed call",
                "failed calls made before one is refused",
                "RCU, WCU spent on them",
            ],
            [
                [
                    label,
                    _fmt(r["closed_call_requests"]),
                    _fmt(r["closed_call_rcu"]),
                    r["failures_to_trip"],
                    f"{_fmt(r['rcu_until_trip'])}, {r['wcu_until_trip']}",
                ]
                for label, r in (
                    ("dynacoord (default: eventual read)", pt["dynacoord"]),
                    ("dynacoord state_cache=5", pt["dynacoord_state_cache_5s"]),
                    ("Powertools (5 s local cache)", pt["powertools"]),
                )
            ],
        )
    elif pt:
        lines += ["", f"Powertools breaker: {pt.get('status')} ({pt.get('error')})."]
    j = s["join"]
    lines += [
        "",
        f"Join: the last arrival of a {j['members']}-member join cost **{j['last_arrival_wcu']} "
        f"WCU** in {j['last_arrival_requests']} requests (largest item written "
        f"{j['item_bytes']} B; fired: {j['fired']})"
        + (
            f"; with {s['join_60_byte_ids']['id_bytes']}-byte member ids "
            f"**{s['join_60_byte_ids']['last_arrival_wcu']} WCU** (largest item "
            f"{s['join_60_byte_ids']['item_bytes']} B)."
            if s.get("join_60_byte_ids")
            else "."
        ),
    ]
    lines += _churning_fleet(s.get("churning_fleet") or {})
    return lines


def _churning_fleet(c: dict[str, Any]) -> list[str]:
    """Section 9's churning-fleet rows (bench/writecost.py run_churn)."""
    if not c:
        return []
    lines = [
        "",
        "**A churning fleet** (ManualClock; each environment a simulated process with its own "
        "slot pool and memory; environments replaced `lifetime` s after they started, staggered; "
        "calls spread round-robin; units per call over the last third):",
        "",
    ]
    lines += _table(
        [
            "op",
            "client (window)",
            "alive",
            "lifetime",
            "calls/s",
            "WCU / call",
            "index WCU",
            "requests / call",
            "refused / call",
            "slots",
            "item",
        ],
        [
            [
                r["op"],
                f"{r['client']} ({_fmt(r['window_s'], 0)} s)",
                r["environments_alive"],
                f"{_fmt(r['lifetime_s'], 0)} s",
                r["calls_per_s"],
                f"**{_fmt(r['wcu_per_call'])}**",
                _fmt(r["index_wcu_per_call"]),
                _fmt(r["requests_per_call"], 3),
                _fmt(r["refused_per_call"], 3),
                r["slots"],
                f"{r['item_bytes']} B",
            ]
            for r in c.get("fleet", ())
        ],
    )
    lines += ["", "Bursts, then one writer at 1 call/s (the same process, or another one):", ""]
    lines += _table(
        ["burst", "WCU of the next 5 calls", "WCU / call after", "slots at the end"],
        [
            [
                f"{r['burst']} {r['shape']}",
                ", ".join(str(w) for w in r["wcu_first_5"]),
                _fmt(r["wcu_per_call_after"]),
                r["slots_at_end"],
            ]
            for r in c.get("bursts", ())
        ],
    )
    lines += ["", "One-shot processes (one write each):", ""]
    lines += _table(
        ["processes", "one every", "window", "WCU / call", "requests / call", "slots", "largest"],
        [
            [
                r["processes"],
                f"{_fmt(r['every_s'])} s",
                f"{_fmt(r['window_s'], 0)} s",
                f"**{_fmt(r['wcu_per_call'])}**",
                _fmt(r["requests_per_call"], 3),
                r["slots_at_end"],
                f"{r['largest_item_bytes']} B",
            ]
            for r in c.get("one_shot", ())
        ],
    )
    lines += [
        "",
        "Route (b), measured for comparison: an increment as a one-item TransactWriteItems with "
        "a ClientRequestToken, plus the consistent GetItem `increment()` needs for its value "
        "(DynamoDB Local serializes transactions; the service cancels conflicting ones):",
        "",
    ]
    lines += _table(
        ["threads", "requests / call", "WCU / call", "RCU / call", "cancelled / call"],
        [
            [
                r["threads"],
                _fmt(r["requests_per_call"], 3),
                _fmt(r["wcu_per_call"]),
                _fmt(r["rcu_per_call"]),
                _fmt(r["cancelled_per_call"], 3),
            ]
            for r in c.get("transactions", ())
        ],
    )
    return lines


def _ceiling_text(c: dict[str, Any]) -> str:
    if c.get("processes"):
        return f"{c['processes']:,} processes"
    return "-" if c.get("per_s") is None else f"{c['per_s']:,}/s"


def _costs(s: dict[str, Any]) -> list[str]:
    prices = s["prices"]
    limits = s["partition_limits"]
    lines = [
        "Every request sent, priced by AWS's rules from the items read around it "
        "(`bench/_units.py`; not DynamoDB Local's `ConsumedCapacity`, which counts a "
        "transaction as one item): a write costs 1 WCU per started KB of the larger of the item "
        "before and after, twice in a transaction; the index (projection ALL) is written when "
        "the item is in it before or after, twice (a delete and a put) when its index key "
        "changes; reads 1 RCU per started 4 KB, half when eventually consistent. Per operation, "
        f"averaged over the calls made (outbox: events of {s['outbox'].get('event_payload_bytes')}"
        " bytes of payload; delivery rows include the worker's polls). Refusals: conditional "
        "writes refused (by design for an idempotency replay, a lock wait, a lost claim race).",
        "",
        f"**$ per million operations at on-demand prices, {prices['as_of']}: "
        f"${prices['write_per_million_units']} per million write request units, "
        f"${prices['read_per_million_units']} per million read request units** "
        "(table and index writes are both write request units; storage, streams and Lambda "
        "are not included).",
        "",
    ]
    peers: dict[str, list[dict[str, Any]]] = {}
    for r in s.get("peers", []):
        peers.setdefault(r["primitive"], []).append(r)
    rows = []
    seen: list[str] = []
    for r in s["rows"]:
        if r["primitive"] not in seen:
            seen.append(r["primitive"])
    for primitive in seen + [p for p in peers if p not in seen]:
        for r in [x for x in s["rows"] if x["primitive"] == primitive] + peers.get(primitive, []):
            rows.append(
                [
                    r["primitive"],
                    r["operation"] if r.get("peer") is None else f"{r['operation']} — *peer*",
                    r.get("peer") or "dynacoord",
                    _fmt(r["requests"]),
                    _fmt(r["table_wcu"]),
                    _fmt(r["index_wcu"]),
                    _fmt(r["rcu"]),
                    f"${_fmt(r['usd_per_million'])}",
                    _fmt(r["refusals"]),
                    r.get("note") or "",
                ]
            )
    lines += _table(
        [
            "primitive",
            "operation",
            "by",
            "requests",
            "table WCU",
            "index WCU",
            "RCU",
            "$ / million ops",
            "refusals",
            "note",
        ],
        rows,
    )
    delivery = [r for r in s["rows"] if r["operation"].startswith("delivery per event")]
    if delivery:
        lines += [
            "",
            "Outbox delivery, per event, on the configuration the worker has today "
            "(`outbox.worker(handler)` defaults; nothing about its design is assumed: what is "
            "sent is what is counted); refused items are claim races lost between workers "
            "(section 3 counts them for worker processes too):",
            "",
        ]
        lines += _table(
            [
                "path",
                "threads",
                "requests / event",
                "table WCU / event",
                "index WCU / event",
                "refused items / event",
            ],
            [
                [
                    r["operation"].removeprefix("delivery per event: "),
                    r.get("threads", 1),
                    _fmt(r["requests"]),
                    _fmt(r["table_wcu"]),
                    _fmt(r["index_wcu"]),
                    _fmt(r["refused_items"], 3),
                ]
                for r in delivery
            ],
        )
    if s["outbox"].get("per_event_option"):
        lines += ["", f"Per-event delivery: {s['outbox']['per_event_option']}."]
    lines += [
        "",
        "### Ceilings of one key",
        "",
        f"DynamoDB serves at most {limits['wcu_per_s']:,} WCU/s and {limits['rcu_per_s']:,} "
        "RCU/s per partition, of the table and of the index alike. Each ceiling is that limit "
        "over the measured units per operation on the busiest partition the operation touches "
        "(a key's item partition, or an index partition its namespace shares; a sharded index "
        f"or counter taken as evenly loaded over its shards; {s.get('shards')} shards here). "
        "*docs* is what the primitive's page states; a computed ceiling more than 15 % away "
        "from it is marked **disagrees**.",
        "",
    ]
    lines += _table(
        [
            "primitive",
            "operation",
            "scope",
            "ceiling",
            "busiest partition",
            "load",
            "docs",
            "agrees",
            "what lifts it",
        ],
        [
            [
                c["primitive"],
                c["operation"]
                + ("" if c["measured_on"] == "this operation" else f" ({c['measured_on']})"),
                c["scope"],
                f"**{_ceiling_text(c)}**",
                f"`{c['partition']}`" if c.get("partition") else "-",
                c.get("load") or "-",
                c["docs"],
                {True: "yes", False: "**disagrees**", None: "-"}[c["agrees"]],
                c["lifted_by"],
            ]
            for c in s["ceilings"]
        ],
    )
    if s.get("note"):
        lines += ["", s["note"]]
    if s.get("errors"):
        lines += ["", "Not measured: " + "; ".join(f"`{e}`" for e in s["errors"])]
    return lines


def _admission(s: dict[str, Any]) -> list[str]:
    lines = [
        "Per call, one writer, small items: dynacoord on DynamoDB Local, write and read units "
        "counted by AWS's rules (`bench/_units.py`); the peers by the same meter where installed "
        "(Redis peers in round trips to one redis-server, where units do not apply), and the "
        "rows marked *stated* from the peer's documented design (not run here). Unit counts do "
        "not depend on the scale.",
        "",
    ]
    rows = []
    for r in s["rows"] + s.get("peers", []) + s.get("stated", []):
        apis = r.get("apis")
        requests = _fmt(r["requests"])
        if isinstance(apis, dict) and apis and "Redis round trips" not in apis:
            requests += " (" + ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(apis.items())) + ")"
        rows.append(
            [
                r["primitive"],
                r["operation"],
                r["by"],
                requests,
                _fmt(r.get("wcu")),
                _fmt(r.get("rcu")),
                _fmt(r.get("refusals")),
                r.get("note") or "",
            ]
        )
    lines += _table(
        ["primitive", "operation", "by", "requests", "WCU", "RCU", "refused", "note"], rows
    )
    if s.get("errors"):
        lines += ["", "Not measured: " + "; ".join(f"`{e}`" for e in s["errors"])]
    return lines


RENDERERS = {
    "requests": _requests,
    "overhead": _overhead,
    "outbox": _outbox,
    "contention": _contention,
    "coldstart": _coldstart,
    "peers": _peers,
    "exactness": _exactness,
    "metrics": _metrics,
    "writecost": _writecost,
    "costs": _costs,
    "admission": _admission,
}


def _ok(sections: dict[str, Any], key: str) -> dict[str, Any] | None:
    section = sections.get(key)
    return section if section is not None and section.get("status") == "ok" else None


def _outbox_ratios(rows: list[dict[str, Any]], unit: str) -> list[str]:
    """Batched vs per-event with 4 threads, and 4 threads vs 1 (batched)."""
    by = {(r["workers"], r.get("design", "batched")): r for r in rows if "events_per_s" in r}
    four_b, four_p = by.get(("4 threads", "batched")), by.get(("4 threads", "per-event"))
    one_b = by.get(("1 thread", "batched"))
    lines: list[str] = []
    if four_b and four_p and four_p["events_per_s"]:
        lines.append(
            f"4 threads, batched vs per-event: {four_b['events_per_s'] / four_p['events_per_s']:.2f}x "
            f"the events/s, {four_b['requests_per_event']} vs {four_p['requests_per_event']} "
            f"{unit} per event."
        )
    four_tx = by.get(("4 threads", "batched-tx"))
    if four_b and four_tx and four_tx["events_per_s"]:
        lines.append(
            "4 threads, batched as conditional PartiQL batches (the default) vs as transactions "
            f"(batched-tx, the design before): {four_b['events_per_s'] / four_tx['events_per_s']:.2f}x "
            f"the events/s, {four_b.get('write_units_per_event')} vs "
            f"{four_tx.get('write_units_per_event')} write units per event."
        )
    if four_b and one_b and one_b["events_per_s"]:
        lines.append(
            f"Batched, 4 threads vs 1: {four_b['events_per_s'] / one_b['events_per_s']:.2f}x the "
            "events/s."
        )
    return ["", *lines] if lines else []


def _redis_outbox_summary(r: dict[str, Any]) -> str:
    rows = [
        x
        for x in r.get("rows", [])
        if "events_per_s" in x and x.get("design", "batched") == "batched"
    ]
    if r.get("status") != "ok" or not rows:
        return ""
    return (
        " (Redis backend: "
        + ", ".join(f"{x['workers']}: {_fmt(x['events_per_s'], 0)}/s" for x in rows)
        + f"; lost {sum(x['lost'] for x in rows)}, duplicates {sum(x['duplicates'] for x in rows)})"
    )


def summary(results: dict[str, Any]) -> list[str]:
    """The headline numbers of a run as a two-column Markdown table (also for the README)."""
    sections = results.get("sections", {})
    rows: list[list[Any]] = []
    req = _ok(sections, "requests")
    if req:
        measured = [r for r in req["rows"] if "requests" in r]
        above = [f"{r['primitive']} {r['operation']}" for r in measured if r["above_minimum"]]
        errors = [r for r in req["rows"] if "error" in r]
        rows.append(
            [
                "requests per operation",
                f"{len(measured)} operations counted; {len(measured) - len(above)} at their "
                f"minimum; above it: {'; '.join(above) if above else 'none'}"
                + (f"; {len(errors)} could not be measured" if errors else ""),
            ]
        )
    ov = _ok(sections, "overhead")
    if ov:
        good = [r for r in ov["rows"] if "ratio_median" in r]
        if good:
            worst = max(good, key=lambda r: r["ratio_median"])
            medians = sorted(r["ratio_median"] for r in good)
            above = _above(ov)
            rows.append(
                [
                    "overhead over raw boto3 (single-request operations)",
                    f"{len(good) - len(above)} of {len(good)} within {ov['target']:.2f} (ratio of "
                    f"medians); median ratio "
                    f"{medians[len(medians) // 2]:.3f}; highest {worst['ratio_median']:.3f} "
                    f"({worst['primitive']} {worst['operation']})"
                    + (
                        "; above the target: "
                        + "; ".join(
                            f"{r['primitive']} {r['operation']} {r['ratio_median']:.3f} "
                            f"(+{r['extra_ms_median'] * 1000:.0f} µs, paired "
                            f"{r['ratio_paired']:.3f})"
                            for r in above
                        )
                        if above
                        else ""
                    ),
                ]
            )
        redis_good = [r for r in ov.get("redis_rows", []) if "ratio_median" in r]
        if redis_good:
            extra = sorted(r["extra_ms_median"] * 1000 for r in redis_good)
            rows.append(
                [
                    "Redis backend over raw redis-py (one command each)",
                    f"median {extra[len(extra) // 2]:.0f} µs extra per call (from "
                    f"{extra[0]:.0f} to {extra[-1]:.0f}) on a loopback round trip of "
                    f"{sorted(r['raw']['median_ms'] for r in redis_good)[len(redis_good) // 2]:.2f} "
                    f"ms ({len(redis_good)} operations)",
                ]
            )
    ob = _ok(sections, "outbox")
    if ob:
        good = [
            r for r in ob["rows"] if "events_per_s" in r and r.get("design", "batched") == "batched"
        ]
        if good:
            rows.append(
                [
                    f"outbox delivery ({ob['events']} events, no-op handler)",
                    ", ".join(f"{r['workers']}: {_fmt(r['events_per_s'], 0)}/s" for r in good)
                    + f"; {min(r['requests_per_event'] for r in good):.2f}-"
                    f"{max(r['requests_per_event'] for r in good):.2f} requests per event; "
                    f"lost {sum(r['lost'] for r in good)}, duplicates "
                    f"{sum(r['duplicates'] for r in good)}"
                    + _redis_outbox_summary(ob.get("redis") or {}),
                ]
            )
    ct = _ok(sections, "contention")
    if ct:
        rows.append(
            [
                f"lock contention ({ct['threads']} threads, one key)",
                f"{_fmt(ct['acquisitions_per_s'], 0)} acquisitions/s, fairness "
                f"{_fmt(ct['fairness_min_max'])}, {ct['mutual_exclusion_violations']} "
                f"exclusion violations, {ct['fence_order_violations']} fence-order violations"
                + (
                    f" (Redis backend: {_fmt(ct['redis']['acquisitions_per_s'], 0)}/s, fairness "
                    f"{_fmt(ct['redis']['fairness_min_max'])}, "
                    f"{ct['redis']['mutual_exclusion_violations']} violations)"
                    if (ct.get("redis") or {}).get("status") == "ok"
                    else ""
                ),
            ]
        )
    cs = _ok(sections, "coldstart")
    if cs:
        by_case = {r["case"]: r["median_ms"] for r in cs["imports"]}
        rows.append(
            [
                "import time",
                f"`import dynacoord` {_fmt(by_case.get('import dynacoord'), 0)} ms vs `import "
                f"boto3` {_fmt(by_case.get('import boto3'), 0)} ms (ratio "
                f"{_fmt(cs['import_ratio_dynacoord_vs_boto3'], 2)}); start to first lock "
                f"acquired vs raw boto3: {_fmt(cs['first_result_ratio'], 3)} over the GC cycle "
                f"({_fmt(cs.get('bare_first_result_ratio'), 3)} for a bare pair of processes)",
            ]
        )
    pe = _ok(sections, "peers")
    if pe:
        for r in pe["rows"]:
            if r.get("status") != "ok":
                rows.append([r["name"], f"not compared ({r.get('status')})"])
                continue
            cases = r.get("rows") or [dict(r, case="")]
            rows.append(
                [
                    f"{r['name']} vs {r.get('peer')}",
                    "; ".join(
                        (f"{c['case']}: " if c["case"] else "")
                        + f"ratio {c['ratio_median']:.2f} (paired {c['ratio_paired']:.2f}), "
                        f"requests {c['requests_dynacoord']} vs {c['requests_peer']}"
                        for c in cases
                    ),
                ]
            )
    ex = _ok(sections, "exactness")
    if ex:
        rows.append(
            [
                "exact counting (one writer slot per writer on the item)",
                f"{_fmt(ex['requests_per_increment'])} requests per increment, item "
                f"{ex['item_bytes']} vs {ex['raw_item_bytes']} bytes after {ex['increments']} "
                f"increments at {ex['rate_hz']:.0f}/s, WCU {_fmt(ex['wcu_per_increment'])} vs "
                f"{_fmt(ex['raw_wcu_per_increment'])}, latency ratio {_fmt(ex['ratio_median'], 3)}",
            ]
        )
    wc = _ok(sections, "writecost")
    if wc:
        rows.append(
            [
                "write cost at a sustained rate (issue 29)",
                "WCU per increment "
                + ", ".join(f"{_fmt(r['wcu'])} at {r['rate']}/s" for r in wc["counters"])
                + "; breaker closed call "
                + ", ".join(
                    f"{_fmt(r['rcu_per_closed_call'])} RCU ({r['item_bytes']} B item) after "
                    f"{r['failures_per_s']} failures/s"
                    for r in wc["breaker"]
                )
                + f"; last arrival of a {wc['join']['members']}-member join "
                f"{wc['join']['last_arrival_wcu']} WCU",
            ]
        )
    costs = _ok(sections, "costs")
    if costs:
        by = {r["operation"]: r for r in costs["rows"]}
        default = by.get("delivery per event: default worker")
        disagree = [
            f"{c['primitive']} {c['operation']}" for c in costs["ceilings"] if c["agrees"] is False
        ]
        text = f"{len(costs['rows'])} operations and {len(costs['peers'])} peer rows priced"
        if default:
            text += (
                f"; outbox delivery (default worker) {_fmt(default['requests'])} requests, "
                f"{_fmt(default['table_wcu'])} table + {_fmt(default['index_wcu'])} index WCU "
                f"per event (${_fmt(default['usd_per_million'])} per million)"
            )
        text += f"; ceilings disagreeing with the docs: {', '.join(disagree) or 'none'}"
        rows.append(["cost per operation and ceilings (section 10)", text])
    if not rows:
        return ["No section was measured."]
    return _table(["measure", "result"], rows)


def headline_figures(results: dict[str, Any]) -> dict[str, str]:
    """The few figures a run is compared on with the previous committed run, by measure."""
    sections = results.get("sections", {})
    figures: dict[str, str] = {}
    ov = _ok(sections, "overhead")
    good = [r for r in ov["rows"] if "ratio_median" in r] if ov else []
    if ov and good:
        medians = sorted(r["ratio_median"] for r in good)
        figures["overhead: rows within the target; median ratio; highest"] = (
            f"{len(good) - len(_above(ov))} of {len(good)}; {medians[len(medians) // 2]:.3f}; "
            f"{medians[-1]:.3f}"
        )
    cs = _ok(sections, "coldstart")
    if cs and cs.get("first_result_ratio") is not None:
        how = "over the GC cycle" if "bare_first_result_ratio" in cs else "bare pair"
        figures["cold start, start to first lock vs raw boto3"] = (
            f"{_fmt(cs['first_result_ratio'], 3)} ({how})"
            + (
                f"; bare pair {_fmt(cs['bare_first_result_ratio'], 3)}"
                if cs.get("bare_first_result_ratio") is not None
                else ""
            )
        )
    pe = _ok(sections, "peers")
    for peer in pe["rows"] if pe else []:
        if peer.get("status") == "ok" and peer.get("rows"):
            figures[f"{peer['name']}, ratio to the peer"] = "; ".join(
                f"{c['case']} {c['ratio_median']:.3f}" for c in peer["rows"]
            )
    ct = _ok(sections, "contention")
    if ct:
        figures[f"lock contention ({ct['threads']} threads): acquisitions/s, fairness"] = (
            f"{_fmt(ct['acquisitions_per_s'], 0)}, {_fmt(ct['fairness_min_max'])}"
        )
    ob = _ok(sections, "outbox")
    for row in ob["rows"] if ob else []:
        if row.get("workers") == "4 threads" and row.get("design", "batched") == "batched":
            figures["outbox delivery, 4 threads (events/s)"] = _fmt(row.get("events_per_s"), 0)
    return figures


def _beside_previous(results: dict[str, Any]) -> list[str]:
    """This run's headline figures beside those of the previous committed run, if known."""
    previous = results.get("previous")
    if not previous or not previous.get("figures"):
        return []
    now = headline_figures(results)
    names = list(now) + [name for name in previous["figures"] if name not in now]
    return [
        "",
        (
            f"Beside the report committed at `{previous['revision']}`"
            if previous.get("revision")
            else "Beside the report this one replaced"
        )
        + f" (run of {previous.get('generated_at', '?')}), where the design has changed since:",
        "",
        *_table(
            [
                "measure",
                "this run",
                f"report at `{previous['revision']}`"
                if previous.get("revision")
                else "the report replaced",
            ],
            [[n, now.get(n, "—"), previous["figures"].get(n, "—")] for n in names],
        ),
    ]


def previous_committed(path: Path, revision: str = "HEAD") -> dict[str, Any] | None:
    """``previous`` for a run about to replace ``path``: the headline figures of the version of
    it committed in git at ``revision`` (else of the file as it is), None if there is none."""
    import subprocess

    text: str | None = None
    committed_at: str | None = revision
    try:
        text = subprocess.run(
            ["git", "show", f"{revision}:./{path.name}"],
            cwd=path.parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        text = path.read_text() if path.exists() else None
        committed_at = None
    if not text:
        return None
    try:
        old = json.loads(text)
    except ValueError:
        return None
    previous = {
        "generated_at": old.get("meta", {}).get("generated_at"),
        "figures": headline_figures(old),
    }
    if committed_at is not None:
        previous["revision"] = committed_at
    return previous


def render(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    lines = [
        "# dynacoord benchmark report",
        "",
        f"Generated {meta.get('generated_at', '?')} by `{meta.get('command', 'make bench')}` "
        f"(scale: {meta.get('scale', {}).get('name', '?')}, {_fmt(meta.get('duration_s'), 0)} s).",
        "",
        "Numbers come from one run on a shared machine against Amazon DynamoDB Local and a local "
        "redis-server: absolute milliseconds say little about AWS; **only ratios measured in the "
        "same run are meaningful**.",
        "",
        "**How to reproduce:** `make bench` (installs `.[dev,redis,mongo,bench]`, fetches DynamoDB "
        "Local, runs `python -m bench`; `python -m bench --scale tiny` for a quick look).",
        "",
        "## Machine and versions",
        "",
    ]
    lines += _table(["", ""], [[k, _fmt(v)] for k, v in meta.get("versions", {}).items()])
    lines += ["", "## Summary", ""]
    try:
        lines += summary(results)
        lines += _beside_previous(results)
    except (KeyError, TypeError, ValueError) as exc:
        lines += [f"**Could not summarise**: `{type(exc).__name__}: {exc}`"]
    sections = results.get("sections", {})
    for key, title in SECTION_TITLES.items():
        lines += ["", f"## {title}", ""]
        section = sections.get(key)
        if section is None or section.get("status") != "ok":
            lines += _not_measured(section)
            continue
        try:
            if key == "overhead":  # checks its coverage against section 1
                lines += _overhead(section, sections.get("requests"))
            else:
                lines += RENDERERS[key](section)
        except (KeyError, TypeError, ValueError) as exc:
            lines += [f"**Could not render this section**: `{type(exc).__name__}: {exc}`"]
    return "\n".join(lines) + "\n"


def write(results: dict[str, Any], out_dir: Path, *, beside: str = "HEAD") -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    report = out_dir / "REPORT.md"
    data = out_dir / "results.json"
    if "previous" not in results:
        previous = previous_committed(data, beside)
        if previous and previous.get("generated_at") != results.get("meta", {}).get("generated_at"):
            results["previous"] = previous
    data.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")
    report.write_text(render(results))
    return report, data
