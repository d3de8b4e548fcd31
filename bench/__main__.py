"""``python -m bench [--scale full|tiny] [--out DIR] [--only SECTION ...] [--beside REV]``"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from . import FULL, RESULTS_DIR, SECTIONS, TINY, run_all
from .report import summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--scale", choices=("full", "tiny"), default="full")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where REPORT.md goes")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument(
        "--samples", type=int, default=None, help="timed samples per side (overhead, peers)"
    )
    parser.add_argument(
        "--beside",
        default="HEAD",
        metavar="REVISION",
        help="set this run beside the results committed at this git revision (default HEAD), "
        "e.g. the last run of the previous design",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # the peers log every lock at INFO; keep the console to the bench's own progress
    for noisy in ("python_dynamodb_lock", "aws_lambda_powertools", "botocore", "pybreaker"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # the bench makes events fail and breakers trip on purpose; errors land in the report
    logging.getLogger("dynacoord").setLevel(logging.CRITICAL)
    command = "python -m bench" + ("" if args.scale == "full" else f" --scale {args.scale}")
    if args.only != list(SECTIONS):
        command += " --only " + " ".join(args.only)
    scale = FULL if args.scale == "full" else TINY
    if args.samples is not None:
        if args.samples < 2:
            parser.error("--samples must be at least 2")
        scale = dataclasses.replace(scale, samples=args.samples, peer_samples=args.samples)
        command += f" --samples {args.samples}"
    if args.beside != "HEAD":
        command += f" --beside {args.beside}"
    results = run_all(
        scale,
        out_dir=args.out,
        sections=args.only,
        command="make bench" if command == "python -m bench" else command,
        beside=args.beside,
    )
    failed = [k for k, v in results["sections"].items() if v.get("status") == "error"]
    print("\n".join(summary(results)))
    print(f"\nreport: {args.out / 'REPORT.md'} ({results['meta']['duration_s']} s)")
    if failed:
        print(f"sections with errors: {', '.join(failed)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
