"""Prometheus metrics: `chordflow metrics` reads the cluster at scrape time, `chordflow worker
--metrics-port` serves what its pool processes did. Scraped over HTTP from real processes — a redis-server, a
prefork worker with two pool processes, the metrics server — and parsed with prometheus_client's parser.

Runs are held by a gate (a file the item waits for), so what a scrape sees while a run is going is known exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

import scheduler
from scheduler import api, durable
from scheduler.localcluster import Cluster, ManagedProcess, free_port
from scheduler.ops import usage
from tests.scheduler.cli.test_cli import ROOT, run_cli
from tests.support import llm_server
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts

IDLE_QUEUE = "metrics-idle"  # no worker consumes it: what is sent there waits


@dataclass
class Ops:
    cluster: Cluster
    metrics_port: int  # `chordflow metrics`
    worker_port: int  # `chordflow worker -P prefork -c 2 --metrics-port`


@pytest.fixture(scope="module")
@starts("cluster")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ops]:
    """A cluster of its own (its registry and queues are known exactly): one prefork worker with two pool
    processes serving its metrics, and `chordflow metrics` measuring the default queue and IDLE_QUEUE."""
    workdir = tmp_path_factory.mktemp("metrics")
    cluster = Cluster(workdir, plugins=PLUGINS)
    previous = cluster.apply_env()
    try:
        worker_port, metrics_port = free_port(), free_port()
        cluster.start_worker(
            "m1", via="chordflow", pool="prefork", concurrency=2, args=("--metrics-port", str(worker_port))
        )
        argv = [sys.executable, "-m", "scheduler.cli", "metrics", "--port", str(metrics_port)]
        argv += ["-Q", "chordflow", "-Q", IDLE_QUEUE]
        server = ManagedProcess(argv, workdir / "metrics.log", "serving metrics on", env=cluster.env)
        cluster.workers["metrics"] = server  # stopped with the cluster
        yield Ops(cluster, metrics_port, worker_port)
    finally:
        cluster.restore_env(previous)
        cluster.stop()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape_until(port: int, condition: Callable[[Samples], bool], what: str, timeout: float = 60) -> Samples:
    """Scrape until `condition` holds for what is scraped (polling a condition, with a deadline); returns it."""
    deadline = time.monotonic() + timeout
    while not condition(samples := scrape(port)):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.1)
    return samples


def worker_counted(ops: Ops, node: str, *, chunks: int, ok: int, failed: int) -> Samples:
    """Scrape the worker until it has counted `chunks` chunks of `node`; its items of `node` by outcome are then
    `ok` and `failed`. Returns the scrape."""
    worker = scrape_until(
        ops.worker_port,
        lambda s: value(s, "chordflow_chunk_duration_seconds_count", node=node) == chunks,
        f"the worker to count {chunks} chunks of {node}",
    )
    assert value(worker, "chordflow_items_processed_total", node=node, outcome="ok") == ok
    assert value(worker, "chordflow_items_processed_total", node=node, outcome="failed") == failed
    return worker


def gated_batch(tmp_path: Path, name: str) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """Six items, one per chunk: item 0 waits for the gate (holding one pool process), item 5 fails."""
    gate = tmp_path / "gate"
    items = [
        {"i": i, "gate": str(gate) if i == 0 else "", "requires": str(tmp_path / "never") if i == 5 else ""}
        for i in range(6)
    ]
    params = {
        "log": str(tmp_path / "log"),
        "label": "${item.i}",
        "gate": "${item.gate}",
        "requires": "${item.requires}",
    }
    node = {"id": "b", "type": "test-side-effect", "params": params,
            "batch": {"items": "${items}", "error_handling": "continue", "chunk_size": 1}}  # fmt: skip
    return {"name": name, "nodes": [node]}, {"items": items}, gate


def test_a_scrape_shows_a_running_batch_and_the_worker_counts_every_pool_process(ops: Ops, tmp_path: Path) -> None:
    before = scrape(ops.metrics_port)
    assert value(before, "chordflow_up") == 1
    assert value(before, "chordflow_workers") == 1
    assert value(before, "chordflow_worker_processes") == 2  # the prefork worker's pool, from the registry

    wf, inputs, gate = gated_batch(tmp_path, "metrics-gated")
    run_id = scheduler.submit(wf, inputs)
    # One pool process holds item 0 at its gate; the other runs items 1-5, so they have outcomes.
    going = scrape_until(
        ops.metrics_port,
        lambda s: (
            value(s, "chordflow_run_items_done", run=run_id, workflow="metrics-gated") == 5
            and value(s, "chordflow_chunks_in_flight") == 1
        ),
        "items 1-5 to have outcomes while item 0 waits",
    )
    assert value(going, "chordflow_runs", status="running", workflow="metrics-gated") == 1
    assert value(going, "chordflow_runs", status="succeeded", workflow="metrics-gated") == 0
    assert value(going, "chordflow_run_items", run=run_id, workflow="metrics-gated") == 6
    assert value(going, "chordflow_run_items_failed", run=run_id, workflow="metrics-gated") == 1
    assert value(going, "chordflow_batch_progress_ratio", run=run_id, node="b") == pytest.approx(5 / 6)
    assert value(going, "chordflow_queue_messages", queue="chordflow") == 0

    # The worker's own counts so far: the chunks of the pool process that was free.
    worker_counted(ops, "b", chunks=5, ok=4, failed=1)

    gate.write_text("open")
    assert scheduler.wait(run_id, timeout=60).status == "success"
    after = scrape_until(
        ops.metrics_port, lambda s: value(s, "chordflow_chunks_in_flight") == 0, "every message to be acknowledged"
    )
    assert value(after, "chordflow_runs", status="running", workflow="metrics-gated") == 0
    assert value(after, "chordflow_runs", status="succeeded", workflow="metrics-gated") == 1
    assert value(after, "chordflow_run_items_done", run=run_id, workflow="metrics-gated") is None  # running runs only

    # Item 0 ran in the other pool process: its counts are added to the first one's (multiprocess mode).
    worker = worker_counted(ops, "b", chunks=6, ok=5, failed=1)
    assert value(worker, "chordflow_task_wait_seconds_count", task="chordflow.run_chunk") == 6
    assert value(worker, "chordflow_advance_duration_seconds_count") == 2  # dispatch the batch; end the run


def test_a_queue_nobody_consumes_shows_its_depth_and_the_age_of_its_next_message(ops: Ops, tmp_path: Path) -> None:
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"name": "metrics-idle", "nodes": [{"id": "a", "type": "echo", "params": {"v": 1}}]}))
    sent = time.time()
    submitted = run_cli("submit", wf, env={**ops.cluster.env, "CHORDFLOW_QUEUE": IDLE_QUEUE})
    assert submitted.returncode == 0, submitted.stderr
    run_id = submitted.stdout.split()[-1]
    try:
        first = scrape(ops.metrics_port)
        assert value(first, "chordflow_queue_messages", queue=IDLE_QUEUE) == 1  # its first advance, waiting
        assert value(first, "chordflow_runs", status="queued", workflow="metrics-idle") == 1
        age = value(first, "chordflow_queue_oldest_message_age_seconds", queue=IDLE_QUEUE)
        assert age is not None and 0 <= age <= time.time() - sent
        later = scrape_until(
            ops.metrics_port,
            lambda s: (value(s, "chordflow_queue_oldest_message_age_seconds", queue=IDLE_QUEUE) or 0) >= age + 0.5,
            "the waiting message to grow older",
        )
        assert value(later, "chordflow_queue_messages", queue=IDLE_QUEUE) == 1
        assert value(later, "chordflow_queue_oldest_message_age_seconds", queue="chordflow") == 0  # empty
    finally:
        redis.Redis.from_url(ops.cluster.redis.url).delete(IDLE_QUEUE)
        durable.cancel_run(run_id)


def test_a_dataset_job_reports_its_records(ops: Ops, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    wf = {
        "name": "metrics-records",
        "inputs": {"record": {"description": "one record"}},
        "nodes": [{"id": "s", "type": "test-side-effect",
                   "params": {"log": str(tmp_path / "log"), "label": "${record.id}", "gate": "${record.gate}"}}],
    }  # fmt: skip
    records = [{"id": i, "gate": str(gate) if i == 0 else ""} for i in range(4)]
    run_id = scheduler.submit(wf, items=records, chunk_size=1)
    going = scrape_until(
        ops.metrics_port,
        lambda s: value(s, "chordflow_run_items_done", run=run_id, workflow="metrics-records") == 3,
        "records 1-3 to finish while record 0 waits",
    )
    assert value(going, "chordflow_run_items", run=run_id, workflow="metrics-records") == 4
    assert value(going, "chordflow_batch_progress_ratio", run=run_id, node="records") == pytest.approx(0.75)
    gate.write_text("open")
    assert scheduler.wait(run_id, timeout=60).status == "success"
    worker = scrape_until(
        ops.worker_port,
        lambda s: value(s, "chordflow_items_processed_total", node="records", outcome="ok") == 4,
        "the worker to count the 4 records",
    )
    assert value(worker, "chordflow_chunk_duration_seconds_count", node="records") == 4


#: USD per million tokens of the loopback provider's model (CHORDFLOW_LLM_PRICES on the workers).
PRICE = {"input": 2.0, "output": 10.0}


def llm_workflow() -> dict[str, Any]:
    """A call, a batch of calls over `items` (three chunks), and the first call again (answered from the run's
    kept answer: a cached call, nothing billed)."""
    ask = {"id": "intro", "type": "llm", "params": {"prompt": "say hello in French", "model": "openai/gpt-test"}}
    params = {"prompt": "${item}", "system": "be brief", "model": "openai/gpt-test"}
    each = {"id": "each", "type": "llm", "params": params, "batch": {"items": "${items}", "chunk_size": 2}}
    edges = [{"from": "intro", "to": "each"}, {"from": "each", "to": "again"}]
    return {"name": "llm-cost", "nodes": [ask, each, {**ask, "id": "again"}], "edges": edges}


@pytest.mark.processes
def test_a_cluster_runs_model_calls_in_status_results_and_metrics_equal_the_providers_count(tmp_path: Path) -> None:
    items = [f"translate item number {i}" for i in range(6)]
    with llm_server.serving() as provider:
        provider_env = {
            **llm_server.environment(provider),
            "CHORDFLOW_LLM_PRICES": json.dumps({"openai/gpt-test": PRICE}),
        }
        cluster = Cluster(tmp_path, plugins=PLUGINS, base_env={**os.environ, **provider_env})
        previous = cluster.apply_env()
        try:
            cluster.start_worker("u1", via="chordflow", pool="prefork", concurrency=2)
            port = free_port()
            argv = [sys.executable, "-m", "scheduler.cli", "metrics", "--port", str(port)]
            cluster.workers["metrics"] = ManagedProcess(
                argv, tmp_path / "metrics.log", "serving metrics on", env=cluster.env
            )
            with pytest.MonkeyPatch.context() as patch:
                for name, setting in provider_env.items():
                    patch.setenv(name, setting)  # the client's key: submit checks the model has one
                run_id = scheduler.submit(llm_workflow(), {"items": items, "__llm_calls__": []})
                assert scheduler.wait(run_id, timeout=120).status == "success"
            status = run_cli("status", run_id, "--json", env=cluster.env)
            results = run_cli("results", run_id, env=cluster.env)
            samples = scrape_until(
                port, lambda s: value(s, "chordflow_llm_calls_total", model="gpt-test") == 8, "the run's 8 calls"
            )
            api.purge(run_id)  # gone from Redis, as when its TTL ends: what it cost stays counted
            gone = scrape_until(
                port, lambda s: not value(s, "chordflow_runs", status="succeeded", workflow="llm-cost"), "the purge"
            )
        finally:
            cluster.restore_env(previous)
            cluster.stop()
    tokens_in, tokens_out = provider.tokens()
    assert len(provider.billed()) == 7  # `again` was not sent
    cost = (tokens_in * PRICE["input"] + tokens_out * PRICE["output"]) / 1_000_000
    assert status.returncode == 0, status.stderr
    llm = json.loads(status.stdout)["llm"]
    assert llm == {"calls": 8, "cached_calls": 1, "input_tokens": tokens_in, "output_tokens": tokens_out,
                   "cost_usd": pytest.approx(cost)}  # fmt: skip
    assert results.returncode == 0, results.stderr
    assert (
        f"llm: 8 calls (1 answered from kept answers), {tokens_in} input tokens, {tokens_out} output tokens, "
        f"${cost:.4f}"
    ) in results.stderr
    assert value(samples, "chordflow_llm_cached_calls_total", model="gpt-test") == 1
    assert value(samples, "chordflow_llm_tokens_total", model="gpt-test", direction="input") == tokens_in
    assert value(samples, "chordflow_llm_tokens_total", model="gpt-test", direction="output") == tokens_out
    assert value(samples, "chordflow_llm_cost_usd_total", model="gpt-test") == pytest.approx(cost)
    counters = {k: v for k, v in samples.items() if k[0].startswith("chordflow_llm_")}
    assert counters and counters == {k: v for k, v in gone.items() if k[0].startswith("chordflow_llm_")}


def test_model_call_counters_never_go_down() -> None:
    """A run rewound (repair, redrive) adds again only past its mark; a run gone keeps what it added."""
    counters = usage.ModelCounters()

    def seen(run_id: str, calls: int, tokens: int, **more: float) -> dict[str, float]:
        counts = {"calls": calls, "cached_calls": 0, "input_tokens": tokens, "output_tokens": tokens // 2, **more}
        counters.see(run_id, {"gpt-test": counts})
        return counters.totals["gpt-test"]

    assert seen("r1", 3, 30) == {"calls": 3, "cached_calls": 0, "input_tokens": 30, "output_tokens": 15}
    assert seen("r1", 1, 10)["calls"] == 3  # rewound: nothing taken back
    assert seen("r1", 4, 40)["input_tokens"] == 40  # past its mark: the difference
    counters.forget("r1")
    assert seen("r2", 2, 20, cost_usd=0.5) == {
        "calls": 6, "cached_calls": 0, "input_tokens": 60, "output_tokens": 30, "cost_usd": 0.5
    }  # fmt: skip


def ops_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.processes
def test_metrics_say_redis_is_down_instead_of_failing_the_scrape(tmp_path: Path) -> None:
    port, nowhere = free_port(), f"redis://127.0.0.1:{free_port()}/0"
    argv = [sys.executable, "-m", "scheduler.cli", "metrics", "--port", str(port)]
    env = {**ops_env(), "CHORDFLOW_BROKER_URL": nowhere, "CHORDFLOW_RESULT_BACKEND": nowhere}
    server = ManagedProcess(argv, tmp_path / "metrics.log", "serving metrics on", env=env)
    try:
        samples = scrape(port)
    finally:
        server.kill()
    assert samples == {("chordflow_up", ()): 0}


@pytest.mark.processes
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "scheduler.cli", "metrics", "--port", str(port)]
    first = ManagedProcess(argv, tmp_path / "first.log", "serving metrics on", env=ops_env())
    try:
        second = subprocess.run(argv, cwd=ROOT, env=ops_env(), capture_output=True, text=True, timeout=60)
    finally:
        first.kill()
    assert second.returncode == 2
    assert second.stderr.strip().splitlines() == [
        f"error: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    ]
    bad = run_cli("worker", "--metrics-port", "nine", env={**ops_env(), "CHORDFLOW_INSECURE": "1"})
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --metrics-port: expected PORT or ADDRESS:PORT, got 'nine'"
