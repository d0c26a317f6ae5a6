"""`python -m bench.record_profile [--profile N]`: what one dataset record costs inside a chunk, in-process.

The bench workflow of bench/DATASETS.md (two `echo` nodes per record) run as a worker's chunk runs it —
`worker.datasets.chunks.run_chunk` over an executor of the per-record `workflow` node — on 40 chunks of 500
records, no store and no Redis: the per-record engine cost alone. Prints CPU us/record (process time, best of
three); with `--profile N`, a cProfile of one more pass, its N dearest functions by own time.
Findings: bench/PROFILE_DATASETS.md.

Internal modules it uses beyond the public API: `worker.batch.executor`, `worker.batch.middleware`,
`worker.datasets.job`, `worker.engine.build`.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from bench.datasets import workflow
from worker.batch.executor import ItemExecutor
from worker.batch.middleware import item_middleware
from worker.datasets.chunks import run_chunk
from worker.datasets.job import RECORDS, Dataset
from worker.engine.build import item_chain

CHUNK, CHUNKS = 500, 40


def records_pass(executor: ItemExecutor, records: list[dict]) -> None:
    for n in range(CHUNKS):
        chunk = run_chunk(executor, records, {}, n * CHUNK, None, lambda count: item_middleware(RECORDS, 0, False))
        if chunk.failures:
            raise SystemExit(f"record {chunk.failures[0].index} failed: {chunk.failures[0].error}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.record_profile", description=__doc__)
    parser.add_argument("--profile", type=int, metavar="N", help="also print a cProfile's N dearest functions")
    args = parser.parse_args()
    spec = Dataset().record_spec(workflow())
    executor = ItemExecutor(spec, item_chain(spec), {})
    records = [{"id": i, "text": "some short text"} for i in range(CHUNK)]
    records_pass(executor, records)  # compiles and caches: not a record's cost
    best = min(_timed(executor, records) for _ in range(3))
    print(f"{best / (CHUNK * CHUNKS) * 1e6:.1f} us/record (CPU, best of 3 passes of {CHUNK * CHUNKS:,} records)")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(records_pass, executor, records)
        pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)


def _timed(executor: ItemExecutor, records: list[dict]) -> float:
    began = time.process_time()
    records_pass(executor, records)
    return time.process_time() - began


if __name__ == "__main__":
    main()
