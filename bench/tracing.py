"""`python -m bench.tracing`: what OpenTelemetry tracing costs, on against off, in alternating rounds of one run.

Each round runs the same job twice, once in processes started without the OTEL variables (off: nothing traced, the
tracing SDK never imported) and once in processes started with them (on: OTEL_EXPORTER_OTLP_ENDPOINT pointing at a
loopback OTLP/HTTP receiver in this process, CHORDFLOW_TRACE_ITEMS at its default 0.01); which goes first alternates.

- cluster no-op batch: `chordflow submit WF --inputs-file F` + `chordflow wait RUN` of a `noop` batch of N items on
  the bench's two solo workers (bench/harness.py), both commands and both workers traced or not. The workers are
  started again for each side of each round (not timed), so each side's workers run only its own setting.
- local no-op batch: `chordflow run WF --inputs-file F` of the same batch, in one process.
- cluster LLM batch: M `llm` items (`openai/gpt-bench`, one prompt each, `parallel`, `max_concurrent` 8) against
  the loopback provider (tests/support/llm_server.py) answering in LLM_DELAY, through the official client.

The receiver (tests/support/otlp.py) decodes what it is sent, as a collector would, and counts the spans: it
shares the 2 cores with the workers, as a collector on the same host would. Wall time is each job's from the first
command's start to the last one's end, CPU is that of every process of the job (the commands', and both workers'
from ready to EXPORTED after the end: their last export counts); the ratio is on / off per round, and the median
of the rounds is judged (goal for the no-op batch: <= 1.05; it runs JUDGED_ROUNDS rounds, the others ROUNDS).

Internal modules it uses beyond the public API: none (its cluster is bench/harness.py's).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import BenchCluster, Session, log, table, verdict
from tests.support import llm_server, otlp
from tests.support.llm_server import Provider

ITEMS, QUICK_ITEMS = 100_000, 10_000
LLM_ITEMS, QUICK_LLM_ITEMS = 2_000, 300
ROUNDS, QUICK_ROUNDS = 5, 2
#: Rounds of the judged job, the cluster no-op batch: its wall time on a shared 2-core machine moves by 10-20% from
#: one round to the next, so its median needs more of them than the 5% it is judged against.
JUDGED_ROUNDS = 9
LLM_DELAY = 0.005
GOAL = 1.05
#: Seconds the workers are given after the run's end before their CPU is read: a traced worker exports what it
#: still holds within OTEL_BSP_SCHEDULE_DELAY (100 ms), and that export is part of what tracing costs.
EXPORTED = 0.5
PROCESSES = ("run", "submit", "wait", "workers")  # whose CPU the split table shows
NOOP = {"nodes": [{"id": "b", "type": "noop", "batch": {"items": "${items}"}}]}
MODEL = "gpt-bench"
LLM = {
    "nodes": [{
        "id": "ask", "type": "llm", "params": {"prompt": "${item}", "model": f"openai/{MODEL}"},
        "batch": {"items": "${items}", "parallel": True, "max_concurrent": 8},
    }],
}  # fmt: skip


@dataclass
class Job:
    name: str
    where: str  # "cluster" or "local"
    workflow: dict[str, Any]
    items: list[str]
    seconds: dict[str, list[float]] = field(default_factory=lambda: {"off": [], "on": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"off": [], "on": []})  # the job's processes
    parts: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"off": [], "on": []})  # CPU by process
    walls: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {"off": [], "on": []})  # by command
    spans: list[int] = field(default_factory=list)  # received per traced run

    def ratios(self, what: str = "seconds") -> list[float]:
        pairs = getattr(self, what)
        return [on / off for off, on in zip(pairs["off"], pairs["on"], strict=True)]


def measure(session: Session, bench: BenchCluster) -> list[Job]:
    n, m = (QUICK_ITEMS, QUICK_LLM_ITEMS) if session.quick else (ITEMS, LLM_ITEMS)
    rounds = QUICK_ROUNDS if session.quick else ROUNDS
    jobs = [
        Job(f"no-op batch of {n:,} items, cluster (`submit` + `wait`)", "cluster", NOOP, [str(i) for i in range(n)]),
        Job(f"no-op batch of {n:,} items, local (`run`)", "local", NOOP, [str(i) for i in range(n)]),
        Job(
            f"llm batch of {m:,} items, cluster (`submit` + `wait`)", "cluster", LLM, [f"ticket {i}" for i in range(m)]
        ),
    ]
    provider = Provider(models={MODEL}, delay=LLM_DELAY)
    with otlp.receiving() as receiver, llm_server.serving(provider):
        base = {**bench.env, **llm_server.environment(provider)}
        base.pop("CHORDFLOW_LLM_MODEL", None)
        sides = {"off": base, "on": {**base, **otlp.environment(receiver)}}
        session.facts["tracing on"] = ", ".join(f"{k}={v}" for k, v in otlp.environment(receiver).items())
        for number, job in enumerate(jobs):
            workflow = bench.write(f"wf-{number}.json", json.dumps(job.workflow))
            inputs = bench.write(f"inputs-{number}.json", json.dumps({"items": job.items}))
            count = JUDGED_ROUNDS if number == 0 and not session.quick else rounds
            for r in range(count + 1):  # round 0 warms up (imports, the client's first connection), untimed
                order = ("off", "on") if r % 2 else ("on", "off")
                for side in order:
                    before = len(receiver.spans)
                    seconds, parts, walls = run_job(bench, job, sides[side], str(workflow), str(inputs))
                    cpu = sum(parts.values())
                    if r:
                        job.seconds[side].append(seconds)
                        job.cpu[side].append(cpu)
                        job.parts[side].append(parts)
                        job.walls[side].append(walls)
                        if side == "on":
                            job.spans.append(receiver_count(receiver, before))
                    log(f"{job.name}, round {r}, tracing {side}: {seconds:.2f} s, {cpu:.2f} s of CPU")
    return jobs


def receiver_count(receiver: otlp.Receiver, before: int) -> int:
    """Spans received since `before`, once the exports of the run's processes have arrived (their last export is
    at most a schedule delay after the run ends: the count is read when it stops growing)."""
    seen, steady = -1, time.monotonic()
    while time.monotonic() - steady < 1.0:
        now = len(receiver.spans)
        if now != seen:
            seen, steady = now, time.monotonic()
        time.sleep(0.1)
    return seen - before


def run_job(
    bench: BenchCluster, job: Job, env: dict[str, str], workflow: str, inputs: str
) -> tuple[float, dict[str, float], dict[str, float]]:
    """One run of `job` with `env`, on the bench's cluster with workers started for it or in one local process:
    its wall time, the CPU its processes used by process (each command's, and the workers' from ready to EXPORTED
    after the run's end), and each command's wall time."""
    command = [*harness.chordflow(), "run" if job.where == "local" else "submit", workflow, "--inputs-file", inputs]
    workers = [] if job.where == "local" else [bench.cluster.start_worker(name, env=env) for name in ("t1", "t2")]
    try:
        ready = sum(_cpu(w.pid) for w in workers)  # each worker returned once ready: its start is not the run's
        t0 = time.perf_counter()
        children = [harness.run_child(command, env, bench.workdir)]
        if workers:
            run_id = children[0].last_line().split()[-1]
            children.append(harness.run_child([*harness.chordflow(), "wait", run_id], env, bench.workdir))
        seconds = time.perf_counter() - t0
        for child in children:
            if child.code != 0:
                raise child.failure()
        names = [child.argv[len(harness.chordflow())] for child in children]
        parts = {name: child.cpu for name, child in zip(names, children, strict=True)}
        walls = {name: child.seconds for name, child in zip(names, children, strict=True)}
        if workers:
            time.sleep(EXPORTED)  # on either side: the spans a traced worker still holds are exported, and counted
            parts["workers"] = sum(_cpu(w.pid) for w in workers) - ready
        return seconds, parts, walls
    finally:
        for name in ("t1", "t2"):
            if (worker := bench.cluster.workers.pop(name, None)) is not None:
                worker.kill(signal.SIGTERM)


def _cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process `pid` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def render(session: Session, jobs: list[Job]) -> str:
    rows = []
    for job in jobs:
        rows.append((
            job.name, *(f"{statistics.median(job.seconds[side]):.2f} s" for side in ("off", "on")),
            _ratios(job.ratios()), *(f"{statistics.median(job.cpu[side]):.2f} s" for side in ("off", "on")),
            _ratios(job.ratios("cpu")), f"{statistics.median(job.spans):,.0f}",
        ))  # fmt: skip
    split = [(job.name, *(_pair(job.parts, name) for name in PROCESSES)) for job in jobs]
    split += [(f"{job.name}: wall", *(_pair(job.walls, name) for name in PROCESSES)) for job in jobs]
    noop_cpu, noop_wall = statistics.median(jobs[0].ratios("cpu")), statistics.median(jobs[0].ratios())
    targets = table(
        ("target", "this run", "goal", "verdict"),
        [("cluster no-op batch: CPU of every process of the job, tracing on / off (median of the rounds' ratios)",
          f"{noop_cpu:.3f}x", f"<= {GOAL}x", verdict(noop_cpu <= GOAL)),
         ("the same, wall time", f"{noop_wall:.3f}x", f"<= {GOAL}x", verdict(noop_wall <= GOAL))],
    )  # fmt: skip
    head = ("job", "wall off", "wall on", "on / off, per round", "CPU off", "CPU on", "on / off, per round",
            "spans per run")  # fmt: skip
    body = (
        f"## Targets\n\n{targets}\n\n## Jobs, tracing off against on (medians of the rounds)\n\n"
        + table(head, rows, "lrrrrrrr")
        + "\n\n## Where the time goes: CPU by process, and each command's wall time; off / on, medians\n\n"
        + table(("job", *(f"`{name}`" if name != "workers" else name for name in PROCESSES)), split, "lrrrr")
        + "\n\nOff: processes started without OTEL_* (no span, the tracing SDK not imported). On: the same processes "
        "with OTEL_EXPORTER_OTLP_ENDPOINT at a loopback receiver in the bench process and the default item ratio, "
        "so a span per run, step, batch, chunk, model call and about 1% of the items. CPU: user + system of the "
        "commands and of both workers from ready to half a second after the run's end, their last export included "
        "(the receiver's, in the bench process, is not "
        "counted). The machine is shared: the load averages are under Machine, and the CPU ratio is the steadier "
        "figure when they are high.\n"
    )
    return harness.document(session, "Tracing: what OpenTelemetry costs a run", body)


def _pair(parts: dict[str, list[dict[str, float]]], name: str) -> str:
    """`off / on` medians of process `name`'s figure; empty when the job has no such process."""
    if name not in parts["on"][0]:
        return ""
    return " / ".join(f"{statistics.median(p[name] for p in parts[side]):.3f} s" for side in ("off", "on"))


def _ratios(ratios: list[float]) -> str:
    return f"**{statistics.median(ratios):.3f}x** ({', '.join(f'{r:.2f}' for r in ratios)})"


def main(argv: list[str] | None = None) -> int:
    quick = f"{QUICK_ITEMS:,} and {QUICK_LLM_ITEMS:,} items, {QUICK_ROUNDS} rounds"
    args = harness.arguments("bench.tracing", __doc__ or "", "TRACING.md", quick, argv)
    harness.run_bench(args, measure, render, workers=())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
