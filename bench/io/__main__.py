"""`python -m bench.io`: measures (bench/io/__init__.py), then writes bench/IO.md (bench/io/report.py)."""

from __future__ import annotations

import argparse

import bench.io
from bench import harness
from bench.io import FULL, QUICK, measure
from bench.io.report import render


def main(argv: list[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--only", default="abcd", metavar="LETTERS", help="run only these variants (e.g. ab)")

    quick = f"{QUICK.items} items instead of {FULL.items}"
    args = harness.arguments("bench.io", bench.io.__doc__, "IO.md", quick, argv, options)
    harness.run_bench(args, measure, render, workers=())
    return 0


raise SystemExit(main())
