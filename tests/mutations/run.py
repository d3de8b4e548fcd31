"""``make mutate``: break each listed guard on purpose and check that its tests fail.

A guard is a condition that keeps a promise (one lock holder, one count per write, an ordered
group's order, a lease's ownership, a breaker's trip, the table check on first use). The list,
``guards.toml`` beside this file (and ``guards.d/*.toml``), names for each one the file, the exact text replaced, the
replacement and the tests that must catch it. For each entry this script:

1. writes the mutant into a private copy of the tree (never into the working tree: other people
   may be editing it; the copy is made once per run, and every mutant is undone in the copy in a
   ``finally`` before the next one is applied);
2. runs only that entry's tests there, with ``CI=true`` (a missing server fails, never skips):
   ``python -m pytest -x -q -p no:cacheprovider <tests> [-k <k>]``;
3. counts the mutant *killed* when pytest reports failed tests (exit 1), *survived* when they
   pass, and *broken* for anything else (the find text is gone, no test ran, collection failed):
   a broken entry must be fixed like a survivor.

It exits non-zero listing every survivor and broken entry. Usage::

    python -m tests.mutations.run                 # every entry, on a copy of the working tree
    python -m tests.mutations.run --ref HEAD      # on a commit (plus untracked files under tests/)
    python -m tests.mutations.run --only ID ...   # some entries
    python -m tests.mutations.run --baseline      # the entries' tests without mutants (must pass)
    python -m tests.mutations.run --list
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser from PyPI
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
GUARDS = Path(__file__).with_name("guards.toml")
#: what the copy of the tree leaves out (caches, the virtualenv, version control)
_IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    ".cache",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".hypothesis",
    "build",
    "*.egg-info",
)


@dataclass(frozen=True)
class Guard:
    id: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    guarantee: str
    backend: str
    k: str | None = None


def guard_files(path: Path) -> list[Path]:
    """``path`` and, beside it, every ``guards.d/*.toml`` (one file per topic, so that work on
    separate primitives does not edit one list)."""
    return [path, *sorted(path.with_name("guards.d").glob("*.toml"))]


def load(path: Path = GUARDS) -> list[Guard]:
    """The entries of ``guards.toml`` and ``guards.d/*.toml``, checked for shape (not for their
    text: see tests/test_mutation_guards.py)."""
    raws: list[dict[str, Any]] = []
    for each in guard_files(path):
        raws.extend(tomllib.loads(each.read_text(encoding="utf-8")).get("guard", []))
    guards = []
    for raw in raws:
        unknown = set(raw) - {"id", "file", "find", "replace", "tests", "guarantee", "backend", "k"}
        if unknown:
            raise ValueError(f"guard {raw.get('id')!r}: unknown fields {sorted(unknown)}")
        guards.append(
            Guard(
                id=raw["id"],
                file=raw["file"],
                find=raw["find"],
                replace=raw["replace"],
                tests=tuple(raw["tests"]),
                guarantee=raw["guarantee"],
                backend=raw["backend"],
                k=raw.get("k"),
            )
        )
    ids = [g.id for g in guards]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate guard ids: {duplicates}")
    return guards


def _copy_tree(dest: Path, ref: str | None) -> None:
    """The working tree (or commit ``ref`` plus the untracked files under tests/) into ``dest``."""
    if ref is None:
        shutil.copytree(ROOT, dest, ignore=_IGNORED, symlinks=True, dirs_exist_ok=True)
        return
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    untracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "--others", "--exclude-standard", "--", "tests"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    for name in untracked:
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)


def _environment(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["CI"] = "true"
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a mutant's bytecode must never be reused
    env["PYTHONPATH"] = str(tree)  # the copy's dynacoord, not the editable install's
    # the copy has no .cache: use the checkout's DynamoDB Local (`make dynamodb-local`)
    env.setdefault("DYNAMODB_LOCAL_DIR", str(ROOT / ".cache" / "dynamodb-local"))
    return env


def _pytest(tree: Path, guard: Guard, env: dict[str, str]) -> tuple[int, str]:
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    command += list(guard.tests)
    if guard.k:
        command += ["-k", guard.k]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=False)
    return done.returncode, done.stdout + done.stderr


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines()[-lines:])


def run(guards: list[Guard], tree: Path, *, baseline: bool, verbose: bool) -> list[str]:
    """Run every guard in ``tree``; the problems (survivors, broken entries)."""
    env = _environment(tree)
    problems: list[str] = []
    killed = 0
    started = time.monotonic()
    for number, guard in enumerate(guards, 1):
        path = tree / guard.file
        original = path.read_text(encoding="utf-8")
        count = original.count(guard.find)
        label = f"[{number}/{len(guards)}] {guard.id}"
        if count != 1:
            problems.append(
                f"{guard.id}: broken: its find text occurs {count} times in {guard.file}"
            )
            print(f"{label}: BROKEN (find text occurs {count} times)", flush=True)
            continue
        t0 = time.monotonic()
        try:
            if not baseline:
                path.write_text(original.replace(guard.find, guard.replace), encoding="utf-8")
            code, output = _pytest(tree, guard, env)
        finally:
            path.write_text(original, encoding="utf-8")
        took = time.monotonic() - t0
        if baseline:
            status = "passes" if code == 0 else f"FAILS (exit {code})"
            if code != 0:
                problems.append(f"{guard.id}: its tests fail without the mutant (exit {code})")
        elif code == 1:
            status = "killed"
            killed += 1
        elif code == 0:
            status = "SURVIVED"
            problems.append(f"{guard.id}: survived ({guard.file}: {guard.guarantee})")
        else:
            status = f"BROKEN (pytest exit {code})"
            problems.append(f"{guard.id}: broken: pytest exit {code} (no test failed)")
        print(f"{label}: {status} in {took:.1f}s", flush=True)
        if verbose or status not in ("killed", "passes"):
            print(_tail(output), flush=True)
    total = time.monotonic() - started
    if baseline:
        print(f"baseline: {len(guards) - len(problems)} of {len(guards)} passed in {total:.0f}s")
    else:
        print(f"mutate: {killed} of {len(guards)} mutants killed in {total:.0f}s")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these entries")
    parser.add_argument("--backend", help="run only the entries of this backend")
    parser.add_argument("--ref", help="a commit to copy instead of the working tree")
    parser.add_argument("--baseline", action="store_true", help="run the tests without mutants")
    parser.add_argument("--list", action="store_true", help="list the entries and stop")
    parser.add_argument("--guards", type=Path, help="another list (default: the copied tree's)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every pytest tail")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dynacoord-mutate-") as tmp:
        tree = Path(tmp) / "tree"
        if not args.list:
            _copy_tree(tree, args.ref)
        # the list of the tree that runs (with --ref, the commit's own list)
        default = tree / GUARDS.relative_to(ROOT) if not args.list else GUARDS
        guards = _select(parser, args, load(args.guards or default))
        if guards is None:
            return 0
        problems = run(guards, tree, baseline=args.baseline, verbose=args.verbose)
    if problems:
        print("\n" + "\n".join(f"  {p}" for p in problems), file=sys.stderr)
        return 1
    return 0


def _select(
    parser: argparse.ArgumentParser, args: argparse.Namespace, guards: list[Guard]
) -> list[Guard] | None:
    """The entries chosen by ``--only`` and ``--backend``; None when ``--list`` printed them."""
    if args.only:
        unknown = set(args.only) - {g.id for g in guards}
        if unknown:
            parser.error(f"no such guard: {', '.join(sorted(unknown))}")
        guards = [g for g in guards if g.id in args.only]
    if args.backend:
        guards = [g for g in guards if g.backend == args.backend]
    if args.list:
        for guard in guards:
            print(f"{guard.id:40} {guard.backend:9} {guard.file}: {guard.guarantee}")
        return None
    return guards


if __name__ == "__main__":
    sys.exit(main())
