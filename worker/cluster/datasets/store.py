"""A cluster dataset job's state in Redis (`ClusterDataset`): its chunks of records, outcomes, counts, claims and
reader lease, stepped by worker/cluster/state/lua/dataset_step.lua. What a client reading a job's rows or
progress needs, without Celery (the task that runs a chunk is tasks.py's)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from typing import Any

from ir import snapshot
from worker import settings
from worker.batch.aggregate import ChunkResult
from worker.cluster.batches import chunking
from worker.cluster.state import connection
from worker.cluster.state.keys import RunKeys
from worker.cluster.state.once import once
from worker.cluster.state.runstate import client
from worker.datasets.job import RECORDS, Dataset, outcome_and_calls, pack_records, unpack_records

#: Chunks in flight per worker process registered (at least MIN_WINDOW): enough to keep every process busy.
CHUNKS_PER_PROCESS = 2
MIN_WINDOW = 4


class ClusterDataset:
    """One dataset job's state in Redis (KEYS of dataset_step.lua, in its order)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.redis = client()
        self.ttl = settings.load().run_ttl
        run = RunKeys(run_id)
        ds = run.dataset
        self.keys = [ds.job, ds.todo, ds.pending, ds.out, ds.cov, ds.fails, ds.rec, run.cancel, run.abort(RECORDS)]
        self.keys += [ds.next, ds.reader, ds.claim, run.tombstone]
        self.started = ds.started  # chunks a task has begun (see `orphans`)
        self.events = run.events
        self._step = once(self.redis, "dataset_step")
        self._size, self._read = 0, None  # chunk_length's, once the whole file is read
        self._lease = 0  # the reader's lease, in seconds: read once per reader (`start`, `add`)

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
        pipe.set(self.keys[10], 1, ex=self._reader_lease())
        pipe.execute()

    def add(self, n: int, records: Sequence[Any], bad: dict[int, str], read: int) -> tuple[str, list[int]]:
        """Store chunk n and renew the reader's lease: a job whose reader dies mid-file ends (failed, saying
        so) once its lease has run out and the chunks it stored have run."""
        return self._run("add", n, pack_records(records, bad), read, self._reader_lease())

    def _reader_lease(self) -> int:
        """`reader_seconds()`, read once per reader: `add` renews the lease with it per chunk."""
        self._lease = self._lease or reader_seconds()
        return self._lease

    def finish(
        self, n: int, chunk: ChunkResult, length: int, dataset: Dataset, claim: str = ""
    ) -> tuple[str, list[int]]:
        """Store chunk n's outcomes and count them, and its records' model calls, once. `claim` (from
        `mark_started`): refused (`stale`) unless it is still the chunk's claim — another delivery of the chunk started
        after this one."""
        complete = len(chunk.results) == length and not chunk.failures
        chunk, calls = outcome_and_calls(chunk)
        blob = snapshot.encode(chunk.to_wire(), label=f"records chunk {n} results")
        percent, count = dataset.tolerated_failure_percent, dataset.tolerated_failure_count
        args = [n, blob, len(chunk.results), len(chunk.failures), int(complete)]
        sums = [
            x
            for model, counts in calls.items()
            for name, value in counts.items()
            if value
            for x in (f"llm\t{model}\t{name}", value)
        ]
        return self._run(
            "finish", *args, "" if percent is None else percent, "" if count is None else count, claim, *sums
        )

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
            from worker.cluster.broker import deliveries  # it imports Celery's worker state: only when asked

            seconds = deliveries.dead_delivery_seconds(settings.load().visibility_timeout)
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.xrevrange(self.events, count=1)
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

    def chunk_inputs(self, n: int) -> tuple[int, list[Any], dict[int, str], ChunkResult | None]:
        """What a chunk's task reads before its records run, in one round trip: the chunk size, chunk n's records
        (with its bad ones) and the outcomes a previous delivery stored (None if none)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(self.keys[0], "size").hget(self.keys[6], n).hget(self.keys[3], n)
        size, blob, done = pipe.execute()
        if blob is None:
            raise LookupError(f"run {self.run_id}: the records of chunk {n} are missing from Redis")
        records, bad = unpack_records(blob)
        return int(size or 1), records, bad, None if done is None else ChunkResult.from_wire(snapshot.decode(done))

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

    def model_calls(self) -> dict[str, dict[str, int]]:
        """The counts of the job's model calls, by model (worker/llm/usage.py `summed`)."""
        calls: dict[str, dict[str, int]] = {}
        for field, value in self.redis.hgetall(self.keys[0]).items():
            if field.startswith(b"llm\t"):
                _, model, name = field.decode().split("\t")
                calls.setdefault(model, {})[name] = int(value)
        return calls

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
