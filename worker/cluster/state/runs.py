"""Run records and checkpoints of cluster runs, in Redis: the same interface as the embedded store.

Every key of a run carries the hash tag `{<run_id>}` (`cf:{r1}:run`, `cf:{r1}:store`...), so a script
touches one slot and the state can move to Redis Cluster sharded by run id. The store is a hash of
top-level key -> snapshot-codec bytes; a checkpoint (worker/cluster/state/lua/checkpoint.lua) writes only the keys a
node changed, fenced on the step number, with the step's action and hashes (`steps`) and what the keys
it overwrote held before (`undo`, for `rewind`). `cf:runs` (created time per run id) lists recent runs.
With a signer (a client holding the cluster's key), a record's workflow and dataset job are signed as they are
written (`workflow_sig`); workers refuse a run whose record does not match (worker/cluster/signing.py check_run).
A purge leaves the run's tombstone (keys.py `purged_key`) for a run TTL: a task of the run still in flight finds its
writes refused (the Lua scripts, `set_status`) and stops, so nothing of the run comes back.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

import redis

from ir import snapshot
from ir.errors import RunPurged
from worker import settings, tracing
from worker.batch import overrides
from worker.batch.aggregate import ChunkResult
from worker.batch.rows import Row, rows_of_aggregate, rows_of_chunks
from worker.cluster.state import waits
from worker.cluster.state.budget import micro
from worker.cluster.state.keys import QUEUED, RUNS, TIMERS, WINDOWS, RunKeys, purged_key
from worker.cluster.state.once import once
from worker.cluster.state.runstate import client
from worker.engine.steps import Step
from worker.runs.record import FINAL, RunRecord, TrailStep, trail_action

#: Keys deleted per DEL when a run is trimmed or purged.
DELETE_BATCH = 500
#: The step of a per-batch key's name after the run's prefix (`result:b#3`, `snap:b#3:<sha>`, `chunks:b#3`).
BATCH_STEP = re.compile(r"#(\d+)(?::|$)")


class ClusterRuns:
    """Run records and checkpoints of runs the workers drive (a RunStore, worker/runs/store.py); the keys it owns:
    worker/cluster/state/keys.py."""

    #: A cluster run goes on without the process that submitted it.
    durable = True
    where = "Redis"

    def __init__(self, redis_client: redis.Redis | None = None, ttl: int | None = None, signer: Any = None):
        """`signer`: signs each workflow this store records (a worker/cluster/signing.py Signer); None: unsigned."""
        self.redis = redis_client or client()
        self.ttl = ttl or settings.load().run_ttl
        self.signer = signer
        self._checkpoint = once(self.redis, "checkpoint")
        self._update = once(self.redis, "update_run")

    def _signed(self, run_id: str, fields: dict[str, Any]) -> dict[str, Any]:
        """`fields` plus the signature of the workflow and dataset they write, as a worker will decode them: what
        this process was given, never what Redis holds (signing that would bless whatever was written there)."""
        if self.signer is not None:
            dataset = json.loads(fields["dataset"]) if fields.get("dataset") else None
            fields["workflow_sig"] = self.signer.sign_run(run_id, json.loads(fields["workflow"]), dataset)
        return fields

    # -- records ------------------------------------------------------------------------------------
    def create(self, record: RunRecord, store: Mapping[str, Any], encoded: Mapping[str, bytes] | None = None) -> None:
        """Record a new run with its first store: `store` values, and `encoded` ones already in the codec."""
        now = time.time()
        record.created = record.updated = now
        fields = {
            "run_id": record.run_id, "workflow": json.dumps(record.workflow), "backend": record.backend,
            "status": record.status, "node": record.node or "", "step": record.step, "error": record.error or "",
            "created": now, "updated": now, "source": record.source or "", "batches": "{}",
            "dataset": json.dumps(record.dataset) if record.dataset else "", "priority": record.priority,
            "format": record.format,
        }  # fmt: skip
        record.trace = record.trace or _begun()
        if record.trace:
            fields["trace"] = record.trace
        keys, pipe = RunKeys(record.run_id), self.redis.pipeline()
        values = {**(encoded or {}), **{k: snapshot.encode(v, label=k) for k, v in store.items()}}
        if values:
            pipe.hset(keys.store, mapping=values)
            pipe.expire(keys.store, self.ttl)
        pipe.hset(keys.run, mapping=self._signed(record.run_id, fields))
        pipe.expire(keys.run, self.ttl)
        pipe.zadd(RUNS, {record.run_id: now})
        pipe.delete(purged_key(record.run_id))  # a run id given again (the Python API) after its run was purged
        pipe.execute()

    def get(self, run_id: str) -> RunRecord | None:
        raw = self.redis.hgetall(RunKeys(run_id).run)
        return _record(raw) if raw else None

    def recent(self, status: str | None = None, limit: int = 20) -> list[RunRecord]:
        """Newest first; ids whose record expired are dropped from the index on the way."""
        found: list[RunRecord] = []
        for run_id in self.redis.zrevrange(RUNS, 0, -1):
            record = self.get(run_id.decode())
            if record is None:
                self.redis.zrem(RUNS, run_id)
                continue
            if status is None or record.status == status:
                found.append(record)
                if len(found) >= limit:
                    break
        return found

    def ids_starting(self, prefix: str, limit: int) -> list[str]:
        """From the index of runs (a run id holds no glob character: valid_run_id)."""
        found: list[str] = []
        for run_id, _ in self.redis.zscan_iter(RUNS, match=f"{prefix}*", count=1000):
            found.append(run_id.decode())
            if len(found) >= limit:
                break
        return found

    def set_status(self, run_id: str, status: str, error: str | None = None, node: str | None = None) -> None:
        """RunPurged, writing nothing, for a purged run (`_live`)."""
        fields: dict[str, Any] = {"status": status, "error": error or "", "updated": time.time()}
        if node is not None:
            fields["node"] = node
        keys = RunKeys(run_id)
        if tracing.ON and status in FINAL:
            self._end_span(run_id, status, error)
        with self._live(run_id) as pipe:  # MULTI: whoever sees the run ended sees it trimmed
            if status in ("queued", "running"):
                pipe.hdel(keys.run, "exception")
            pipe.hset(keys.run, mapping=fields)
            if status in FINAL:  # wake whoever follows the run's stream (`wait`) now, not at its next poll
                pipe.xadd(keys.events, {"batch": "", "end": status})
                pipe.expire(keys.events, self.ttl)
                self.trim(run_id, status, pipe)

    def _end_span(self, run_id: str, status: str, error: str | None) -> None:
        """Emit the run's span as it ends: once, by the write that moves it to a final status."""
        before, trace = self.redis.hmget(RunKeys(run_id).run, "status", "trace")
        later = tracing.Later.parse(trace)
        if later is not None and (before or b"").decode() not in FINAL:
            with tracing.within(run_id):
                later.end("chordflow run", {"chordflow.status": status}, error if status == "failed" else None)

    @contextlib.contextmanager
    def _live(self, run_id: str) -> Iterator[redis.client.Pipeline]:
        """A transaction (MULTI, executed on leaving) that writes nothing of a purged run and raises RunPurged instead:
        a task of the run still in flight must not bring its record back. It watches the run's tombstone, so a purge
        between the check and EXEC cancels the writes too (two more round trips: for a run's few transitions)."""
        tombstone = purged_key(run_id)
        with self.redis.pipeline() as pipe:
            try:
                pipe.watch(tombstone)
                if pipe.exists(tombstone):
                    raise RunPurged(f"run {run_id} was purged: nothing of it is written")
                pipe.multi()
                yield pipe
                pipe.execute()
            except redis.WatchError:
                raise RunPurged(f"run {run_id} was purged: nothing of it is written") from None

    def signal(self, run_id: str, event: str, data: Any) -> None:
        """Keep `event` with its data until a wait of the run takes it; a run waiting for it goes on now."""
        waits.signal(self.redis, run_id, event, data, self.ttl)

    def priority(self, run_id: str) -> str:
        """The run's priority ('normal' for a run recorded without one)."""
        value = self.redis.hget(RunKeys(run_id).run, "priority")
        return value.decode() if value else "normal"

    def trim(self, run_id: str, status: str, pipe: redis.client.Pipeline | None = None) -> None:
        """A run that ended keeps what `status`, `results` and a resume read (its record, store, trail, steps, undo
        log, kept chunks, totals, its stop flags for chunks still queued) and the end marker of its stream; the
        rest goes now, not at its TTL: snapshots, merged results and dispatch marks (a resume clears them anyway),
        failure counts, per-item progress, the messages aging watched (worker/cluster/aging.py), and once it
        succeeded the branches kept for a resume mid-section.
        `pipe`: the deletes join it (set_status's transaction), else they are sent at once."""
        keys = RunKeys(run_id)  # "": every batch's (section's) key of the kind; `queued` covers `queued_msgs` too
        names = [keys.snapshots, keys.result(""), keys.dispatched(""), keys.failed(""), keys.window("").plan]
        names.append(keys.queued)
        if status == "succeeded":  # only a resume reads them (a failed run's, mid-section)
            names += [keys.branches(""), keys.joined("")]
        gone = tuple(name.encode() for name in names)
        stale = [k for k in self._keys(run_id) if k.startswith(gone)]
        own = pipe is None
        pipe = self.redis.pipeline(transaction=False) if pipe is None else pipe
        for i in range(0, len(stale), DELETE_BATCH):
            pipe.delete(*stale[i : i + DELETE_BATCH])
        pipe.xtrim(keys.events, maxlen=1, approximate=False)  # the end marker `wait` wakes on stays
        if own:
            pipe.execute()

    def purge(self, run_id: str) -> None:
        """Every key under the run's prefix (found with SCAN) and its entries in `cf:runs`, `cf:{queued}`,
        `cf:{windows}` and `cf:{timers}` (`chordflow purge`). Its tombstone goes first and stays for a run TTL (every
        message of the run expires before it): from then on a task of the run writes nothing, so nothing comes back
        after the keys go."""
        try:
            self.redis.set(purged_key(run_id), 1, ex=self.ttl)
        except redis.exceptions.OutOfMemoryError:  # Redis full: the keys go first, making room for the tombstone
            self._delete(run_id)
            self.redis.set(purged_key(run_id), 1, ex=self.ttl)
        self._delete(run_id)

    def _delete(self, run_id: str) -> None:
        names = list(self._keys(run_id))
        pipe = self.redis.pipeline(transaction=False)
        for i in range(0, len(names), DELETE_BATCH):
            pipe.delete(*names[i : i + DELETE_BATCH])
        pipe.zrem(RUNS, run_id)
        pipe.zrem(QUEUED, run_id)
        windows = [m for m, _ in self.redis.zscan_iter(WINDOWS, match=_glob(f"{run_id}|") + "*", count=1000)]
        if windows:  # a batch window still counted open (state/windows.py): it would be, for up to 30 s
            pipe.zrem(WINDOWS, *windows)
        timers = [m for m, _ in self.redis.zscan_iter(TIMERS, match=_glob(f"{run_id}|") + "*", count=1000)]
        if timers:  # a cancelled run's wait, not yet swept
            pipe.zrem(TIMERS, *timers)
        pipe.execute()

    def abandon(self, record: RunRecord, status: str, error: str) -> None:
        """A submit that stopped part-way (Redis out of memory, a bad records file, Ctrl-C): everything it wrote
        goes first (deleting frees memory even when Redis refuses writes: no tombstone, which the record written
        again would take away), then the record alone is written again, saying why (`status` shows it; there is
        nothing to resume or read)."""
        self._delete(record.run_id)
        record.status, record.error = status, error
        self.create(record, {})

    def _keys(self, run_id: str) -> Iterator[bytes]:
        return self.redis.scan_iter(match=_glob(RunKeys(run_id).prefix) + "*", count=1000)

    def update(self, run_id: str, changes: dict[str, Any]) -> str:
        """Set a queued or running run's changed limits (its `overrides`) and add them to its record's `updates`
        history, atomically (lua/update_run.lua); returns 'ok', 'unknown' or the status of a run that ended."""
        stored = {**changes, **({"budget_usd": micro(changes["budget_usd"])} if "budget_usd" in changes else {})}
        pairs = [v for name, value in stored.items() for v in (name, value)]
        ended_too = "1" if overrides.budget_only(changes) else "0"  # a budget raised on a run over it, to resume
        args = [time.time(), self.ttl, json.dumps(changes), ended_too, *pairs]
        keys = RunKeys(run_id)
        return self._update(keys=[keys.run, keys.overrides], args=args).decode()

    def set_exception(self, run_id: str, exc: BaseException) -> None:
        """What `wait` raises again for a run that failed with an exception (module, type, message)."""
        kind = type(exc)
        with self._live(run_id) as pipe:  # never a record of a purged run, holding this field alone and no TTL
            pipe.hset(RunKeys(run_id).run, "exception", json.dumps([kind.__module__, kind.__name__, str(exc)]))

    def exception(self, run_id: str) -> tuple[str, str, str] | None:
        raw = self.redis.hget(RunKeys(run_id).run, "exception")
        return tuple(json.loads(raw)) if raw else None  # type: ignore[return-value]

    def owner(self, run_id: str) -> None:
        """None: the workers drive a cluster run, no one process."""
        return None

    # -- checkpoints --------------------------------------------------------------------------------
    def checkpoint(self, run_id: str, step: int, result: Step, batch: dict[str, int] | None = None) -> bool:
        args: list[Any] = [step, result.next_node or "", result.node, time.time(), self.ttl]
        entry = json.dumps([trail_action(result.action), result.config, result.reads])  # this step in the `steps` list
        args += [json.dumps(batch) if batch else "", entry]
        args += [len(result.deleted), *result.deleted]
        for name, value in result.changed.items():
            args += [name, snapshot.encode(value, label=f"store key '{name}'")]
        k = RunKeys(run_id)
        return bool(self._checkpoint(keys=[k.run, k.store, k.trail, k.steps, k.undo], args=args))

    def load_store(self, run_id: str) -> dict[str, Any]:
        return {k.decode(): snapshot.decode(v) for k, v in self.redis.hgetall(RunKeys(run_id).store).items()}

    def load_key(self, run_id: str, key: str) -> Any:
        blob = self.redis.hget(RunKeys(run_id).store, key)
        return None if blob is None else snapshot.decode(blob)

    def trail(self, run_id: str) -> list[str]:
        return [n.decode() for n in self.redis.lrange(RunKeys(run_id).trail, 0, -1)]

    def steps(self, run_id: str) -> list[TrailStep]:
        """The steps completed so far, in order, with their actions and hashes (steps recorded before
        checkpoints kept them come first, without)."""
        nodes = self.trail(run_id)
        found = [json.loads(raw) for raw in self.redis.lrange(RunKeys(run_id).steps, 0, -1)]
        unlogged = len(nodes) - len(found)
        return [TrailStep(n) if i < unlogged else TrailStep(n, *found[i - unlogged]) for i, n in enumerate(nodes)]

    # -- the primitives of `rewind` (worker/runs/store.py) ------------------------------------------------
    def undo_from(self, run_id: str, step: int) -> dict[str, Any]:
        undo = RunKeys(run_id).undo
        first: dict[bytes, tuple[int, bytes]] = {}  # key -> (its first step from `step` on, that undo field)
        for field in self.redis.hkeys(undo):
            at, _, name = field.partition(b":")
            if int(at) >= step and (name not in first or int(at) < first[name][0]):
                first[name] = (int(at), field)
        olds = self.redis.hmget(undo, [field for _, field in first.values()]) if first else []
        return {
            name.decode(): old[1:] if old is not None and old.startswith(b"v") else None
            for name, old in zip(first, olds, strict=True)
        }

    def cut(self, run_id: str, step: int, before: dict[str, Any]) -> None:
        k = RunKeys(run_id)
        undo = k.undo
        dropped = [field for field in self.redis.hkeys(undo) if int(field.partition(b":")[0]) >= step]
        batches = self._batch_keys(run_id, step)
        pipe = self.redis.pipeline()
        for name, old in before.items():
            if old is not None:
                pipe.hset(k.store, name, old)
            else:
                pipe.hdel(k.store, name)
        if dropped:
            pipe.hdel(undo, *dropped)
        for name in (k.trail, k.steps):
            if step:
                pipe.ltrim(name, 0, step - 1)
            else:
                pipe.delete(name)
        if batches["keys"]:
            pipe.delete(*batches["keys"])
        if batches["totals"]:
            pipe.hdel(k.totals, *batches["totals"])
        pipe.hset(k.run, mapping={"step": step, "updated": time.time()})
        pipe.execute()

    def _batch_keys(self, run_id: str, step: int) -> dict[str, list[Any]]:
        """The Redis keys (and `totals` fields) of the run's batches keyed `<node>#<n>` with n >= step."""
        keys = RunKeys(run_id)
        prefix = keys.prefix
        stale = [
            name
            for name in self.redis.scan_iter(match=prefix + "*#*", count=1000)
            if (found := BATCH_STEP.search(name.decode()[len(prefix) :])) and int(found.group(1)) >= step
        ]
        totals = [f for f in self.redis.hkeys(keys.totals) if int(f.rsplit(b"#", 1)[1]) >= step]
        return {"keys": stale, "totals": totals}

    def set_workflow(self, run_id: str, workflow: dict[str, Any], source: str | None, node: str | None) -> None:
        """Give a run an edited workflow and the node it goes on with (None: the flow has ended). Signed as a plain
        run's: a dataset job is redriven, never given a workflow (its record would not verify)."""
        fields = {"workflow": json.dumps(workflow), "node": node or "", "updated": time.time()}
        if source:
            fields["source"] = source
        self.redis.hset(RunKeys(run_id).run, mapping=self._signed(run_id, fields))

    # -- branches of a parallel section (worker/cluster/advance.py ClusterSections) ---------------------------
    def save_branch(self, run_id: str, section: str, branch: str, value: bytes) -> None:
        name, pipe = RunKeys(run_id).branches(section), self.redis.pipeline()
        pipe.hset(name, branch, value)
        pipe.expire(name, self.ttl)
        pipe.execute()

    def load_branches(self, run_id: str, section: str) -> dict[str, Any]:
        raw = self.redis.hgetall(RunKeys(run_id).branches(section))
        return {b.decode(): snapshot.decode(v) for b, v in raw.items()}

    def reset_join(self, run_id: str, section: str, finished: list[str]) -> None:
        """Before the branches start (again): only the finished ones count as joined."""
        name = RunKeys(run_id).joined(section)
        pipe = self.redis.pipeline()
        pipe.delete(name)
        if finished:
            pipe.sadd(name, *finished)
        pipe.expire(name, self.ttl)
        pipe.execute()

    def join(self, run_id: str, section: str, branch: str) -> int:
        """An ended branch joins its section; returns how many have (atomic: MULTI/EXEC). A branch counted
        twice (a redelivered task) counts once, so only the last branch to end sees them all."""
        name = RunKeys(run_id).joined(section)
        pipe = self.redis.pipeline(transaction=True)
        pipe.sadd(name, branch)
        pipe.scard(name)
        pipe.expire(name, self.ttl)
        _, count, _ = pipe.execute()
        return int(count)

    # -- batch outcomes, stored per chunk -------------------------------------------------------------
    def keep_chunks(self, run_id: str, batch: str, blobs: list[bytes]) -> list[ChunkResult]:
        """Store a batch's new chunk outcomes (the chunks' results, as they came) beside those an earlier,
        cut-short dispatch kept; returns the chunks the batch's outcomes are made of, in index order: the
        new ones and the earlier ones they do not overlap (those the new ones cover are dropped)."""
        name = RunKeys(run_id).kept_chunks(batch)
        new = [(chunk, blob) for blob in blobs if (chunk := ChunkResult.from_wire(snapshot.decode(blob))).results]
        spans = [(c.start, c.start + len(c.results)) for c, _ in new]
        kept, stale = [], []
        for chunk in self.saved_chunks(run_id, batch):
            end = chunk.start + len(chunk.results)
            covered = any(start < end and chunk.start < stop for start, stop in spans)
            (stale if covered else kept).append(chunk)
        pipe = self.redis.pipeline()
        if stale:
            pipe.hdel(name, *[str(c.start) for c in stale])
        if new:
            pipe.hset(name, mapping={str(c.start): blob for c, blob in new})
        pipe.expire(name, self.ttl)
        pipe.execute()
        return sorted([*kept, *(c for c, _ in new)], key=lambda c: c.start)

    def save_chunks(
        self, run_id: str, batch: str, chunks: list[ChunkResult], counts: dict[str, int] | None = None
    ) -> None:
        """Keep outcomes a dispatch of `batch` does not run again (a redrive's succeeded items); the counts go in
        `totals` when the batch is dispatched."""
        self.keep_chunks(run_id, batch, [snapshot.encode(c.to_wire()) for c in chunks])

    def saved_chunks(self, run_id: str, batch: str) -> list[ChunkResult]:
        blobs = self.redis.hgetall(RunKeys(run_id).kept_chunks(batch))
        chunks = [ChunkResult.from_wire(snapshot.decode(blob)) for blob in blobs.values()]
        return sorted(chunks, key=lambda c: c.start)

    def batch_rows(self, run_id: str, node: str) -> Iterator[Row]:
        """The items of node's last batch, streamed from its stored chunks a few at a time (what finished,
        for a batch cut short); LookupError when the node has no batch results."""
        keys = RunKeys(run_id)
        dispatches = [b.decode() for b in self.redis.hkeys(keys.totals) if b.decode().split("#")[0] == node]
        if dispatches:
            name = keys.kept_chunks(max(dispatches, key=lambda b: int(b.rsplit("#", 1)[1])))
            starts = sorted(int(start) for start in self.redis.hkeys(name))
            if starts:
                return rows_of_chunks(self._chunks(name, starts))
        blob = self.redis.hget(keys.store, node)  # a batch that dispatched nothing (no items)
        if blob is None:
            raise LookupError(f"run {run_id} has no batch results for node '{node}'")
        return rows_of_aggregate(lambda: io.BytesIO(blob))

    def _chunks(self, name: str, starts: list[int], per_read: int = 8) -> Iterator[ChunkResult]:
        for i in range(0, len(starts), per_read):
            for blob in self.redis.hmget(name, [str(s) for s in starts[i : i + per_read]]):
                if blob is not None:
                    yield ChunkResult.from_wire(snapshot.decode(blob))


def _record(raw: dict[bytes, bytes]) -> RunRecord:
    f = {k.decode(): v.decode() for k, v in raw.items()}
    return RunRecord(
        f["run_id"], json.loads(f["workflow"]), f["backend"], f["status"], f["node"] or None, int(f["step"]),
        f["error"] or None, float(f["created"]), float(f["updated"]), f["source"] or None, json.loads(f["batches"]),
        json.loads(f["dataset"]) if f.get("dataset") else None, f.get("workflow_sig") or None,
        json.loads(f["updates"]) if f.get("updates") else [],
        f.get("priority") or "normal", int(f.get("format") or 0),
        json.loads(f["waiting"]) if f.get("waiting") else None, f.get("trace") or None,
    )  # fmt: skip


def _begun() -> str | None:
    """A new run's span, begun as it is recorded; None when tracing is off."""
    later = tracing.Later.begin()
    return later.wire() if later else None


def _glob(text: str) -> str:
    """`text` as a SCAN pattern matching itself only (a run id given to the Python API may hold `*`, `?`, `[`)."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)
