"""`python -m bench.provider_batches`: measures (bench/provider_batches/__init__.py), then writes
bench/PROVIDER_BATCHES.md (bench/provider_batches/report.py)."""

from __future__ import annotations

import bench.provider_batches
from bench import harness
from bench.provider_batches import FULL, QUICK, measure
from bench.provider_batches.report import render


def main(argv: list[str] | None = None) -> int:
    quick = f"{QUICK.items:,} items and a {QUICK.deadline:g} s deadline, not {FULL.items:,} and {FULL.deadline:g} s"
    doc = bench.provider_batches.__doc__ or ""
    args = harness.arguments("bench.provider_batches", doc, "PROVIDER_BATCHES.md", quick, argv)
    harness.run_bench(args, measure, render, workers=())
    return 0


raise SystemExit(main())
