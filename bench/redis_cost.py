"""`python -m bench.redis_cost`: what a run costs its Redis, measured, for docs/SCALING.md.

On its own redis-server (one replica attached, for the WAIT figures) and two solo workers: a batch of N echo items
(auto chunk size, 8 chunks whatever N; and 100 items a chunk) and a dataset job of N records. For each: Redis
commands, the server's CPU time inside them (commandstats `usec`) and bytes in and out (INFO stats
`total_net_*_bytes`), from `CONFIG RESETSTAT` to the run's end. The workers' background (heartbeats, delivery
renewals, sweeps, idle BRPOPs) is measured alone over an idle period and reported per second, apart. Then the cost
of CHORDFLOW_WAIT_REPLICAS=1 per chunk: one chunk's outcomes published (the write it makes WAIT) with and without
the WAIT, median of many, against the same primary and replica.

Prints a Markdown report on stdout; progress on stderr. Figures depend on the machine: SCALING.md names its run.

Internal modules it uses beyond the public API: `scheduler.durable`, `scheduler.localcluster`,
`worker.cluster.state.runstate`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import redis

import scheduler
from scheduler import durable
from scheduler.localcluster import Cluster, RedisServer
from worker.cluster.state.runstate import RunState

WORKFLOW = {"nodes": [{"id": "b", "type": "echo", "batch": {"items": "${items}"}, "params": {"v": "${item}"}}]}
RECORDS = {
    "inputs": {"record": {"description": "one record"}},
    "nodes": [{"id": "e", "type": "echo", "params": {"v": "${record.n}"}}],
    "outputs": {"v": {"source": "${e.v}"}},
}
IDLE_SECONDS = 10
CHUNK = 100
PUBLISHES = 300


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def counters(client: redis.Redis) -> dict[str, float]:
    """Calls and usec of every command since the last reset, and the bytes in and out."""
    found: dict[str, float] = {"calls": 0, "usec": 0}
    for name, stats in client.info("commandstats").items():
        if name.removeprefix("cmdstat_") not in ("info", "config"):  # this bench's own
            found["calls"] += stats["calls"]
            found["usec"] += stats["usec"]
            found[name.removeprefix("cmdstat_")] = stats["calls"]
    net = client.info("stats")
    found["in"], found["out"] = net["total_net_input_bytes"], net["total_net_output_bytes"]
    return found


def measured(client: redis.Redis, action: Callable[[], Any]) -> tuple[dict[str, float], float]:
    client.config_resetstat()
    started = time.monotonic()
    action()
    return counters(client), time.monotonic() - started


def batch(n: int, chunk_size: int | None = None) -> None:
    """N echo items; chunk size auto (CHORDFLOW_CHUNKS_PER_PROCESS chunks per worker process) or `chunk_size`."""
    workflow = WORKFLOW
    if chunk_size is not None:
        workflow = {"nodes": [{**WORKFLOW["nodes"][0], "batch": {"items": "${items}", "chunk_size": chunk_size}}]}
    result = durable.wait(durable.submit(workflow, {"items": list(range(n))}), timeout=600)
    assert result.status == "success" and result.shared["b"]["success_count"] == n, result.error


def dataset(n: int) -> None:
    run_id = scheduler.submit(RECORDS, items=({"n": i} for i in range(n)))
    result = scheduler.wait(run_id, timeout=600)
    assert result.status == "success" and result.outputs["done"] == n, result


def per_thousand(found: dict[str, float], idle: dict[str, float], seconds: float, n: int) -> dict[str, float]:
    """The run's own cost per 1,000 items: the background of `seconds` taken out."""
    own = {key: found[key] - idle[key] * seconds for key in ("calls", "usec", "in", "out")}
    return {key: value * 1000 / n for key, value in own.items()}


def publish_latency(url: str, wait: bool) -> float:
    """Median seconds of one chunk's `publish` (100 outcomes), with CHORDFLOW_WAIT_REPLICAS=1 or 0."""
    os.environ["CHORDFLOW_WAIT_REPLICAS"] = "1" if wait else "0"
    state = RunState(f"bench-wait-{int(wait)}", redis.Redis.from_url(url))
    outcomes = [(i, True) for i in range(100)]
    times = []
    for _ in range(PUBLISHES):
        started = time.perf_counter()
        state.publish("b#0", outcomes)
        times.append(time.perf_counter() - started)
    state.redis.delete(state.keys.events)
    os.environ.pop("CHORDFLOW_WAIT_REPLICAS")
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser("bench.redis_cost", description=__doc__)
    parser.add_argument("--items", type=int, nargs="+", default=[1_000, 10_000])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cf-redis-cost-") as tmp:
        workdir = Path(tmp)
        cluster = Cluster(workdir)
        replica = RedisServer(workdir, ["--replicaof", "127.0.0.1", str(cluster.redis.port)])
        previous = cluster.apply_env()
        try:
            for name in ("w1", "w2"):
                cluster.start_worker(name)
            client = redis.Redis.from_url(cluster.redis.url)
            batch(100)  # warm: scripts loaded, workers registered
            log(f"idle background over {IDLE_SECONDS} s")
            idle_found, idle_s = measured(client, lambda: time.sleep(IDLE_SECONDS))
            idle = {key: idle_found[key] / idle_s for key in ("calls", "usec", "in", "out")}
            rows = []
            kinds = (("batch items, auto chunks", batch), ("batch items, 100 a chunk", lambda n: batch(n, CHUNK)))
            for kind, action in (*kinds, ("dataset records", dataset)):
                for n in args.items:
                    log(f"{kind}: {n}")
                    found, seconds = measured(client, lambda a=action, n=n: a(n))
                    rows.append((kind, n, seconds, found, per_thousand(found, idle, seconds, n)))
            latency = {wait: publish_latency(cluster.redis.url, wait) for wait in (False, True)}
        finally:
            cluster.restore_env(previous)
            cluster.stop()
            replica.kill()
    print("| run | N | seconds | commands / 1,000 | Redis CPU ms / 1,000 | bytes in / 1,000 | bytes out / 1,000 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, n, seconds, _, cost in rows:
        print(
            f"| {kind} | {n:,} | {seconds:.1f} | {cost['calls']:,.0f} | {cost['usec'] / 1000:,.1f} | "
            f"{cost['in']:,.0f} | {cost['out']:,.0f} |"
        )
    print(
        f"\nIdle background, 2 workers: {idle['calls']:.1f} commands/s, {idle['usec'] / 1000:.2f} ms CPU/s, "
        f"{idle['in']:,.0f} B/s in, {idle['out']:,.0f} B/s out (taken out of the rows above)."
    )
    for kind, n, _, found, _ in rows:
        top = sorted(((v, k) for k, v in found.items() if k not in ("calls", "usec", "in", "out")), reverse=True)
        print(f"\n{kind}, N={n:,}: top commands " + ", ".join(f"{k} {v:,.0f}" for v, k in top[:8]))
    print(
        f"\nOne chunk's outcomes published (100 outcomes, {len(msgpack.packb([(i, True) for i in range(100)]))} B): "
        f"median {latency[False] * 1000:.2f} ms without WAIT, {latency[True] * 1000:.2f} ms with "
        f"CHORDFLOW_WAIT_REPLICAS=1 (+{(latency[True] - latency[False]) * 1000:.2f} ms per chunk; {PUBLISHES} each)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
