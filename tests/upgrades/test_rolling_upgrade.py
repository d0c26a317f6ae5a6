"""A rolling upgrade, live: a batch run and a dataset job submitted by a client of the previous release and started on
two workers of that release are finished by workers of this tree, each old worker stopped (SIGTERM, a warm
shutdown) only once its replacement is up; both runs succeed with every index and record executed exactly once.
And the way back: a worker of the previous release reads the records and messages this one writes, `trace` keys
and all.

The previous release is the newest tag of the replay corpus (tests/upgrades/corpus.py TAGS), checked out by the test
(its recorded commit) into a temporary `git worktree` of this repository (removed after). Its workers and its client
run from that checkout (cwd and PYTHONPATH, so its `worker`, `scheduler` and `tests.support` import first; the
shared .venv has every dependency); the suite's own redis-server, real `celery` workers. Executions are counted in
Redis by the `test-count` node (tests/support/counting_nodes.py, the same in both releases): `<key>:runs` lists
"<worker> <label>" as each starts, `<key>:effects` counts each label's side effect. The figures are in
tests/RELIABILITY.md.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis

import scheduler
from scheduler.localcluster import Cluster, ManagedProcess
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.upgrades import corpus
from tests.upgrades.test_replay import assert_same, dataset_rows, plain
from worker.cluster import messages as m
from worker.cluster.state.keys import run_key
from worker.cluster.state.runs import ClusterRuns
from worker.runs.record import RunRecord
from worker.tracing import Later

PREVIOUS = corpus.TAGS[-1]
#: The runs: a batch of ITEMS items of ITEM_SECONDS each, a dataset job of RECORDS records of RECORD_SECONDS each.
ITEMS, ITEM_SECONDS = 3000, 0.008
RECORDS, RECORD_SECONDS, RECORD_CHUNK = 600, 0.02, 20
#: Each old worker is replaced once both runs have done this share of their work (neither has ended then).
SHARES = (0.1, 0.4)
#: Seconds anything may take on a loaded machine (a worker's warm shutdown, a run's end).
DEADLINE = 120.0


@pytest.fixture(scope="module")
def old_tree() -> Iterator[Path]:
    """The previous release's checkout, a worktree of this repository's tag (unregistered and deleted after)."""
    with corpus.worktree(PREVIOUS) as tree:
        yield tree


@pytest.fixture
@starts("cluster")
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A redis-server of its own and no worker yet; this process points at it."""
    made = Cluster(tmp_path, plugins=f"{PLUGINS},tests.support.counting_nodes")
    previous = made.apply_env()
    try:
        yield made
    finally:
        made.restore_env(previous)
        made.stop()


def old_env(cluster: Cluster, tree: Path) -> dict[str, str]:
    return {**cluster.env, "PYTHONPATH": str(tree)}


def old_python(cluster: Cluster, tree: Path, code: str, stdin: bytes) -> Any:
    """Run `code` under the previous release (its checkout's modules first, checked); its stdout, as JSON."""
    code = f"import os, worker\nassert worker.__file__.startswith(os.getcwd()), worker.__file__\n{code}"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=old_env(cluster, tree), input=stdin,
                          capture_output=True, timeout=DEADLINE, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return json.loads(done.stdout)


#: Under the previous release: submit both runs, print their ids.
SUBMIT = """
import json, sys
import scheduler
from tests.support import counting_nodes
spec = json.loads(sys.stdin.read())
batch = scheduler.submit(spec["batch"], {"items": list(range(spec["items"]))})
job = scheduler.submit(spec["records"], items=[{"n": i} for i in range(spec["n"])], chunk_size=spec["chunk"])
print(json.dumps([batch, job]))
"""


class Counts:
    """What the `test-count` items under one key recorded."""

    def __init__(self, r: redis.Redis, key: str):
        self.redis, self.key = r, key

    def done(self) -> int:
        return int(self.redis.hlen(f"{self.key}:effects"))

    def effects(self) -> dict[str, int]:
        return {label.decode(): int(n) for label, n in self.redis.hgetall(f"{self.key}:effects").items()}

    def by_worker(self) -> collections.Counter[str]:
        return collections.Counter(e.decode().split(" ", 1)[0] for e in self.redis.lrange(f"{self.key}:runs", 0, -1))


def until(condition: Any, what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


def test_workers_of_the_previous_release_replaced_one_at_a_time_mid_run_lose_and_repeat_nothing(
    cluster: Cluster, old_tree: Path
) -> None:
    r = redis.Redis.from_url(cluster.redis.url)
    tag = uuid.uuid4().hex[:8]
    batch, records = Counts(r, f"up:{tag}:batch"), Counts(r, f"up:{tag}:records")
    node = {"id": "b", "type": "test-count", "params": {"key": batch.key, "label": "${item}", "seconds": ITEM_SECONDS}}
    spec = {
        "batch": {"nodes": [{**node, "batch": {"items": "${items}"}}]}, "items": ITEMS,
        "records": {
            "inputs": {"record": {"description": "one record"}},
            "nodes": [{"id": "work", "type": "test-count",
                       "params": {"key": records.key, "label": "${record.n}", "seconds": RECORD_SECONDS}}],
            "outputs": {"label": {"source": "${work.label}"}},
        },
        "n": RECORDS, "chunk": RECORD_CHUNK,
    }  # fmt: skip
    for name in ("old1", "old2"):
        cluster.start_worker(name, env=old_env(cluster, old_tree), cwd=old_tree)
    began = time.monotonic()
    batch_id, job_id = old_python(
        cluster, old_tree, SUBMIT, json.dumps(spec).encode()
    )  # a client of the previous release
    moments = []
    for share, (old, new) in zip(SHARES, (("old1", "new1"), ("old2", "new2")), strict=True):
        until(lambda s=share: batch.done() >= ITEMS * s and records.done() >= RECORDS * s, f"{share:.0%} of each run")
        at, done = time.monotonic() - began, (batch.done(), records.done())
        assert done[0] < ITEMS and done[1] < RECORDS, f"a run ended before {old} was replaced: {done}"
        cluster.start_worker(new)  # this tree's worker, up before the old one goes
        up = time.monotonic() - began
        stopped = stop_gracefully(cluster.workers[old])
        moments.append(f"{old} -> {new} at {at:.1f} s ({done[0]} items, {done[1]} records done; {new} up at "
                       f"{up:.1f} s, {old} gone {stopped:.1f} s after its SIGTERM)")  # fmt: skip
    batch_result = scheduler.wait(batch_id, timeout=DEADLINE)
    job_result = scheduler.wait(job_id, timeout=DEADLINE)
    wall = time.monotonic() - began
    assert batch_result.status == "success", batch_result.error
    assert [item["label"] for item in batch_result.shared["b"]["results"]] == [str(i) for i in range(ITEMS)]
    assert batch.effects() == {str(i): 1 for i in range(ITEMS)}  # each index executed once: none lost, none again
    assert job_result.status == "success", job_result.error
    assert job_result.outputs == {"total": RECORDS, "done": RECORDS, "failed": 0}
    assert [(row["index"], row["result"]["label"]) for row in dataset_rows(job_id)] == [(i, str(i)) for i in
                                                                                        range(RECORDS)]  # fmt: skip
    assert records.effects() == {str(i): 1 for i in range(RECORDS)}
    for counts in (batch, records):  # both runs ran on both releases
        workers = counts.by_worker()
        assert {"old1", "old2"} & set(workers) and {"new1", "new2"} & set(workers), workers
    print(f"\nrolling upgrade: both runs ended {wall:.1f} s after submit; " + "; ".join(moments)
          + f"; items by worker {dict(batch.by_worker())}, records by worker {dict(records.by_worker())}")  # fmt: skip


def stop_gracefully(worker: ManagedProcess) -> float:
    """SIGTERM (Celery's warm shutdown: the task running ends first); the seconds until the worker exited by itself."""
    sent = time.monotonic()
    os.killpg(worker.pid, signal.SIGTERM)
    worker.proc.wait(timeout=DEADLINE)
    assert worker.proc.returncode == 0, f"exit status {worker.proc.returncode}; see {worker.log}"
    return time.monotonic() - sent


#: Under the previous release: read the run and decode the messages this one wrote (msgpack on stdin), print them
#: as JSON (bytes as hex).
READ_BACK = """
import dataclasses, json, sys
import msgpack
from worker.cluster import messages as m
from worker.cluster.state.runs import ClusterRuns
given = msgpack.unpackb(sys.stdin.buffer.read(), raw=False)
kinds = {"advance": m.Advance, "advance_branch": m.AdvanceBranch, "chunk": m.Chunk, "merge": m.Merge,
         "dataset_chunk": m.DatasetChunk}
out = {}
for kind, wire in given["messages"].items():
    out[kind] = dataclasses.asdict(m.Header.from_wire(wire) if kind == "header" else kinds[kind].from_wire(*wire))
runs = ClusterRuns()
out["record"] = dataclasses.asdict(runs.get(given["run"]))
out["store"] = runs.load_store(given["run"])
print(json.dumps(out, default=bytes.hex))
"""


def test_a_worker_of_the_previous_release_reads_what_this_one_writes(cluster: Cluster, old_tree: Path) -> None:
    """A downgrade: the run record and the messages of a traced run of this release (their new `trace` keys) read by
    the previous release's code as this one reads them, less `trace`."""
    trace = Later(1 << 100, 7, 0, time.time_ns()).wire()
    run_id = f"down-{uuid.uuid4().hex[:8]}"
    record = RunRecord(run_id, {"nodes": [{"id": "a", "type": "echo"}]}, "celery", "queued", "a", trace=trace)
    runs = ClusterRuns()
    runs.create(record, {"x": 1, "name": "ada"})
    assert r_get(cluster, run_id, "trace") == trace.encode()
    merge = m.Merge(run_id, "b#0", "b", 3, False, 0, trace=trace)
    header = m.Header({"id": "b"}, b"\x80", merge, "plan1")
    built = {
        "advance": m.Advance(run_id, 0), "advance_branch": m.AdvanceBranch(run_id, "s", "left", 1),
        "chunk": header.chunk(0, items=[b"\x91\x01"]), "merge": merge, "dataset_chunk": m.DatasetChunk(run_id, 0),
    }  # fmt: skip
    wires = {kind: list(message.to_wire()) for kind, message in built.items()} | {"header": header.to_wire()}
    assert wires["chunk"][0]["trace"] == wires["merge"][0]["trace"] == wires["header"]["meta"]["trace"] == trace
    given = msgpack.packb({"run": run_id, "messages": wires}, use_bin_type=True)
    read = old_python(cluster, old_tree, READ_BACK, given)
    for kind, message in {**built, "header": header}.items():
        assert_same(read[kind], as_read(message), kind)
    assert_same(read["record"], as_read(runs.get(run_id)), "record")
    assert read["store"] == runs.load_store(run_id)


def r_get(cluster: Cluster, run_id: str, field: str) -> bytes | None:
    return redis.Redis.from_url(cluster.redis.url).hget(run_key(run_id, "run"), field)


def as_read(value: Any) -> Any:
    """`value` as READ_BACK prints what it read: JSON, bytes as hex; without the `trace` keys it never knew."""
    text = json.dumps(plain(value) if dataclasses.is_dataclass(value) else value, default=bytes.hex)
    return without_trace(json.loads(text))


def without_trace(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_trace(v) for k, v in value.items() if k != "trace"}
    return value
