"""The baseline of bench/llm.py: what a user writes by hand to ask a model once per item with Celery.

A Celery app of its own (nothing of chordflow) on the bench's Redis (`CHORDFLOW_BROKER_URL`, its own queue),
msgpack for tasks and results, every other setting Celery's default: prefetch multiplier 4, `acks_late` off (a
task is acknowledged as it starts), the Redis transport's visibility timeout of one hour. One task asks the model
for each prompt of its chunk through the official `openai` client, one client per process with its own default
retries (2, waiting what Retry-After says). Workers: `celery -A bench.llm_tasks worker -P solo -Q llm-bench`.

Its client, `python -m bench.llm_tasks --items N --chunk C --workers W`, sends a `group` of N/C tasks and calls
`GroupResult.get()` once every task is ready. A task lost with a killed worker is never ready: the group is given
up on once its queue is empty and all W workers answer `inspect` with nothing active or reserved (a solo worker
busy with a task, or waiting out a 429 inside the client, answers nothing), twice in a row. It prints one JSON
line: items answered, chunks failed (and why), chunks never finished, and when the last task finished.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter

import openai
from celery import Celery, group

QUEUE = "llm-bench"
ASK = "llm_bench.ask"
MODEL = "gpt-bench"
BROKER = os.environ.get("CHORDFLOW_BROKER_URL", "redis://127.0.0.1:6379/0")

app = Celery("llm_bench", broker=BROKER, backend=BROKER)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="msgpack",
    result_serializer="msgpack",
    accept_content=["msgpack"],
    broker_connection_retry_on_startup=True,
    result_expires=3600,
)

_client: openai.OpenAI | None = None


def client() -> openai.OpenAI:
    """One client per process (OPENAI_BASE_URL, OPENAI_API_KEY from the environment), made at first use."""
    global _client
    if _client is None:
        _client = openai.OpenAI()
    return _client


@app.task(name=ASK)
def ask(prompts: list[str]) -> list[int]:
    """The tokens each prompt's answer cost; a call that still fails after the client's retries fails the chunk."""
    used = []
    for prompt in prompts:
        answer = client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])
        used.append(answer.usage.total_tokens if answer.usage else 0)
    return used


def prompt(i: int) -> str:
    return f"summarize item {i}"


def stranded(workers: int) -> bool:
    """Nothing left to run the group's unfinished tasks: the queue is empty and every worker says it is idle."""
    with app.connection_for_read() as connection:
        if connection.default_channel.client.llen(QUEUE):
            return False
    inspect = app.control.inspect(timeout=1.0)
    active, reserved = inspect.active() or {}, inspect.reserved() or {}
    replied = len(active) >= workers and len(reserved) >= workers
    return replied and not any(active.values()) and not any(reserved.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llm_tasks", description="the hand-written baseline")
    parser.add_argument("--items", type=int, required=True)
    parser.add_argument("--chunk", type=int, required=True)
    parser.add_argument("--workers", type=int, default=2, help="workers that must all be idle to give up")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait in all")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    chunks = [[prompt(i) for i in range(s, min(s + args.chunk, args.items))] for s in range(0, args.items, args.chunk)]
    result = group(ask.s(chunk) for chunk in chunks).apply_async()
    done, last, idle = 0, time.perf_counter(), 0
    while not result.ready() and idle < 2 and time.perf_counter() - t0 < args.timeout:
        time.sleep(1.0)
        if (now := sum(r.ready() for r in result.results)) > done:
            done, last = now, time.perf_counter()
        idle = idle + 1 if stranded(args.workers) else 0
    finished = result.ready()
    if finished:
        last = time.perf_counter()
        outcomes = result.get(propagate=False)
    else:
        outcomes = [r.result if r.ready() else None for r in result.results]
    answered = sum(len(o) for o in outcomes if isinstance(o, list))
    failed = Counter(type(o).__name__ for o in outcomes if isinstance(o, BaseException))
    failed_items = sum(len(c) for c, o in zip(chunks, outcomes, strict=True) if isinstance(o, BaseException))
    lost = [i for i, r in enumerate(result.results) if not r.ready()]
    report = {
        "items": args.items, "chunks": len(chunks), "answered": answered, "failed_chunks": dict(failed),
        "failed_items": failed_items, "lost_chunks": len(lost), "lost_items": sum(len(chunks[i]) for i in lost),
        "finished": finished, "last_done": last - t0, "gave_up": time.perf_counter() - t0,
    }  # fmt: skip
    result.forget()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
