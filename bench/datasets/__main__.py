"""`python -m bench.datasets`: measures (bench/datasets/__init__.py), then writes bench/DATASETS.md
(bench/datasets/report.py)."""

from __future__ import annotations

import argparse

import bench.datasets
from bench import harness
from bench.datasets import QUICK, measure
from bench.datasets.report import report


def main(argv: list[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--chunk-size", type=int, action="append", default=[], metavar="N",
            help="also a job of the small size with this --chunk-size (repeatable)",
        )  # fmt: skip
        parser.add_argument("--small-only", action="store_true", help="no job of the large size")

    doc = bench.datasets.__doc__
    args = harness.arguments("bench.datasets", doc, "DATASETS.md", f"small sizes: {QUICK}", argv, options)
    harness.run_bench(args, measure, report, needed=("chordflow.dataset_chunk",))
    return 0


raise SystemExit(main())
