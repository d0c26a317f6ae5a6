"""`python -m bench.llm`: an LLM batch against a provider's tokens-per-minute quota, a worker SIGKILLed half-way.

The provider (tests/support/llm_server.py, served from this process): the OpenAI chat-completions protocol, 20 ms
per answer, answers of 20-180 words (one word, one token) chosen by a digest of the prompt, so no client knows an
item's cost before its answer; a quota of QUOTA tokens over a sliding minute, above which it answers 429 with
Retry-After (the seconds until enough of the minute's tokens age out). The ideal time is total tokens / quota.

Two variants on the bench's own redis-server (bench/harness.py), each with two solo workers of its own and a
fresh provider (its counters start at zero); when half the items have been billed, one worker is SIGKILLed and
started again at once (the same name):

a. chordflow: 2 x `celery -A worker.app worker -P solo` (the harness's workers), one `llm` batch node
   (`openai/gpt-bench`, `parallel`, `max_concurrent` 8) declaring `rate_limit` {key, tokens_per_minute: QUOTA};
   `chordflow submit` + `chordflow wait`.
b. what a user writes by hand (bench/llm_tasks.py): a Celery app of its own, one task per chunk of CHUNK items
   calling the official `openai` client, a `group`, `GroupResult.get()`, 2 x `celery worker -P solo`.

Writes bench/LLM.md (or --out).

Internal modules it uses beyond the public API: `scheduler.localcluster`.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench import harness
from bench.harness import BenchCluster, Child, Session, log
from bench.llm_tasks import MODEL, QUEUE, prompt
from scheduler.localcluster import ManagedProcess
from tests.support import llm_server
from tests.support.llm_server import Provider

LATENCY = 0.02  # seconds per answer
SHORTEST, LONGEST = 20, 180  # words in an answer
KEY = "bench-llm"
MAX_CONCURRENT = 8
CHUNK = 20  # items per task of the hand-written group
NODE = "ask"
SUCCEEDED = "succeeded"
TARGET_BILLED, TARGET_WALL, TARGET_429 = 1.02, 1.2, 1.0


@dataclass(frozen=True)
class Sizes:
    items: int
    quota: int  # tokens per minute


FULL = Sizes(items=2_000, quota=180_000)
QUICK = Sizes(items=300, quota=20_000)


def answer_words(message: str) -> int:
    """An answer's length in words, fixed by its prompt and unknown to any client before the answer."""
    return SHORTEST + int(hashlib.sha256(message.encode()).hexdigest()[:8], 16) % (LONGEST - SHORTEST + 1)


def tokens_needed(items: int) -> int:
    """What the items cost once each: the prompt's words and the answer's ("echo: <prompt>" padded)."""
    return sum(len(prompt(i).split()) + answer_words(prompt(i)) for i in range(items))


def limit_for(sizes: Sizes) -> float:
    """Seconds a variant may take before it is cut off."""
    return 60.0 * 4 * tokens_needed(sizes.items) / sizes.quota + 120


@dataclass
class Row:
    variant: str
    what: str
    items: int
    quota: int
    needed: int  # tokens the items cost, each answered once
    wall: float = 0.0
    answered: int = 0  # items with an answer at the end
    requests: Counter[int] = field(default_factory=Counter)  # by status
    tokens: int = 0  # billed (input + output)
    kill: str = ""
    note: str = ""
    error: str | None = None

    @property
    def ideal(self) -> float:
        return 60.0 * self.needed / self.quota

    @property
    def billed(self) -> int:
        return self.requests[200]

    @property
    def sent(self) -> int:
        return sum(self.requests.values())

    @property
    def throttled_percent(self) -> float:
        return 100.0 * self.requests[429] / self.sent if self.sent else 0.0


@dataclass
class Results:
    sizes: Sizes
    needed: int
    rows: list[Row] = field(default_factory=list)


class Killer:
    """Once the provider has billed `at` requests: SIGKILL worker `name` (its process group) and start it again."""

    def __init__(self, bench: BenchCluster, provider: Provider, name: str, at: int, start: Callable[[], None]):
        self.bench, self.provider, self.name, self.at, self.start = bench, provider, name, at, start
        self.t0 = time.perf_counter()
        self.text = "not reached"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="killer", daemon=True)

    def __enter__(self) -> Killer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=120)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            if len(self.provider.billed()) >= self.at:
                worker = self.bench.cluster.workers.pop(self.name)
                killed_at, billed = time.perf_counter() - self.t0, len(self.provider.billed())
                worker.kill(signal.SIGKILL)
                log(f"SIGKILLed worker {self.name} (pid {worker.pid}) at {killed_at:.1f} s, {billed} requests billed")
                self.start()
                back = time.perf_counter() - self.t0
                self.text = (
                    f"{self.name} (pid {worker.pid}) SIGKILLed at {killed_at:.1f} s ({billed} requests billed), "
                    f"started again, ready at {back:.1f} s"
                )
                return


def fresh_provider(sizes: Sizes) -> Provider:
    return Provider(models={MODEL}, delay=LATENCY, answer_words=answer_words, tokens_per_minute=sizes.quota)


def provider_env(bench: BenchCluster, provider: Provider) -> dict[str, str]:
    """The cluster's env pointing the `openai` client at `provider`, with no offline model."""
    env = {**bench.env, **llm_server.environment(provider)}
    env.pop("CHORDFLOW_LLM_MODEL", None)
    return env


def stop_workers(bench: BenchCluster, names: tuple[str, ...]) -> None:
    for name in names:
        worker = bench.cluster.workers.pop(name, None)
        if worker is not None:
            worker.kill(signal.SIGTERM)


def counted(row: Row, provider: Provider) -> Row:
    with provider.lock:
        row.requests = Counter(status for _, _, status in provider.requests)
    row.tokens = sum(provider.tokens())
    log(
        f"({row.variant}) {row.items} items: {row.wall:.1f} s (ideal {row.ideal:.1f} s), {row.answered} answered, "
        f"{row.billed} billed, {row.throttled_percent:.2f}% 429, {row.tokens} tokens (need {row.needed})"
    )
    return row


# -- a. chordflow ------------------------------------------------------------------------------------------------
def workflow(quota: int) -> dict[str, Any]:
    node = {
        "id": NODE,
        "type": "llm",
        "params": {"prompt": "summarize item ${item}", "model": f"openai/{MODEL}"},
        "batch": {
            "items": "${items}",
            "parallel": True,
            "max_concurrent": MAX_CONCURRENT,
            "error_handling": "continue",
        },
        "rate_limit": {"key": KEY, "tokens_per_minute": quota},
    }
    inputs = {"items": {"description": "item numbers", "required": True}}
    return {"ir_version": "0.1.0", "name": "llm_bench", "inputs": inputs, "nodes": [node]}


def chordflow_variant(bench: BenchCluster, sizes: Sizes, needed: int) -> Row:
    what = f"chordflow, rate_limit {sizes.quota:,} tokens/min, 2 x solo workers"
    row = Row("a", what, sizes.items, sizes.quota, needed)
    wf = bench.write("wf-llm.json", json.dumps(workflow(sizes.quota)))
    inputs = bench.write("inputs-llm.json", json.dumps({"items": list(range(sizes.items))}))
    names = ("w1", "w2")
    with llm_server.serving(fresh_provider(sizes)) as provider:
        env = provider_env(bench, provider)

        def cli(*args: str, limit: float = 120) -> Child:
            return harness.run_child([*harness.chordflow(), *args], env, bench.workdir, limit)

        try:
            for name in names:
                bench.cluster.start_worker(name, env=env)
            log(f"(a) workers {', '.join(names)} ready")

            def restart() -> None:
                bench.cluster.start_worker("w2", env=env)

            with Killer(bench, provider, "w2", sizes.items // 2, restart) as killer:
                submit = cli("submit", str(wf), "--inputs-file", str(inputs))
                run_id = submit.last_line()
                waited = cli("wait", run_id, "--timeout", f"{limit_for(sizes):.0f}", limit=limit_for(sizes) + 60)
                row.wall = time.perf_counter() - killer.t0
            row.kill = killer.text
            status = cli("status", run_id, "--json")
            if status.code != 0:
                raise status.failure()
            info = json.loads(status.stdout)
            counts = info.get("batches", {}).get(NODE, {"done": 0, "failed": 0})
            row.answered = int(counts.get("done", 0)) - int(counts.get("failed", 0))
            row.note = f"run {info.get('status')}; submit {submit.seconds:.2f} s, wait {waited.seconds:.1f} s"
            if info.get("status") != SUCCEEDED:
                row.note += f"; {info.get('error')}"
            bench.forget(run_id)
        except Exception as exc:  # the report says what went wrong; the other variant still runs
            row.error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            log(f"(a) failed: {row.error}")
        finally:
            stop_workers(bench, names)
        return counted(row, provider)


# -- b. the hand-written Celery group ----------------------------------------------------------------------------
def celery_worker(name: str) -> list[str]:
    argv = [sys.executable, "-m", "celery", "-A", "bench.llm_tasks", "worker", "-P", "solo", "-Q", QUEUE]
    return [*argv, "-l", "info", "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]


def celery_variant(bench: BenchCluster, sizes: Sizes, needed: int) -> Row:
    what = f"hand-written Celery group, {CHUNK} items a task, openai client retries, 2 x solo workers"
    row = Row("b", what, sizes.items, sizes.quota, needed)
    names = ("c1", "c2")
    with llm_server.serving(fresh_provider(sizes)) as provider:
        env = provider_env(bench, provider)

        def start(name: str) -> None:
            log_file = bench.workdir / f"worker-{name}.log"
            bench.cluster.workers[name] = ManagedProcess(celery_worker(name), log_file, "ready.", env=env)

        try:
            for name in names:
                start(name)
            log(f"(b) workers {', '.join(names)} ready")
            with Killer(bench, provider, "c2", sizes.items // 2, lambda: start("c2")) as killer:
                argv = [sys.executable, "-m", "bench.llm_tasks", "--items", str(sizes.items), "--chunk", str(CHUNK)]
                argv += ["--workers", str(len(names)), "--timeout", f"{limit_for(sizes):.0f}"]
                child = harness.run_child(argv, env, bench.workdir, limit_for(sizes) + 60)
                report = json.loads(child.last_line())
            row.kill = killer.text
            row.answered = report["answered"]
            row.wall = report["last_done"]
            failed = ", ".join(f"{k} x {v}" for k, v in report["failed_chunks"].items()) or "none"
            row.note = (
                f"{report['chunks']} tasks; failed tasks: {failed} ({report['failed_items']} items); "
                f"never finished: {report['lost_chunks']} tasks ({report['lost_items']} items)"
            )
            if not report["finished"]:
                row.note += (
                    f"; `GroupResult.get()` would still be waiting: given up at {report['gave_up']:.1f} s, with "
                    f"the queue empty and both workers idle (the last task finished at {report['last_done']:.1f} s, "
                    "the wall time shown)"
                )
            bench.forget(None, task_results=True)
        except Exception as exc:
            row.error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            log(f"(b) failed: {row.error}")
        finally:
            stop_workers(bench, names)
            bench.redis.delete(QUEUE, "unacked", "unacked_index")
        return counted(row, provider)


def measure(session: Session, bench: BenchCluster) -> Results:
    sizes = QUICK if session.quick else FULL
    needed = tokens_needed(sizes.items)
    results = Results(sizes, needed)
    session.facts["provider"] = (
        f"tests/support/llm_server.py in the bench process: OpenAI protocol, {LATENCY * 1000:g} ms per answer, "
        f"answers of {SHORTEST}-{LONGEST} words, quota {sizes.quota:,} tokens over a sliding minute "
        "(429 + Retry-After above it)"
    )
    if "a" in session.args.only:
        results.rows.append(chordflow_variant(bench, sizes, needed))
        time.sleep(1.0)
    if "b" in session.args.only:
        results.rows.append(celery_variant(bench, sizes, needed))
    return results
