"""`python -m bench.llm`: measures (bench/llm/__init__.py), then writes bench/LLM.md (bench/llm/report.py)."""

from __future__ import annotations

import argparse

import bench.llm
from bench import harness
from bench.llm import FULL, QUICK, measure
from bench.llm.report import render


def main(argv: list[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--only", default="ab", metavar="LETTERS", help="run only these variants (e.g. a)")

    quick = f"{QUICK.items} items at {QUICK.quota} tokens/min instead of {FULL.items} at {FULL.quota}"
    args = harness.arguments("bench.llm", bench.llm.__doc__, "LLM.md", quick, argv, options)
    harness.run_bench(args, measure, render, workers=())
    return 0


raise SystemExit(main())
