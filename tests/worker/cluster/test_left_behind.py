"""Nothing left behind: a run that ends keeps only what `status`, `results` and a resume
read; a submit that fails part-way takes back what it wrote and records why; `chordflow purge` and
`chordflow runs --prune` delete runs from either store.

Real parts only: redis-servers this module starts (one with `--maxmemory`), the suite's cluster with its real
workers, `chordflow` as a subprocess. Memory is what Redis itself reports (`INFO memory`).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import scheduler
from ir.errors import RunPurged
from scheduler import durable
from scheduler.localcluster import Cluster, RedisServer, free_port
from tests.scheduler.test_durable import until
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.worker.cluster.faults.test_dead_workers import Counts, batch_workflow, log_lines, record_workflow
from tests.worker.datasets.test_datasets import per_record_workflow, write_records
from worker.cluster.app import current_app
from worker.cluster.datasets.store import ClusterDataset
from worker.cluster.state.keys import RUNS, WINDOWS, done_key, purged_key, run_key, run_prefix
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState
from worker.cluster.state.windows import BatchWindow
from worker.runs.record import RunRecord

ROOT = Path(__file__).parents[3]
#: What `--maxmemory` allows the state Redis of the out-of-memory tests.
MAXMEMORY = 20 * 1024 * 1024


def chordflow(*args: Any, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *map(str, args)],
        cwd=ROOT, env={**(env or os.environ), "COLUMNS": "200"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def keys_of(client: redis.Redis, run_id: str) -> list[str]:
    """The run's keys, without their prefix (`run`, `ds:rec`...)."""
    prefix = run_prefix(run_id)
    return sorted(k.decode()[len(prefix) :] for k in client.scan_iter(match=prefix + "*", count=1000))


def upper_workflow(path: Path) -> Path:
    path.write_text(
        json.dumps(
            {
                "inputs": {"record": {}},
                "nodes": [{"id": "up", "type": "test-upper", "params": {"text": "${record.id}"}}],
                "outputs": {"v": {"source": "${up.value}"}},
            }
        )
    )
    return path


# -- a submit that fails part-way ------------------------------------------------------------------------------


@pytest.fixture
@starts("processes")
def small_redis(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A state Redis of MAXMEMORY (noeviction: writes past it are refused) and a broker Redis of its own, so the
    chunk messages a submit sends are not counted against the state's memory; the env pointing a client at them."""
    (tmp_path / "state").mkdir()
    (tmp_path / "broker").mkdir()
    state = RedisServer(tmp_path / "state", ["--maxmemory", str(MAXMEMORY), "--maxmemory-policy", "noeviction"])
    broker = RedisServer(tmp_path / "broker")
    env = {
        **os.environ, "CHORDFLOW_RESULT_BACKEND": state.url, "CHORDFLOW_BROKER_URL": broker.url,
        "CHORDFLOW_SECRET_KEY": secrets.token_hex(32), "CHORDFLOW_PLUGINS": PLUGINS,
    }  # fmt: skip
    env.pop("CHORDFLOW_SECRET_KEY_FILE", None)
    try:
        yield {"client": redis.Redis.from_url(state.url), "env": env}
    finally:
        state.kill()
        broker.kill()


def used_memory(client: redis.Redis, *, clean: bool = False) -> int:
    """`used_memory` of INFO once no other client is connected (a client's buffers count). `clean`: Redis's own
    bookkeeping first reset, which grows with use and is no run's data: the latency histogram it keeps per command
    used (CONFIG RESETSTAT; about 0.6 MB after a submit) and the Lua VM (SCRIPT FLUSH)."""
    until(lambda: len(client.client_list()) == 1, 30, "the other clients to disconnect")
    if clean:
        client.config_resetstat()
        client.script_flush()
    return int(client.info("memory")["used_memory"])


def test_a_dataset_submit_that_hits_redis_maxmemory_takes_back_what_it_wrote_and_records_why(
    small_redis: dict[str, Any], tmp_path: Path
) -> None:
    client, env = small_redis["client"], small_redis["env"]
    items = tmp_path / "items.jsonl"
    with items.open("w") as f:  # 30 MB of records: more than the 20 MB Redis may hold
        for i in range(30_000):
            f.write(json.dumps({"id": f"r{i}", "text": "x" * 1000}) + "\n")
    before, before_clean = used_memory(client), used_memory(client, clean=True)
    submitted = chordflow("submit", upper_workflow(tmp_path / "wf.json"), "--items", items, env=env)
    assert submitted.returncode == 1
    (line,) = submitted.stderr.splitlines()
    assert line.startswith("error: OutOfMemoryError: command not allowed when used memory > 'maxmemory'")
    assert client.info("memory")["used_memory_peak"] > MAXMEMORY  # it did fill Redis up
    after, after_clean = used_memory(client), used_memory(client, clean=True)
    print(f"used_memory: before {before}, after {after} (+{after - before}); reset +{after_clean - before_clean}")
    assert after - before < 1024 * 1024  # Redis's per-command histograms and the Lua VM: about 0.6 MB
    assert after_clean - before_clean < 16 * 1024  # the run's record (1.5 KB) and its index entry

    (run_id,) = [k.decode() for k in client.zrange(RUNS, 0, -1)]
    assert keys_of(client, run_id) == ["run"]
    status = json.loads(chordflow("status", run_id, "--json", env=env).stdout)
    assert status["status"] == "failed"
    assert status["error"].startswith(
        "reading the records stopped: OutOfMemoryError: command not allowed when used memory > 'maxmemory'"
    )
    text = chordflow("status", run_id, env=env).stdout
    assert "(reading)" not in text and "records: 0/0 read done" in text
    purged = chordflow("purge", run_id, env=env)
    assert purged.stdout == f"purged {run_id}\n", purged.stderr
    assert list(client.scan_iter(count=1000)) == [purged_key(run_id).encode()]  # its tombstone alone


def test_a_submit_whose_inputs_overflow_redis_takes_back_what_it_wrote_and_records_why(
    small_redis: dict[str, Any], tmp_path: Path
) -> None:
    client, env = small_redis["client"], small_redis["env"]
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps({"inputs": {"big": {}}, "nodes": [{"id": "e", "type": "echo", "params": {"v": 1}}]}))
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"big": ["y" * 1000] * 30_000}))  # 30 MB, stored as it is read
    before = used_memory(client, clean=True)
    submitted = chordflow("submit", wf, "--inputs-file", inputs, env=env)
    assert submitted.returncode == 1
    assert "OutOfMemoryError" in submitted.stderr and len(submitted.stderr.splitlines()) == 1
    assert client.info("memory")["used_memory_peak"] > MAXMEMORY
    after = used_memory(client, clean=True)
    print(f"used_memory: before {before}, after {after} (+{after - before})")
    assert after - before < 16 * 1024
    (run_id,) = [k.decode() for k in client.zrange(RUNS, 0, -1)]
    assert keys_of(client, run_id) == ["run"]
    status = json.loads(chordflow("status", run_id, "--json", env=env).stdout)
    assert status["status"] == "failed" and status["error"].startswith("not recorded: OutOfMemoryError: ")


# -- a run that ends -------------------------------------------------------------------------------------------


def test_a_cluster_run_that_ended_keeps_only_what_status_results_and_resume_read(
    celery_cluster: Any, tmp_path: Path
) -> None:
    wf = {
        "nodes": [
            {
                "id": "b", "type": "test-upper", "params": {"text": "${item}"},
                "batch": {"items": "${items}", "chunk_size": 5},
            }
        ]
    }  # fmt: skip
    big = "z" * 40_000  # the batch's snapshot is stored by reference (over 16 KiB)
    run_id = scheduler.submit(wf, {"items": [f"i{n}" for n in range(20)], "pad": big})
    assert scheduler.wait(run_id, timeout=120).status == "success"
    client = ClusterRuns().redis
    left = keys_of(client, run_id)
    assert [k for k in left if k.startswith(("snap:", "result:", "dispatched:", "failed:"))] == []
    assert {"run", "store", "trail", "steps", "totals", "events"} <= set(left) and "chunks:b#0" in left
    assert client.xlen(run_key(run_id, "events")) == 1  # the end marker; the per-item progress went
    rows = [json.loads(line) for line in chordflow("results", run_id, "--node", "b").stdout.splitlines()]
    assert [r["result"]["value"] for r in rows] == [f"I{n}" for n in range(20)]
    assert json.loads(chordflow("status", run_id, "--json").stdout)["status"] == "succeeded"


def test_a_failed_dataset_job_drops_its_reading_state_and_keeps_the_records_redrive_runs(
    celery_cluster: Any, tmp_path: Path
) -> None:
    log, missing = tmp_path / "log.txt", tmp_path / "flag"
    wf = tmp_path / "wf.json"
    wf.write_text(json.dumps(per_record_workflow(log)))
    items = write_records(tmp_path / "items.jsonl", 20, missing, failing=(6,))
    done = chordflow("run", wf, "--items", items, "--chunk-size", 5, "--backend", "celery", "--output", "json")
    assert done.returncode == 1, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    client = ClusterRuns().redis
    left = keys_of(client, run_id)
    reading = ("ds:todo", "ds:pending", "ds:next", "ds:claim", "ds:started", "ds:reader", "abort:records")
    assert [k for k in left if k in reading] == []
    assert {"ds", "ds:out", "ds:cov", "ds:fails"} <= set(left)
    assert client.hkeys(run_key(run_id, "ds:rec")) == [b"1"]  # the chunk of the failed record, for a redrive
    assert len(chordflow("results", run_id).stdout.splitlines()) == 20
    missing.write_text("now it exists")
    assert chordflow("redrive", run_id).returncode == 0
    assert "ds:rec" not in keys_of(client, run_id)  # every record succeeded: none is kept


# -- purge -----------------------------------------------------------------------------------------------------


def local_rows(run_id: str) -> dict[str, int]:
    """Rows naming the run in every table of the embedded store (CHORDFLOW_HOME/runs.db)."""
    db = sqlite3.connect(Path(os.environ["CHORDFLOW_HOME"]) / "runs.db")
    try:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        counts = {}
        for table in tables:
            if "run_id" in {row[1] for row in db.execute(f"PRAGMA table_info({table})")}:
                counts[table] = db.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0]
        return {table: n for table, n in counts.items() if n}
    finally:
        db.close()


@pytest.mark.processes
def test_purge_deletes_a_local_run_and_a_local_dataset_job_from_every_table(tmp_path: Path) -> None:
    wf = upper_workflow(tmp_path / "wf.json")
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"id": f"r{i}"}) + "\n" for i in range(7)))
    job = json.loads(chordflow("run", wf, "--items", items, "--chunk-size", 3, "--output", "json").stdout)["run_id"]
    plain = json.loads(
        chordflow("run", wf, "--input", 'record={"id": "x"}', "--output", "json").stdout
    )["run_id"]  # fmt: skip
    assert set(local_rows(job)) == {"runs", "dataset_chunks", "datasets"} and "trail" in local_rows(plain)
    for run_id in (job, plain):
        purged = chordflow("purge", run_id)
        assert (purged.returncode, purged.stdout, purged.stderr) == (0, f"purged {run_id}\n", "")
        assert local_rows(run_id) == {}
        gone = chordflow("status", run_id)
        assert gone.returncode == 2 and gone.stderr.startswith(f"error: unknown run '{run_id}' (not in ")
    again = chordflow("purge", job)
    assert again.returncode == 2 and again.stderr.startswith(f"error: unknown run '{job}'")


def test_purge_refuses_a_running_cluster_run_then_deletes_every_key_once_it_ended(
    celery_cluster: Any, tmp_path: Path
) -> None:
    log, gate = tmp_path / "log.txt", tmp_path / "gate"
    wf = tmp_path / "wf.json"
    wf.write_text(
        json.dumps({"nodes": [{"id": "w", "type": "test-side-effect", "params": {"log": str(log), "gate": str(gate)}}]})
    )
    run_id = chordflow("submit", wf).stdout.split()[0]
    until(lambda: json.loads(chordflow("status", run_id, "--json").stdout)["status"] == "running", 60, "it to run")
    refused = chordflow("purge", run_id)
    assert refused.returncode == 2
    assert refused.stderr == f"error: run {run_id} is running: stop it first with `chordflow cancel {run_id}`\n"
    gate.write_text("open")
    assert chordflow("wait", run_id).returncode == 0
    client = ClusterRuns().redis
    assert keys_of(client, run_id)
    assert chordflow("purge", run_id).stdout == f"purged {run_id}\n"
    assert keys_of(client, run_id) == [] and client.zscore(RUNS, run_id) is None


#: A message of each task of a purged run, as one could come back (a redelivery, an aging copy): each is skipped.
ZOMBIES: dict[str, tuple[Any, ...]] = {
    "chordflow.advance": ("RUN", 0),
    "chordflow.advance_branch": ("RUN", "start:parallel#0", "a", 0),
    "chordflow.aggregate": ({"run": "RUN", "batch": "b#0", "node": "b", "count": 9, "fail_fast": False, "advance": 0},),
    "chordflow.run_chunk": ({"run": "RUN", "batch": "b#0", "start": 0, "plan": "p", "items": []},),
    "chordflow.dataset_chunk": ("RUN", 0),
}


def ignored(worker: Any) -> int:
    """How many tasks the worker ignored so far (Celery's INFO line for each)."""
    return sum(line.endswith(" ignored") for line in worker.log.read_text().splitlines())


@pytest.mark.parametrize("kind", ["batch", "dataset job"])
@pytest.mark.processes
def test_a_purged_run_stays_dead_when_its_paused_worker_wakes_up_and_when_its_messages_come_back(
    tmp_path: Path, kind: str
) -> None:
    """SIGSTOP a worker mid-chunk (a batch's, a dataset job's), cancel, purge, SIGCONT: the woken chunk starts no item
    and writes none of the run's keys back (without the tombstone it ran the rest of its chunk and recreated `events`);
    then a message of each task of the run, delivered after the purge, runs nothing and writes nothing, not even its
    done mark. Left: the tombstone alone, and no Celery result of any task."""
    cluster = Cluster(tmp_path, visibility_timeout=5, plugins=f"{PLUGINS},tests.support.counting_nodes")
    previous = cluster.apply_env()
    try:
        for name in ("k1", "k2"):
            cluster.start_worker(name)
        client, counts = ClusterRuns().redis, Counts(cluster)
        if kind == "batch":
            run_id = durable.submit(batch_workflow(counts, 0.3, 10), {"items": list(range(40))})
        else:
            run_id = scheduler.submit(record_workflow(counts, 0.3), items=({"n": i} for i in range(40)), chunk_size=10)
        until(lambda: len(counts.started_by("k1")) >= 2, 60, "k1 to be inside a chunk")
        paused = cluster.workers["k1"]
        paused.kill(signal.SIGSTOP)
        started, before = counts.started_by("k1"), ignored(paused)  # k1 starts nothing more while stopped
        assert chordflow("cancel", run_id).returncode == 0
        # k1's chunk comes back to k2 after the dead-delivery bound (5 s here) and stops at once: the run ends.
        until(lambda: ClusterRuns().get(run_id).status == "cancelled", 60, "the run to end cancelled")
        assert chordflow("purge", run_id).stdout == f"purged {run_id}\n"
        assert keys_of(client, run_id) == [] and client.exists(purged_key(run_id))
        paused.kill(signal.SIGCONT)
        until(lambda: ignored(paused) > before, 60, "k1's woken chunk to end")  # Celery's line: "... ignored"
        assert counts.started_by("k1") == started  # not one more item
        sent = {}
        for name, args in ZOMBIES.items():
            sent[name] = current_app().send_task(name, json.loads(json.dumps(args).replace('"RUN"', f'"{run_id}"'))).id
        for name, task_id in sent.items():
            line = f"skipped task {name}[{task_id}]: run {run_id} was purged"
            until(lambda line=line: log_lines(cluster, line), 60, line)
        assert [client.exists(done_key(task_id)) for task_id in sent.values()] == [0] * len(sent)
        assert keys_of(client, run_id) == []
        assert [k.decode() for k in client.scan_iter(match=f"*{run_id}*")] == [purged_key(run_id)]
        assert [m for m, _ in client.zscan_iter(WINDOWS, match=f"{run_id}|*")] == []  # no window counted open
        assert list(client.scan_iter(match="celery-task-meta-*")) == []
        assert 0 < client.ttl(purged_key(run_id)) <= ClusterRuns().ttl
    finally:
        cluster.restore_env(previous)
        cluster.stop()


@pytest.mark.processes
def test_every_write_of_a_purged_run_is_refused_and_nothing_of_it_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a task still in flight writes after its run's purge, each way it writes (a redis-server of this test's
    own): the record and its exception, the progress stream, a batch's window, abort flag, permits and merged result,
    a dataset job's step. Each writes nothing; what reads a stop says stop (and `purged`); only the tombstone stays."""
    server = RedisServer(tmp_path)
    try:
        monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", server.url)
        client = redis.Redis.from_url(server.url)
        runs = ClusterRuns(client, ttl=600)
        runs.create(RunRecord("gone", {"nodes": [{"id": "a", "type": "echo"}]}, "celery", "cancelled", "a"), {"x": 1})
        runs.purge("gone")
        state = RunState("gone", client, ttl=600)
        for write in (
            lambda: runs.set_status("gone", "failed", "late"),
            lambda: runs.set_exception("gone", ValueError("late")),
            lambda: state.finish_batch("b#0", b"result"),
            state.cancelled,
        ):
            with pytest.raises(RunPurged):
                write()
        state.publish("b#0", [(0, True)], (0, 5, 1))
        state.abort("b#0")
        assert not state.acquire_permit("b#0", "token", 4, 30.0)
        assert state.should_stop("b#0") and state.chunk_start("b#0")[0] and state.purged
        assert BatchWindow(state, "b#0", "plan").finish(0, b"outcome", 1, 0.1, 2).state == "purged"
        assert ClusterDataset("gone").check() == ("purged", [])
        assert [k.decode() for k in client.scan_iter()] == [purged_key("gone")]
    finally:
        server.kill()


# -- runs --prune ----------------------------------------------------------------------------------------------


@pytest.fixture
@starts("processes")
def own_stores(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A CHORDFLOW_HOME and a Redis of this test's own: pruning touches nothing of the suite's runs."""
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    env = {**os.environ, "CHORDFLOW_HOME": str(tmp_path / "home"), "CHORDFLOW_PLUGINS": PLUGINS}
    env |= {"CHORDFLOW_RESULT_BACKEND": server.url, "CHORDFLOW_BROKER_URL": server.url}
    try:
        yield {"env": env, "client": redis.Redis.from_url(server.url), "home": tmp_path / "home"}
    finally:
        server.kill()


def test_runs_prune_deletes_ended_runs_older_than_d_in_both_stores_never_running_ones(
    own_stores: dict[str, Any], tmp_path: Path
) -> None:
    env, client, home = own_stores["env"], own_stores["client"], own_stores["home"]
    wf = upper_workflow(tmp_path / "wf.json")
    local = [
        json.loads(chordflow("run", wf, "--input", f'record={{"id": "{n}"}}', "--output", "json", env=env).stdout)
        for n in range(2)
    ]
    old, new = local[0]["run_id"], local[1]["run_id"]
    long_ago = time.time() - 8 * 86400
    with sqlite3.connect(home / "runs.db") as db:  # as if it had last been updated 8 days ago
        db.execute("UPDATE runs SET updated = ? WHERE run_id = ?", (long_ago, old))
        db.execute(
            "INSERT INTO runs (run_id, workflow, backend, status, step, created, updated) "
            "VALUES ('stuck', '{}', 'local', 'running', 0, ?, ?)",
            (long_ago, long_ago),
        )
    cluster = ClusterRuns(client, ttl=3600)
    for run_id, status in (("c-old", "failed"), ("c-going", "running"), ("c-new", "succeeded")):
        cluster.create(RunRecord(run_id, {"nodes": []}, "celery", status), {"x": 1})
        if run_id != "c-new":
            client.hset(run_key(run_id, "run"), "updated", long_ago)

    pruned = chordflow("runs", "--prune", "--older-than", "7d", env=env)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.splitlines() == [f"pruned 1 run from {home / 'runs.db'}", "pruned 1 run from Redis"]
    listed = {r["run_id"] for r in json.loads(chordflow("runs", "--json", env=env).stdout)}
    assert listed == {new, "stuck", "c-going", "c-new"}
    assert keys_of(client, "c-old") == []
    again = chordflow("runs", "--prune", "--older-than", "12h", env=env)
    assert again.stdout.splitlines() == [f"pruned 0 runs from {home / 'runs.db'}", "pruned 0 runs from Redis"]

    unreachable = {**env, "CHORDFLOW_RESULT_BACKEND": f"redis://127.0.0.1:{free_port()}/0"}
    unreachable["CHORDFLOW_BROKER_URL"] = unreachable["CHORDFLOW_RESULT_BACKEND"]
    alone = chordflow("runs", "--prune", "--older-than", "30m", env=unreachable)
    assert alone.returncode == 0
    assert alone.stdout == f"pruned 0 runs from {home / 'runs.db'}\n"
    assert alone.stderr == "Redis: not reachable, nothing pruned there\n"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--older-than", "7w"], "--older-than '7w': expected a number and a unit, like 7d, 12h, 30m or 90s"),
        (["--older-than", "d"], "--older-than 'd': expected a number and a unit, like 7d, 12h, 30m or 90s"),
        ([], "--prune needs --older-than D (an age, like 7d, 12h, 30m or 90s)"),
    ],
)
@pytest.mark.processes
def test_a_bad_prune_age_is_one_usage_line(args: list[str], error: str) -> None:
    done = chordflow("runs", "--prune", *args)
    assert (done.returncode, done.stderr, done.stdout) == (2, f"error: {error}\n", "")
