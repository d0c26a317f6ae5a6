"""`python -m bench.provider_batches`: an `llm` batch answered through the provider's batch API, against the same
batch asked synchronously, and a batch whose provider answers only half the lines by the deadline.

One loopback provider (tests/support/llm_server.py + llm_batches.py), served from this process for the whole bench:
both batch APIs through the official clients, answers of SHORTEST-LONGEST
words fixed by a digest of the prompt, SYNC_DELAY per synchronous answer. Prices (CHORDFLOW_LLM_PRICES, given to
the workers): PRICES, a provider batch's half of them (worker/llm/prices.py's default). Every variant runs the same
`llm` batch node (`openai/gpt-bench`, one distinct prompt per item, `parallel`, `max_concurrent` MAX_CONCURRENT) on
the bench's redis-server and two solo workers (bench/harness.py), through `scheduler.api.submit` + `wait`:

a. `provider_batch` {deadline "1h"}: the provider finishes every line `batch_delay` seconds after the batch is
   created. A real provider takes minutes to hours; the wall time here is the engine's overhead around that delay.
b. no `provider_batch`: every item asked synchronously, at most MAX_CONCURRENT in flight over the cluster (what a
   user runs without provider batches).
c. `provider_batch` with a short deadline: the provider finishes the first half of the lines HALF_FINISH seconds
   after creation and the rest never within the run; at the deadline the batch is cancelled and the rest is asked
   synchronously.

The provider's counters are read before and after each variant (deltas), so the three share one provider.
Writes bench/PROVIDER_BATCHES.md (or --out).

Internal modules it uses beyond the public API: `worker.llm.usage`, `scheduler.localcluster` (restore_env).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.harness import BenchCluster, Session, log
from bench.measure import CpuUse, WorkerLogs
from scheduler import api
from scheduler.localcluster import restore_env
from tests.support import llm_server
from tests.support.llm_server import Provider
from worker.llm.usage import usage_totals

MODEL = "gpt-bench"
WRITTEN = f"openai/{MODEL}"
PRICES = {WRITTEN: {"input": 2.0, "output": 8.0}}  # USD per 1M tokens; a provider batch's: half
BATCH_FRACTION = 0.5
SYNC_DELAY = 0.02  # seconds per synchronous answer
SHORTEST, LONGEST = 20, 180  # words (= tokens) in an answer
MAX_CONCURRENT = 8
NODE = "ask"
PROMPT = "summarize ticket ${item} for the support queue"
HALF_FINISH = 2.0  # (c): seconds after creation at which the first half of the lines finish
NEVER = 10 * 3600.0  # (c): the other half, far past the run
POLL_MIN = 1.0  # worker/nodes/provider_batches.py: the shortest time between two looks at a provider batch
MOST_LINES = 50_000  # OpenAI's most lines in one batch (worker/llm/batch_apis.py LIMITS)
TARGET_COST = 0.55  # (a)'s cost at most this fraction of (b)'s
TAIL_SLACK = 1.5  # (c)'s tail at most this many times (b)'s synchronous time for as many items
TASKS = ("chordflow.run_chunk", "chordflow.aggregate")
WARMUP = 32  # items asked synchronously once, untimed: both workers import the openai client


@dataclass(frozen=True)
class Sizes:
    items: int
    batch_delay: float  # (a): seconds after creation at which every line finishes
    deadline: float  # (c): the provider_batch deadline, seconds


FULL = Sizes(items=10_000, batch_delay=5.0, deadline=20.0)
QUICK = Sizes(items=1_000, batch_delay=3.0, deadline=10.0)


def prompt(index: int) -> str:
    return PROMPT.replace("${item}", str(index))


def answer_words(message: str) -> int:
    """An answer's length in words, fixed by its prompt and unknown to any client before the answer."""
    return SHORTEST + int(hashlib.sha256(message.encode()).hexdigest()[:8], 16) % (LONGEST - SHORTEST + 1)


def expected(index: int) -> str:
    """The answer the loopback provider gives item `index` (llm_server.reply: the echo padded to its length)."""
    text = f"echo: {prompt(index)}"
    return " ".join([text, *["lorem"] * (answer_words(prompt(index)) - len(text.split()))])


def cost(tokens: tuple[int, int], fraction: float = 1.0) -> float:
    """USD of (input, output) tokens at PRICES, times `fraction` (a provider batch's price)."""
    price = PRICES[WRITTEN]
    return (tokens[0] * price["input"] + tokens[1] * price["output"]) / 1e6 * fraction


# -- the provider's counters, read around each variant -----------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """Where the provider's lists and counters stood when a variant started: what it did is what came after."""

    requests: int
    bodies: int
    created: int
    answered: int
    cancels: int
    tokens: tuple[int, int]
    batch_tokens: tuple[int, int]


def mark(provider: Provider) -> Mark:
    with provider.lock:
        return Mark(
            len(provider.requests), len(provider.bodies), len(provider.batches_created), len(provider.batch_answered),
            len(provider.batch_cancels), (provider.input_tokens, provider.output_tokens),
            (provider.batch_input_tokens, provider.batch_output_tokens),
        )  # fmt: skip


@dataclass
class Seen:
    """What the provider did during one variant."""

    sync_status: Counter[int] = field(default_factory=Counter)  # synchronous requests by status
    sync_asked: Counter[str] = field(default_factory=Counter)  # how many times each prompt was asked synchronously
    batches: list[str] = field(default_factory=list)  # ids of the provider batches created
    lines: Counter[tuple[str, str]] = field(default_factory=Counter)  # (batch id, custom_id) answered, how often
    line_status: Counter[int] = field(default_factory=Counter)
    cancels: list[str] = field(default_factory=list)
    tokens: tuple[int, int] = (0, 0)  # synchronous (input, output)
    batch_tokens: tuple[int, int] = (0, 0)
    created_at: float | None = None  # epoch seconds: the first batch's creation, and its cancel
    cancelled_at: float | None = None

    @property
    def batch_lines(self) -> int:
        return self.line_status[200]

    @property
    def twice(self) -> int:
        """Batch lines answered more than once, and prompts asked more than once synchronously."""
        return sum(n > 1 for n in self.lines.values()) + sum(n > 1 for n in self.sync_asked.values())

    def both_ways(self) -> int:
        """Items answered in a provider batch and asked synchronously as well."""
        batched = {prompt(int(custom_id)) for _, custom_id in self.lines}
        return len(batched & set(self.sync_asked))

    @property
    def provider_cost(self) -> float:
        """USD from the provider's own counters: synchronous tokens at the price, batch tokens at half of it."""
        return cost(self.tokens) + cost(self.batch_tokens, BATCH_FRACTION)


def seen_since(provider: Provider, start: Mark) -> Seen:
    with provider.lock:
        seen = Seen(
            sync_status=Counter(status for _, _, status in provider.requests[start.requests :]),
            sync_asked=Counter(
                b["messages"][-1]["content"] for b in provider.bodies[start.bodies :] if b.get("messages")
            ),
            batches=[batch_id for _, batch_id, _, _ in provider.batches_created[start.created :]],
            lines=Counter((batch, custom_id) for _, batch, custom_id, _ in provider.batch_answered[start.answered :]),
            line_status=Counter(status for _, _, _, status in provider.batch_answered[start.answered :]),
            cancels=list(provider.batch_cancels[start.cancels :]),
            tokens=(provider.input_tokens - start.tokens[0], provider.output_tokens - start.tokens[1]),
            batch_tokens=(
                provider.batch_input_tokens - start.batch_tokens[0],
                provider.batch_output_tokens - start.batch_tokens[1],
            ),
        )  # fmt: skip
        if seen.batches:
            job = provider.batch_jobs[seen.batches[0]]
            seen.created_at, seen.cancelled_at = job.created, job.cancelled
    return seen


# -- watching a run's wait ----------------------------------------------------------------------------------------
class Watcher:
    """Polls `status` while a run goes on, for what only the run knows: its provider-batch deadline, and when its
    wait for the provider ended (then its items run)."""

    PERIOD = 0.1

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.deadline: float | None = None
        self.waiting_from: float | None = None  # epoch seconds
        self.waiting_until: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watcher", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.PERIOD):
            try:
                info = api.status(self.run_id)
            except Exception:  # not recorded yet, or the run's keys already gone
                continue
            now = time.time()
            waiting = info.get("waiting") if info.get("status") == "running" else None
            if waiting:
                self.waiting_from = self.waiting_from or now
                self.deadline = waiting.get("deadline") or self.deadline
                self.waiting_until = None
            elif self.waiting_from is not None and self.waiting_until is None:
                self.waiting_until = now


# -- where a run's time went, from the workers' logs ---------------------------------------------------------------
@dataclass
class Steps:
    """The run's advances (epoch when each ended, seconds it took) and when its first chunk of items was received:
    the first advance creates the provider batch, the last before the items keeps the answers, those between look."""

    advances: list[tuple[float, float]] = field(default_factory=list)
    items_from: float | None = None

    @property
    def create(self) -> tuple[float, float] | None:
        return self.advances[0] if self.advances else None

    @property
    def kept(self) -> tuple[float, float] | None:
        before = [a for a in self.advances if self.items_from is None or a[0] <= self.items_from + 0.05]
        return before[-1] if len(before) > 1 else None

    @property
    def looks(self) -> list[tuple[float, float]]:
        create, kept = self.create, self.kept
        return [a for a in self.advances if a is not create and a is not kept and (kept is None or a[0] < kept[0])]


def steps_of(logs: WorkerLogs) -> Steps:
    steps = Steps()
    for at, name, _, secs in logs.entries():
        if name == "chordflow.advance" and secs is not None:
            steps.advances.append((at, secs))
        elif name == "chordflow.run_chunk" and secs is None:
            steps.items_from = at if steps.items_from is None else min(steps.items_from, at)
    steps.advances.sort()
    return steps


# -- the variants --------------------------------------------------------------------------------------------------
@dataclass
class Row:
    variant: str
    what: str
    items: int
    status: str = ""
    answered: int = 0  # items that succeeded
    responses: list[Any] = field(default_factory=list)  # results[i]["response"], in input order
    usage: dict[str, Any] = field(default_factory=dict)  # usage_totals(result.shared)
    seen: Seen = field(default_factory=Seen)
    started: float = 0.0  # epoch seconds, just before submit
    ended: float = 0.0  # epoch seconds, when `wait` returned
    deadline: float | None = None  # (a), (c): the run's provider-batch deadline (epoch seconds)
    waiting_until: float | None = None  # when the run stopped waiting for the provider (its items then ran)
    same_as_expected: bool = False  # every response is the provider's answer to its own prompt, in input order
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds over the run (bench/measure.py CpuUse)
    steps: Steps = field(default_factory=Steps)
    error: str | None = None

    @property
    def wall(self) -> float:
        return self.ended - self.started

    def at(self, when: float | None) -> float | None:
        """Seconds after submit."""
        return None if when is None else when - self.started

    @property
    def cost(self) -> float:
        return float(self.usage.get("cost_usd") or 0.0)


def workflow(deadline: str | float | None) -> dict[str, Any]:
    """The one workflow every variant runs; `deadline`: its `provider_batch` deadline (None: none)."""
    batch: dict[str, Any] = {
        "items": "${items}",
        "parallel": True,
        "max_concurrent": MAX_CONCURRENT,
        "error_handling": "continue",
    }
    if deadline is not None:
        batch["provider_batch"] = {"deadline": deadline}
    node = {"id": NODE, "type": "llm", "params": {"prompt": PROMPT, "model": WRITTEN}, "batch": batch}
    inputs = {"items": {"description": "item numbers", "required": True}}
    return {"ir_version": "0.1.0", "name": "provider_batch_bench", "inputs": inputs, "nodes": [node]}


def run_variant(
    bench: BenchCluster, provider: Provider, logs: WorkerLogs, row: Row, deadline: str | float | None
) -> Row:
    """Submit the workflow, wait for it; read its results, its usage, what the provider saw meanwhile and the
    workers' log lines."""
    limit = 900.0 + (deadline if isinstance(deadline, float) else 0.0)
    start = mark(provider)
    logs.mark()
    run_id = None
    cpu = CpuUse(bench.pids, bench.cluster.redis.pid)
    try:
        with cpu:
            row.started = time.time()
            run_id = api.submit(workflow(deadline), {"items": list(range(row.items))})
            with Watcher(run_id) as watcher:
                done = api.wait(run_id, timeout=limit)
                row.ended = time.time()
        row.cpu = dict(cpu.used)
        row.deadline, row.waiting_until = watcher.deadline, watcher.waiting_until
        row.status = done.status
        outcome = done.shared.get(NODE) or {}
        row.answered = int(outcome.get("success_count") or 0)
        row.responses = [r.get("response") if isinstance(r, dict) else None for r in outcome.get("results") or []]
        row.same_as_expected = row.responses == [expected(i) for i in range(row.items)]
        row.usage = usage_totals(done.shared) or {}
        if done.status != "success":
            row.error = f"run {done.status}: {done.error}"
    except Exception as exc:  # the report says what went wrong; the other variants still run
        row.error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        row.ended = row.ended or time.time()
    finally:
        row.seen = seen_since(provider, start)
        row.steps = steps_of(logs)
        bench.forget(run_id)
    seen = row.seen
    log(
        f"({row.variant}) {row.items:,} items: {row.wall:.1f} s, {row.answered:,} answered, status {row.status}, "
        f"{seen.sync_status[200]:,} sync + {seen.batch_lines:,} batch lines billed, {len(seen.batches)} batches, "
        f"cost ${row.cost:.4f} (provider's counters: ${seen.provider_cost:.4f})"
        + (f"; ERROR {row.error}" if row.error else "")
    )
    return row


@dataclass
class Results:
    sizes: Sizes
    rows: list[Row] = field(default_factory=list)

    def get(self, variant: str) -> Row | None:
        return next((r for r in self.rows if r.variant == variant), None)

    def identical(self) -> bool:
        """Every variant's responses are the same list, in input order, and the provider's answers."""
        lists = [r.responses for r in self.rows]
        return len(lists) == 3 and all(r.same_as_expected for r in self.rows) and all(x == lists[0] for x in lists)


def provider_env(bench: BenchCluster, provider: Provider) -> dict[str, str]:
    """The cluster's env pointing the clients at `provider`, with the price table and no offline model."""
    env = {**bench.env, **llm_server.environment(provider), "CHORDFLOW_LLM_PRICES": json.dumps(PRICES)}
    env.pop("CHORDFLOW_LLM_MODEL", None)
    return env


def warm_up(provider: Provider) -> None:
    """A few items asked synchronously, untimed: both workers load the `openai` client before anything counts."""
    run_id = api.submit(workflow(None), {"items": [f"warm-up {i}" for i in range(WARMUP)]})
    done = api.wait(run_id, timeout=120)
    if done.status != "success":
        raise RuntimeError(f"the warm-up run ended {done.status}: {done.error}")
    log(f"warm-up: {WARMUP} items asked synchronously ({len(provider.billed())} billed so far)")


def measure(session: Session, bench: BenchCluster) -> Results:
    sizes = QUICK if session.quick else FULL
    results = Results(sizes)
    session.facts["provider"] = (
        f"tests/support/llm_server.py + llm_batches.py in the bench process, one for the whole bench: OpenAI protocol "
        f"(`/v1/chat/completions`, `/v1/files` + `/v1/batches`), TCP_NODELAY, {SYNC_DELAY * 1000:g} ms per synchronous "
        f"answer, answers of {SHORTEST}-{LONGEST} words (1 word = 1 token)"
    )
    session.facts["prices"] = f"CHORDFLOW_LLM_PRICES={json.dumps(PRICES)} (batch: x{BATCH_FRACTION})"
    provider = Provider(models={MODEL}, delay=SYNC_DELAY, answer_words=answer_words)
    names = ("w1", "w2")
    with llm_server.serving(provider):
        env = provider_env(bench, provider)
        mine = {**llm_server.environment(provider), "CHORDFLOW_LLM_MODEL": None}  # submit checks the model's key
        previous = {name: os.environ.get(name) for name in mine}
        restore_env(mine)
        try:
            for name in names:
                worker = bench.cluster.start_worker(name, env=env)
                log(f"worker {name} (pid {worker.pid}) ready")
            bench.processes = bench.check(TASKS)
            logs = WorkerLogs([bench.workdir / f"worker-{name}.log" for name in names])
            session.facts.update(bench.facts())
            warm_up(provider)
            n = sizes.items
            provider.batch_delay, provider.batch_finish = sizes.batch_delay, None
            what = f'provider_batch {{deadline "1h"}}, every line answered {sizes.batch_delay:g} s after creation'
            results.rows.append(run_variant(bench, provider, logs, Row("a", what, n), "1h"))
            what = f"synchronous, parallel, max_concurrent {MAX_CONCURRENT}, {SYNC_DELAY * 1000:g} ms an answer"
            results.rows.append(run_variant(bench, provider, logs, Row("b", what, n), None))
            half = n // 2
            provider.batch_finish = lambda position: HALF_FINISH if position < half else NEVER
            what = (
                f"provider_batch {{deadline {sizes.deadline:g} s}}, lines < {half:,} answered {HALF_FINISH:g} s after "
                "creation, the rest never"
            )
            results.rows.append(run_variant(bench, provider, logs, Row("c", what, n), sizes.deadline))
        finally:
            restore_env(previous)
            for name in names:
                worker = bench.cluster.workers.pop(name, None)
                if worker is not None:
                    worker.kill(signal.SIGTERM)
    return results
