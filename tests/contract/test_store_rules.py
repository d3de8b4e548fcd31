"""Every store rule on every backend and every path: the list, and a check that it holds.

:data:`RULES` names each rule a store must keep (a condition of its conditional writes), the
contract test that breaks it on purpose, and the mutation guard of each backend
(tests/mutations/). The check collects the contract suite's test ids (``pytest --collect-only``
in a child process: the ids pytest itself makes of the backend and path parameters) and fails
when a rule's test does not run on one of the contract backends (:data:`CONTRACT_BACKENDS`),
or, for a claim rule, through one of the claim paths, or may skip itself after collection; when a guard it names is missing or is
another backend's; when a rule has no guard for some backend without saying why; or when
docs/guarantees.md ("Every rule on every backend") does not list it.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import CONTRACT_BACKENDS
from tests.mutations.run import ROOT, load

#: the ways an outbox claim reaches its store (``claim``: a worker with ``batch_claim=False``)
CLAIM_PATHS = ("claim", "claim_many")
#: the store backends a guard is written for ("all": the primitive's own policy)
GUARD_BACKENDS = ("dynamodb", "redis", "mongo")
DOCS = ROOT / "docs" / "guarantees.md"
DOCS_SECTION = "### Every rule on every backend"


@dataclass(frozen=True)
class Rule:
    primitive: str
    promise: str
    #: the contract test that breaks it, ``file::function`` under tests/contract/
    test: str
    #: the parameters each backend must run it with (the claim paths), or none
    paths: tuple[str, ...] = ()
    #: guard backend ("dynamodb", "redis", "mongo" or "all") -> guard id
    guards: dict[str, str] = field(default_factory=dict)
    #: why some backend has no guard of its own, when one has none
    unguarded: str = ""
    #: contract backends the test cannot run on -> why
    not_on: dict[str, str] = field(default_factory=dict)


_CLAIMS = "test_outbox_claim_rules.py::"
#: where the lossy fixture (tests/lossy.py) cannot lose an answer (it has a real MongoDB kind,
#: ``mongodb``, when ``MONGODB_URI`` is set)
_LOSSY_NOT_ON = {
    "moto": "the lossy client loses answers on the wire; DynamoDB is DDB Local here",
}

RULES: dict[str, Rule] = {
    "outbox-claim-as-seen": Rule(
        "outbox",
        "a claim applies only while the event has the status and lease token its read saw",
        _CLAIMS + "test_a_claim_from_a_read_before_another_claim_is_refused",
        CLAIM_PATHS,
        unguarded=(
            "every write that changes the status or token also changes attempts or moves "
            "due_ms past now, so breaking this clause alone is caught by those clauses "
            "(its mutants survive as equivalents)"
        ),
    ),
    "outbox-claim-due": Rule(
        "outbox",
        "a claim applies only while the event is due: a lease renewed after the read is not "
        "taken over",
        _CLAIMS + "test_a_claim_from_a_read_before_a_renewal_is_refused",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-claim-refused-after-a-renewal",  # in the delivery engine's list
            "redis": "redis-claim-refused-after-a-renewal",
            "mongo": "mongo-claim-refused-after-a-renewal",
        },
    ),
    "outbox-claim-attempts": Rule(
        "outbox",
        "a claim applies only while the event has the attempts its read saw: no retry's "
        "backoff skipped by an old read",
        _CLAIMS + "test_a_claim_from_a_read_before_a_retry_is_refused",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-claim-checks-attempts",
            "redis": "redis-claim-checks-attempts",
            "mongo": "mongo-claim-checks-attempts",
        },
    ),
    "outbox-claim-place": Rule(
        "outbox",
        "an ordered event is claimed only at the place its read saw: a redriven event is not "
        "delivered ahead of its group",
        _CLAIMS + "test_a_claim_from_a_read_before_a_group_retry_is_refused",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-outbox-ordered-claim-at-its-place",
            "redis": "redis-claim-at-its-place",
            "mongo": "mongo-claim-at-its-place",
        },
    ),
    "outbox-claim-gate": Rule(
        "outbox",
        "an ordered group's place k+1 is not claimed before place k is finished",
        _CLAIMS + "test_a_claim_behind_its_groups_head_is_refused",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-outbox-claim-behind-gate",
            "redis": "redis-outbox-claim-behind-gate",
            "mongo": "mongo-outbox-claim-behind-gate",
        },
    ),
    "outbox-claim-recognises-its-own": Rule(
        "outbox",
        "a claim applied and sent again after its answer was lost is reported made, its "
        "attempt counted once",
        _CLAIMS + "test_a_claim_whose_answer_was_lost_is_its_own",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-claim-recognises-its-own",
            "redis": "redis-claim-recognises-its-own",
            "mongo": "mongo-claim-recognises-its-own",
        },
        not_on=_LOSSY_NOT_ON,
    ),
    "outbox-finish-holds-lease": Rule(
        "outbox",
        "outcomes and lease renewals are written only while the writer's claim holds the event",
        _CLAIMS + "test_an_outcome_or_renewal_after_a_takeover_is_refused",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-outbox-outcome-holds-lease",
            "redis": "redis-outbox-outcome-holds-lease",
            "mongo": "mongo-outbox-outcome-holds-lease",
        },
    ),
    "outbox-outcome-recognises-its-own": Rule(
        "outbox",
        "an outcome applied and sent again after its answer was lost is reported written, not "
        "as a lost lease",
        _CLAIMS + "test_an_outcome_whose_answer_was_lost_is_its_own",
        CLAIM_PATHS,
        {
            "dynamodb": "ddb-outcome-recognises-its-own",
            "redis": "redis-outcome-recognises-its-own",
            "mongo": "mongo-outcome-recognises-its-own",
        },
        not_on=_LOSSY_NOT_ON,
    ),
    "lock-acquire-only-if-free": Rule(
        "locks",
        "acquire takes only a free or expired lock: one holder at a time",
        "test_locks.py::test_hold_context_releases_and_raises_when_taken",
        guards={
            "dynamodb": "ddb-lock-acquire-only-if-free",
            "redis": "redis-lock-acquire-only-if-free",
            "mongo": "mongo-lock-acquire-only-if-free",
        },
    ),
    "lock-held-until-expiry": Rule(
        "locks",
        "extend acts only while the lease has not expired",
        "test_locks.py::test_extend_moves_expiry_and_fails_once_lost",
        guards={
            "dynamodb": "ddb-lock-held-until-expiry",
            "redis": "redis-lock-extend-until-expiry",
            "mongo": "mongo-lock-held-until-expiry",
        },
    ),
    "lock-release-only-by-holder": Rule(
        "locks",
        "releasing a lost lock never frees the new holder's",
        "test_locks.py::test_release_of_lost_lock_never_deletes_the_new_owners",
        guards={
            "dynamodb": "ddb-lock-release-only-by-holder",
            "redis": "redis-lock-release-only-by-holder",
            "mongo": "mongo-lock-release-only-by-holder",
        },
    ),
    "lock-release-recognises-its-own": Rule(
        "locks",
        "a release applied and sent again after its answer was lost reports the lease released "
        "and frees no holder that took the lock in the gap",
        "test_lost_responses.py::"
        "test_a_release_with_a_lost_response_reports_it_and_frees_no_later_holder",
        guards={
            "dynamodb": "ddb-lock-release-recognises-its-own",
            "redis": "redis-lock-release-recognises-its-own",
            "mongo": "mongo-lock-release-recognises-its-own",
        },
        not_on=_LOSSY_NOT_ON,
    ),
    "lock-force-release-once": Rule(
        "locks",
        "a force_release sent again after its answer was lost frees no lock taken in the gap",
        "test_lost_responses.py::"
        "test_a_force_release_with_a_lost_response_reports_it_and_frees_no_later_holder",
        guards={
            "dynamodb": "ddb-lock-force-release-once",
            "redis": "redis-lock-force-release-once",
            "mongo": "mongo-lock-force-release-once",
        },
        not_on=_LOSSY_NOT_ON,
    ),
    "lock-fence-grows": Rule(
        "locks",
        "every acquisition gets a fence above every earlier one",
        "test_locks.py::test_fences_strictly_increase_across_acquisitions",
        guards={
            "dynamodb": "ddb-lock-fence-grows",
            "redis": "redis-lock-fence-grows",
            "mongo": "mongo-lock-fence-grows",
        },
    ),
    "lock-lease-is-its-fence": Rule(
        "locks",
        "a lease says it holds the lock only under its own fence, not under its owner's name",
        "test_lock_lease_rules.py::test_a_lease_taken_again_by_its_owner_after_it_expired_is_not_held",
        guards={"all": "locks-is-held-compares-the-fence"},
    ),
    "breaker-trips-at-threshold": Rule(
        "breaker",
        "the breaker opens at its failure threshold and an open breaker refuses calls",
        "test_breaker.py::test_trips_at_threshold_and_open_refuses_without_calling",
        guards={
            "dynamodb": "ddb-breaker-trips-at-threshold",
            "redis": "redis-breaker-trips-at-threshold",
            "mongo": "mongo-breaker-trips-at-threshold",
        },
    ),
    "breaker-one-trial-round": Rule(
        "breaker",
        "processes that read the breaker open past reset_timeout start one trial round",
        "test_breaker_trial_rounds.py::test_processes_that_read_the_breaker_open_start_one_trial_round",
        guards={
            "dynamodb": "ddb-breaker-one-trial-round",
            "redis": "redis-breaker-one-trial-round",
            "mongo": "mongo-breaker-one-trial-round",
        },
    ),
    "breaker-outcome-in-its-round": Rule(
        "breaker",
        "a trial's late outcome from an earlier round neither closes nor reopens the breaker",
        "test_breaker.py::test_trial_outcome_from_before_a_reset_is_ignored",
        guards={
            "dynamodb": "ddb-breaker-outcome-in-its-round",
            "redis": "redis-breaker-outcome-in-its-round",
            "mongo": "mongo-breaker-outcome-in-its-round",
        },
    ),
    "breaker-trial-slots-bounded": Rule(
        "breaker",
        "half-open lets through at most half_open_max_calls trial calls",
        "test_breaker_trial_slots.py::test_processes_that_read_one_free_slot_get_one_trial_between_them",
        guards={
            "dynamodb": "ddb-breaker-trial-slots-bounded",
            "redis": "redis-breaker-trial-slots-bounded",
            "mongo": "mongo-breaker-trial-slots-bounded",
        },
    ),
    "checkpoint-never-overwritten": Rule(
        "checkpoints",
        "a checkpoint saved at a sequence that holds a live one is refused, never overwritten",
        "test_checkpoints.py::test_explicit_sequence_is_never_overwritten",
        guards={
            "dynamodb": "ddb-put-only-if-free",
            "redis": "redis-checkpoint-never-overwritten",
            "mongo": "mongo-write-only-if-free",
        },
    ),
    "idempotency-claim-only-if-free": Rule(
        "idempotency",
        "one claim per key: a call while another is in progress is refused, never run",
        "test_idempotency.py::test_duplicate_while_in_progress_raises",
        guards={
            "dynamodb": "ddb-idempotency-claim-only-if-free",
            "redis": "redis-idempotency-claim-only-if-free",
            "mongo": "mongo-write-only-if-free",
        },
    ),
    "idempotency-complete-own-claim": Rule(
        "idempotency",
        "a call whose claim was taken over cannot complete or release the claim that took its key",
        "test_idempotency_takeover.py::"
        "test_a_late_call_cannot_complete_or_release_the_claim_that_took_its_key",
        guards={
            "dynamodb": "ddb-idempotency-complete-own-claim",
            "redis": "redis-idempotency-complete-own-claim",
            "mongo": "mongo-idempotency-complete-own-claim",
        },
    ),
    "join-member-once": Rule(
        "counters",
        "a join counts each member once and completes once, after all of them",
        "test_counters.py::test_join_completes_only_after_all_members_and_fires_once",
        guards={
            "dynamodb": "ddb-join-member-once",
            "redis": "redis-join-member-once",
            "mongo": "mongo-join-member-once",
        },
    ),
}


@cache
def _collected() -> dict[str, list[tuple[str, ...]]]:
    """``file::function`` (under tests/contract/) -> the parameter ids of each of its
    collected tests, as pytest makes them (``moto-claim_many`` -> ("moto", "claim_many"))."""
    files = sorted({"tests/contract/" + rule.test.split("::")[0] for rule in RULES.values()})
    listing = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert listing.returncode == 0, listing.stdout[-3000:] + listing.stderr[-3000:]
    ids: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for line in listing.stdout.splitlines():
        if not line.startswith("tests/contract/") or "::" not in line:
            continue
        node, _, params = line.partition("[")
        ids[node.removeprefix("tests/contract/")].append(tuple(params.rstrip("]").split("-")))
    return ids


def _skips_at_run_time(test: str) -> set[str]:
    """What in the body of ``test`` (``file::function``) may skip it after collection: calls
    of ``pytest.skip`` / ``needs_atomic_store`` (a collected id is no proof for those)."""
    file, _, name = test.partition("::")
    tree = ast.parse((ROOT / "tests" / "contract" / file).read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            for call in ast.walk(node):
                if isinstance(call, ast.Call):
                    func = call.func
                    called = (
                        func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    )
                    if called in {"skip", "importorskip", "needs_atomic_store"}:
                        found.add(called)
    return found


@pytest.mark.parametrize("name", RULES)
def test_each_rule_runs_on_every_backend_and_path(name: str) -> None:
    rule = RULES[name]
    runs = _collected().get(rule.test)
    assert runs, f"{name}: no test {rule.test} collected"
    skips = _skips_at_run_time(rule.test)
    assert not skips, f"{name}: {rule.test} may skip after collection ({sorted(skips)})"
    missing = [
        f"{backend}{'/' + path if path else ''}"
        for backend in CONTRACT_BACKENDS
        if backend not in rule.not_on
        for path in rule.paths or ("",)
        if not any(backend in params and (not path or path in params) for params in runs)
    ]
    assert not missing, f"{name}: {rule.test} does not run on {missing}"


@pytest.mark.parametrize("name", RULES)
def test_each_rule_has_a_guard_per_backend(name: str) -> None:
    rule = RULES[name]
    guards = {guard.id: guard for guard in load()}
    for backend, guard_id in rule.guards.items():
        assert guard_id in guards, f"{name}: no guard {guard_id} in tests/mutations"
        assert guards[guard_id].backend == backend, f"{name}: {guard_id} is not {backend}'s"
    if "all" not in rule.guards and set(GUARD_BACKENDS) - set(rule.guards):
        assert rule.unguarded, f"{name}: no guard for {set(GUARD_BACKENDS) - set(rule.guards)}"


def _docs_section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    assert DOCS_SECTION in text, f"docs/guarantees.md has no {DOCS_SECTION!r}"
    section = text.split(DOCS_SECTION, 1)[1]
    return section.split("\n#", 1)[0]


@pytest.mark.parametrize("name", RULES)
def test_each_rule_is_listed_in_the_guarantees(name: str) -> None:
    rule = RULES[name]
    section = _docs_section()
    function = rule.test.split("::")[1]
    assert f"`{name}`" in section, f"docs/guarantees.md does not list the rule {name}"
    assert function in section, f"docs/guarantees.md does not name {function} for {name}"
    for guard_id in rule.guards.values():
        assert guard_id in section, f"docs/guarantees.md does not name {guard_id} for {name}"


def test_the_docs_list_no_rule_that_is_gone() -> None:
    listed = {
        line.split("`")[1]
        for line in _docs_section().splitlines()
        if line.startswith("| `") and line.count("`") >= 2
    }
    assert listed <= set(RULES), listed - set(RULES)


def test_collected_ids_carry_their_parameters() -> None:
    """The check reads the ids pytest makes; a parametrized contract test carries its backend."""
    runs = _collected()[RULES["outbox-claim-due"].test]
    assert ("moto", "claim") in runs and ("mongo", "claim_many") in runs, runs
    assert Path(DOCS).is_file()
