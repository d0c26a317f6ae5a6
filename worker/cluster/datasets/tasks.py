"""A cluster dataset job's chunks, outcomes and counts in Redis, and the task that runs one chunk.

The client adds each window of records as chunk n (`add`); every step (worker/cluster/state/lua/dataset_step.lua)
claims chunks to dispatch while fewer than `window` are in flight, so the broker never holds more than a
few chunks of a job however long its file. A finished chunk (`chordflow.dataset_chunk`) stores its
outcomes, claims the next chunks and sends them; the step that finds the job ended records its verdict.
Every key is under the run's hash tag (`cf:{<run>}:ds...`) and expires with the run.

Safe to run twice: a chunk is run only while it is pending, and finishing it is counted once. A worker
killed after finishing a chunk but before sending the chunks it claimed has its task delivered again;
that delivery finds the chunk counted and sends the claimed chunks again (a duplicate of a chunk that is
already running is run twice and counted once). Each task that begins a chunk takes its claim (`ds:claim`);
a finish whose claim was taken by a later delivery — a worker paused past the dead-delivery bound wakes up
after its chunk was delivered again (worker/cluster/broker/deliveries.py) — is refused with one WARNING line.
"""

from __future__ import annotations

import functools
import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from celery.exceptions import Ignore

from ir import snapshot
from worker import settings
from worker.batch.aggregate import ChunkResult
from worker.cluster import aging, logs, priorities, signing
from worker.cluster.app import current_app, task
from worker.cluster.batches import chunking
from worker.cluster.batches.middleware import chunk_middleware
from worker.cluster.batches.tasks import chunk_executor
from worker.cluster.broker import deliveries
from worker.cluster.state import connection
from worker.cluster.state.keys import run_key
from worker.cluster.state.runs import ClusterRuns
from worker.cluster.state.runstate import RunState, client, script
from worker.datasets.job import RECORDS, Dataset, pack_records, run_chunk, unpack_records, verdict
from worker.runs.record import FINAL

log = logging.getLogger(__name__)
#: Chunks in flight per worker process registered (at least MIN_WINDOW): enough to keep every process busy.
CHUNKS_PER_PROCESS = 2
MIN_WINDOW = 4


class ClusterDataset:
    """One dataset job's state in Redis (KEYS of dataset_step.lua, in its order)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.redis = client()
        self.ttl = settings.load().run_ttl
        names = ("ds", "ds:todo", "ds:pending", "ds:out", "ds:cov", "ds:fails", "ds:rec", "cancel")
        self.keys = [run_key(run_id, name) for name in (*names, f"abort:{RECORDS}", "ds:next", "ds:reader", "ds:claim")]
        self.started = run_key(run_id, "ds:started")  # chunks a task has begun (see `orphans`)
        self._step = script(self.redis, "dataset_step")
        self._size, self._read = 0, None  # chunk_length's, once the whole file is read

    def _run(self, mode: str, *args: Any) -> tuple[str, list[int]]:
        reply = connection.replicated(
            self.redis, self._step, self.keys, [mode, window(), self.ttl, *args], "a dataset job's step"
        )
        state = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
        return state, [int(n) for n in reply[1:]]

    # -- steps --------------------------------------------------------------------------------------
    def start(self, chunk_size: int) -> None:
        """Before the first record is read: the chunk size, and the reader's lease (see `add`)."""
        pipe = self.redis.pipeline()
        pipe.hset(self.keys[0], "size", chunk_size)
        pipe.expire(self.keys[0], self.ttl)
        pipe.set(self.keys[10], 1, ex=reader_seconds())
        pipe.execute()

    def add(self, n: int, records: Sequence[Any], bad: dict[int, str], read: int) -> tuple[str, list[int]]:
        """Store chunk n and renew the reader's lease: a job whose reader dies mid-file ends (failed, saying
        so) once its lease has run out and the chunks it stored have run."""
        return self._run("add", n, pack_records(records, bad), read, reader_seconds())

    def finish(
        self, n: int, chunk: ChunkResult, length: int, dataset: Dataset, claim: str = ""
    ) -> tuple[str, list[int]]:
        """Store chunk n's outcomes and count them, once. `claim` (from `mark_started`): refused (`stale`) unless
        it is still the chunk's claim — another delivery of the chunk started after this one."""
        complete = len(chunk.results) == length and not chunk.failures
        blob = snapshot.encode(chunk.to_wire(), label=f"records chunk {n} results")
        percent, count = dataset.tolerated_failure_percent, dataset.tolerated_failure_count
        args = [n, blob, len(chunk.results), len(chunk.failures), int(complete)]
        return self._run("finish", *args, "" if percent is None else percent, "" if count is None else count, claim)

    def read_done(self, total: int) -> tuple[str, list[int]]:
        return self._run("read_done", total)

    def check(self) -> tuple[str, list[int]]:
        return self._run("check")

    def redrive(self) -> int:
        """Queue every chunk with a failed or missing record again; returns how many records will run."""
        counts = self.counts()
        pipe = self.redis.pipeline()
        cov, fails = self.redis.hgetall(self.keys[4]), self.redis.hgetall(self.keys[5])
        again, records = [], 0
        for n in range(counts["chunks"]):
            covered, failed = int(cov.get(str(n).encode(), 0)), int(fails.get(str(n).encode(), 0))
            missing = self.chunk_length(n) - covered + failed
            if missing:
                again.append(n)
                records += missing
        pipe.hdel(self.keys[0], "stopped")
        pipe.delete(self.keys[1], self.keys[2], self.keys[8])
        if again:
            pipe.rpush(self.keys[1], *again)
        pipe.execute()
        return records

    def drop_records(self) -> None:
        """Once the job ended: it keeps its counts and outcomes (`status`, `results`) and the records a redrive runs
        again (a chunk whose records all succeeded dropped them as it finished); its reading state goes (queue,
        chunks in flight, claims, the reader's lease, the abort flag). A job whose file was never read to its end
        cannot be redriven: its records go too."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(*(self.keys[i] for i in (1, 2, 8, 9, 10, 11)), self.started)
        if not self.redis.hexists(self.keys[0], "total"):
            pipe.delete(self.keys[6])
        pipe.execute()

    # -- reading ------------------------------------------------------------------------------------
    def is_pending(self, n: int) -> bool:
        return bool(self.redis.sismember(self.keys[2], n))

    def mark_started(self, n: int) -> str:
        """A task begins chunk n: returns its claim, the chunk's until another delivery of it begins (see `finish`)."""
        claim = uuid.uuid4().hex
        pipe = self.redis.pipeline()
        pipe.sadd(self.started, n).expire(self.started, self.ttl)
        pipe.hset(self.keys[11], n, claim).expire(self.keys[11], self.ttl)
        pipe.execute()
        return claim

    def stalled(self, seconds: float | None = None) -> bool:
        """No record outcome reached the run's progress stream for more than `seconds` (Redis's clock both; default:
        the dead-delivery bound, past which a dead worker's chunk is on its way back:
        worker/cluster/broker/deliveries.py)."""
        if seconds is None:
            seconds = deliveries.dead_delivery_seconds(settings.load().visibility_timeout)
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.xrevrange(run_key(self.run_id, "events"), count=1)
        (now_s, now_us), last = pipe.execute()
        if not last:
            return False
        last_ms = int((last[0][0].decode() if isinstance(last[0][0], bytes) else last[0][0]).split("-")[0])
        return now_s + now_us / 1e6 - last_ms / 1000 > seconds

    def orphans(self) -> list[int]:
        """Once, after the reader died: chunks it claimed (pending) that no task has started — it may have
        died between claiming and sending them. A chunk sent but still queued is sent twice: counted once."""
        if self.redis.exists(self.keys[10]) or self.redis.hexists(self.keys[0], "total"):
            return []  # the reader is alive, or finished reading: everything it claimed was sent
        if not self.redis.hsetnx(self.keys[0], "resent", 1):
            return []
        started = {int(n) for n in self.redis.smembers(self.started)}
        return sorted(int(n) for n in self.redis.smembers(self.keys[2]) if int(n) not in started)

    def claimed_by(self, n: int) -> list[int]:
        raw = self.redis.hget(self.keys[9], n)
        return [int(m) for m in raw.decode().split(",") if m] if raw else []

    def records(self, n: int) -> tuple[list[Any], dict[int, str]]:
        blob = self.redis.hget(self.keys[6], n)
        if blob is None:
            raise LookupError(f"run {self.run_id}: the records of chunk {n} are missing from Redis")
        return unpack_records(blob)

    def outcomes(self, ns: Sequence[int]) -> list[ChunkResult | None]:
        blobs = self.redis.hmget(self.keys[3], list(ns)) if ns else []
        return [None if b is None else ChunkResult.from_wire(snapshot.decode(b)) for b in blobs]

    def counts(self) -> dict[str, Any]:
        raw = {k.decode(): v.decode() for k, v in self.redis.hgetall(self.keys[0]).items()}
        total = raw.get("total")
        return {
            "total": None if total is None else int(total),
            "read": int(raw.get("read", 0)),
            "done": int(raw.get("done", 0)),
            "failed": int(raw.get("failed", 0)),
            "chunks": int(raw.get("written", 0)),
            "stopped": raw.get("stopped"),
        }

    def chunk_count(self) -> int:
        return int(self.redis.hget(self.keys[0], "written") or 0)

    def chunk_size(self) -> int:
        return int(self.redis.hget(self.keys[0], "size") or 1)

    def chunk_length(self, n: int) -> int:
        """Records in chunk n: every chunk holds chunk_size records but the last, which holds the rest."""
        if self._read is None:
            size, read, total = self.redis.hmget(self.keys[0], ["size", "read", "total"])
            if total is None:
                return max(0, min(int(size or 1), int(read or 0) - n * int(size or 1)))
            self._size, self._read = int(size), int(total)  # no longer changes: the file is read
        return max(0, min(self._size, self._read - n * self._size))


def reader_seconds() -> int:
    """How long a reader's lease lasts without renewal: three worker heartbeats (CHORDFLOW_WORKER_HEARTBEAT)."""
    return 3 * settings.load().worker_heartbeat


@functools.cache
def window() -> int:
    """Chunks a job keeps in flight: CHUNKS_PER_PROCESS per worker process registered (read once per process)."""
    processes = chunking.registered_processes(settings.load().result_backend) or chunking.FALLBACK_PROCESSES
    return max(MIN_WINDOW, CHUNKS_PER_PROCESS * processes)


def send(run_id: str, ns: Sequence[int]) -> None:
    """The job's claimed chunks, at the run's priority (worker/cluster/priorities.py)."""
    if not ns:
        return
    app, priority = current_app(), ClusterRuns().priority(run_id)
    for n in ns:
        aging.send(
            app, "chordflow.dataset_chunk", (run_id, n), run_id=run_id, priority=priority, kind=priorities.CHUNK,
            argsrepr=f"records chunk={n} run={run_id}",
        )  # fmt: skip


def finish_run(run_id: str, runs: ClusterRuns | None = None) -> str:
    """Record the verdict of a job that ended (idempotent: a run already final is left as it is)."""
    runs = runs or ClusterRuns()
    record = runs.get(run_id)
    if record is None or record.status in FINAL or record.dataset is None:
        return "fenced"
    dataset, ds = Dataset.from_json(record.dataset), ClusterDataset(run_id)
    counts = ds.counts()
    status, error = verdict(dataset, counts, RunState(run_id).cancelled(), ds)
    ds.drop_records()  # first: whoever sees the job ended sees it trimmed (its verdict is made of what stays)
    runs.set_status(run_id, status, error)  # trims the run's keys (ClusterRuns.trim), the per-record progress too
    done, failed = counts["done"], counts["failed"]
    logs.transition(run_id, record.status, status, node=RECORDS, items=done, failed=failed, error=error)
    return status


def go_on(run_id: str, state: str, claimed: list[int]) -> None:
    """After a step: send what it claimed; record the verdict when the job ended."""
    send(run_id, claimed)
    if state == "end":
        finish_run(run_id)


def refuse(runs: ClusterRuns, run_id: str, status: str, exc: signing.WorkflowAltered) -> str:
    """A job whose record was altered stops (chunks in flight run no more records) and ends failed: one WARNING
    line, the transition's, from the first chunk that saw it (the others find the job ended)."""
    RunState(run_id).abort(RECORDS)
    if status not in FINAL:
        runs.set_exception(run_id, exc)
        error = f"{type(exc).__name__}: {exc}"
        runs.set_status(run_id, "failed", error)
        logs.transition(run_id, status, "failed", node=RECORDS, error=error)
    return "refused"


@task(name="chordflow.dataset_chunk", bind=True, acks_late=True, ignore_result=True)
def dataset_chunk(self: Any, run_id: str, n: int) -> str:
    """Run chunk n of dataset job `run_id` (its records without a successful outcome), store its outcomes,
    send the chunks that keeps in flight, and record the verdict when it was the last."""
    ds = ClusterDataset(run_id)
    if not ds.is_pending(n):  # delivered again after it was counted: send what it claimed, if still due
        go_on(run_id, ds.check()[0], [m for m in ds.claimed_by(n) if ds.is_pending(m)])
        return "duplicate"
    deliveries.fence_start(self, "records chunk")  # a stale delivery never takes the claim (broker/deliveries.py)
    claim = ds.mark_started(n)
    runs = ClusterRuns()
    record = runs.get(run_id)
    if record is None or record.dataset is None:
        return "fenced"
    try:
        signing.check_run(self.app.signer, run_id, record)  # the workflow and dataset a key holder recorded
    except signing.WorkflowAltered as exc:
        return refuse(runs, run_id, record.status, exc)
    if record.status == "queued":
        runs.set_status(run_id, "running")
        logs.transition(run_id, "queued", "running", node=RECORDS)
    dataset = Dataset.from_json(record.dataset)
    state = RunState(run_id)
    size = ds.chunk_size()
    records, bad = ds.records(n)
    done = ds.outcomes([n])[0]
    chunk = ChunkResult(n * size, [], [], {})
    began, ran, failed = time.monotonic(), 0, 0
    if not state.should_stop(RECORDS):
        executor = chunk_executor(dataset.record_spec(record.workflow).wire(), runs.load_store(run_id))
        chunk = run_chunk(
            executor, records, bad, n * size, done,
            lambda count: chunk_middleware(state, RECORDS, False),
        )  # fmt: skip
        kept = len(done.results) - len(done.failures) if done is not None else 0  # a redrive's successes: not run
        ran, failed = len(chunk.results) - kept, len(chunk.failures)
    elif done is not None:
        chunk = done
    logs.chunk(run_id, RECORDS, f"{RECORDS}:{n}", n * size, ran, failed, time.monotonic() - began)
    step, claimed = ds.finish(n, chunk, len(records), dataset, claim)
    if step == "stale":  # this worker was paused (or cut off) past the bound: another delivery holds the chunk
        log.warning("run %s: records chunk %d was delivered again meanwhile: this outcome is dropped", run_id, n)
        raise Ignore()  # not a success: the chunk's task is the new delivery's to end
    go_on(run_id, step, claimed)
    return "finished"
