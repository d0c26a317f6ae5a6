"""`python -m bench.datasets.chunk_profile [--profile N] [--chunk-size N]`: what a cluster dataset chunk costs a
worker outside Celery's own machinery, in-process.

A job of RECORDS records of the bench workflow submitted to a redis-server of its own with no worker; then the
chunk task's body (`chordflow.dataset_chunk`, called eagerly: `apply`) over each chunk in order, as a worker
runs it (the claim, the run record and its signature check, the records, the record loop, the outcomes, the
next chunk's send, the verdict). Prints CPU ms per chunk and us per record (process time, the whole job, best
of ROUNDS); with `--profile N`, a cProfile of one more job, its N dearest functions by own time.
Findings: bench/PROFILE_DATASETS.md.

Internal modules it uses beyond the public API: `worker.cluster.datasets.tasks`, `worker.cluster.messages`,
`worker.datasets.job`.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from bench.datasets import TEXT, workflow
from bench.harness import BenchCluster
from worker.datasets.job import DEFAULT_CHUNK_SIZE

RECORDS, ROUNDS = 20_000, 3


def job(chunk_size: int) -> tuple[str, int]:
    """A job submitted (its chunks queued for nobody); returns its run id and chunk count."""
    import scheduler

    records = [{"id": i, "text": TEXT} for i in range(RECORDS)]
    run_id = scheduler.submit(workflow(), items=records, as_="record", chunk_size=chunk_size)
    return run_id, -(-RECORDS // chunk_size)


def chunks(run_id: str, count: int) -> None:
    from worker.cluster.datasets.tasks import dataset_chunk
    from worker.cluster.messages import DatasetChunk

    for n in range(count):
        result = dataset_chunk.apply(args=DatasetChunk(run_id, n).to_wire())
        if result.result != "finished":
            raise SystemExit(f"chunk {n}: {result.result!r}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.datasets.chunk_profile", description=__doc__)
    parser.add_argument("--profile", type=int, metavar="N", help="also print a cProfile's N dearest functions")
    parser.add_argument(
        "--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE, metavar="N",
        help=f"records per chunk (default {DEFAULT_CHUNK_SIZE}: a large job's)",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cf-chunk-profile-") as workdir:
        bench = BenchCluster(Path(workdir), workers=())
        try:
            chunks(*job(args.chunk_size))  # warm: compiles and caches, not a chunk's cost
            best, count = None, 0
            for _ in range(ROUNDS):
                run_id, count = job(args.chunk_size)
                began = time.process_time()
                chunks(run_id, count)
                took = time.process_time() - began
                best = took if best is None else min(best, took)
                bench.purge()
            assert best is not None
            print(
                f"{best / count * 1e3:.2f} ms/chunk, {best / RECORDS * 1e6:.1f} us/record "
                f"(CPU, best of {ROUNDS} jobs of {RECORDS:,} records in {count} chunks)"
            )
            if args.profile:
                run_id, count = job(args.chunk_size)
                profile = cProfile.Profile()
                profile.runcall(chunks, run_id, count)
                pstats.Stats(profile).sort_stats("tottime").print_stats(args.profile)
        finally:
            bench.stop()


if __name__ == "__main__":
    main()
