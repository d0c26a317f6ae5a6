"""Variant (c) of bench/io.py: what a user writes by hand to call an API once per item with Celery.

A Celery app of its own (nothing of chordflow: no signing, no retries, Celery's defaults) on the bench's Redis
(`CHORDFLOW_BROKER_URL`, on its own queue), with one plain task doing one `httpx.get` per item. Its workers:
`celery -A bench.io_tasks worker -P threads -c 32 -Q io-bench`. Its client, `python -m bench.io_tasks --base URL
--items N`, sends a `group` of N tasks, waits with `GroupResult.get()` and prints one JSON line: the HTTP
statuses the tasks saw and how many raised.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import httpx
from celery import Celery, group

QUEUE = "io-bench"
FETCH = "io_bench.fetch"
BROKER = os.environ.get("CHORDFLOW_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("io_bench", broker=BROKER, backend=BROKER)
app.conf.update(task_default_queue=QUEUE, broker_connection_retry_on_startup=True, result_expires=3600)


@app.task(name=FETCH)
def fetch(url: str) -> int:
    """One GET; the response's status (what the user checks), a raise when there is no response."""
    response = httpx.get(url, timeout=30)
    return response.status_code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.io_tasks", description="variant (c)'s client")
    parser.add_argument("--base", required=True, help="the API's base URL")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds GroupResult.get() waits")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    result = group(fetch.s(f"{args.base}/item/{i}") for i in range(args.items)).apply_async()
    sent = time.perf_counter()
    outcomes = result.get(timeout=args.timeout, propagate=False)
    done = time.perf_counter()
    statuses = Counter(str(o) for o in outcomes if isinstance(o, int))
    raised = Counter(type(o).__name__ for o in outcomes if not isinstance(o, int))
    result.forget()
    report = {"n": len(outcomes), "statuses": statuses, "raised": raised, "send": sent - t0, "get": done - sent}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
