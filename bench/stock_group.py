"""The dataset bench's Celery baseline as a user writes it by hand, with no chordflow code at all.

A plain Celery app of its own (this module): broker and result backend the Redis at STOCK_REDIS_URL, msgpack for
tasks and results, Celery's defaults for everything else (prefetch 4 per process, acks on receipt, no message
signing). Its workers are `celery -A bench.stock_group worker -P solo`. The task runs a chunk of records through
the workflow's two steps as two PocketFlow nodes per record (bench/record_flow.py, json and pocketflow only).

`python -m bench.stock_group FILE OUT`: the client. It reads the whole file (`json.loads` per line), sends a
`group` of one task per CHUNK records, `GroupResult.get()`, writes the rows `chordflow results --out` writes
(a `json.dumps` per row) and prints its phases as one JSON object; the bench checks the file.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from celery import Celery, group

from bench.record_flow import one_record, record_flow

CHUNK = int(os.environ.get("STOCK_CHUNK", 500))  # records per task; the bench also tries chordflow's own size
LIMIT = 1800  # seconds the client waits for the group at most

app = Celery("stock_group", broker=os.environ.get("STOCK_REDIS_URL"), backend=os.environ.get("STOCK_REDIS_URL"))
app.conf.update(task_serializer="msgpack", result_serializer="msgpack", accept_content=["msgpack"])


@app.task(name="records_chunk")  # one name whether this module is imported or run as __main__
def records_chunk(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chunk of records through the two-node flow, results in the chunk's order."""
    flow = record_flow()
    return [one_record(flow, record) for record in records]


def main(path: str, out: str) -> int:
    t0 = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    read = time.perf_counter()
    result = group(records_chunk.s(records[i : i + CHUNK]) for i in range(0, len(records), CHUNK)).apply_async()
    sent = time.perf_counter()
    results = [row for part in result.get(timeout=LIMIT) for row in part]
    got = time.perf_counter()
    with open(out, "w", encoding="utf-8") as rows:
        for i, row in enumerate(results):
            rows.write(json.dumps({"index": i, "result": row, "error": None}) + "\n")
    wrote = time.perf_counter()
    print(json.dumps({"read": read - t0, "send": sent - read, "get": got - sent, "write": wrote - got}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
