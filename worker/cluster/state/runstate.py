"""Per-run state in Redis: progress stream, cancel/abort flags, snapshots, permits, chunk ids.

Every key lives under `cf:{<run_id>}:` (the hash tag keeps a run's keys, and so each Lua script, in one
Redis Cluster slot; snapshots under `cf:{<run_id>}:snap:<batch>:<sha256>`) and expires after `run_ttl`.
The Lua scripts sit beside this module in worker/cluster/state/lua/.

A purged run leaves its tombstone (keys.py `purged_key`): the stop checks a chunk makes anyway read it in the same
round trip (`should_stop`, `chunk_start`: a purged run stops, and `purged` says so with no further call), `cancelled`
raises RunPurged for it, and the scripts that write progress (publish, permits, flags, the merge) refuse to.
"""

from __future__ import annotations

import hashlib
import time
from functools import cache
from pathlib import Path
from typing import Any

import msgpack
import redis

from ir.errors import ReplicationLost, RunPurged
from worker import settings
from worker.batch import overrides
from worker.cluster import outage
from worker.cluster.state import connection
from worker.cluster.state.keys import RunKeys

_LUA = Path(__file__).with_name("lua")
#: Seconds a client driving a run (`scheduler.run(backend="celery")`) is taken as alive after its last renewal: its
#: record is in its own embedded store, so this lease is all the cluster knows of it (`keep_driver`, `driven`).
DRIVER_LEASE = 10


@cache
def script_source(name: str) -> str:
    return (_LUA / f"{name}.lua").read_text()


def script(redis_client: redis.Redis, name: str) -> Any:
    """A Lua script of worker/cluster/state/lua/, registered on a client (its KEYS/ARGV are documented in the file)."""
    return redis_client.register_script(script_source(name))


_clients: dict[str, redis.Redis] = {}


#: Connections one process keeps to the state Redis: item threads of parallel chunks (permits, progress)
#: share them and wait up to POOL_WAIT seconds for a free one, instead of failing when all are in use.
POOL_CONNECTIONS = 256
POOL_WAIT = 30


def client(url: str | None = None) -> redis.Redis:
    """One Redis client per URL per process (the result backend's server holds run state)."""
    url = url or settings.load().result_backend
    if url not in _clients:
        _clients[url] = connection.open_client(
            url, blocking=True, max_connections=POOL_CONNECTIONS, timeout=POOL_WAIT, socket_timeout=10,
            socket_connect_timeout=5, health_check_interval=30, **outage.redis_options(),
        )  # fmt: skip
    return _clients[url]


class RunState:
    """What one run's tasks share while it runs: its stop flags, progress streams, results, snapshots, permits (the
    keys it owns: worker/cluster/state/keys.py)."""

    def __init__(self, run_id: str, redis_client: redis.Redis | None = None, ttl: int | None = None):
        self.run_id = run_id
        self.redis = redis_client or client()
        self.ttl = ttl or settings.load().run_ttl
        self.keys = RunKeys(run_id)
        self.began: float | None = None  # when this process's chunk began, by Redis's clock: a later resume stops it
        self.purged = False  # the tombstone was seen: the run was purged while this process held some of it
        self._acquire = self.redis.register_script(script_source("acquire_permit"))
        self._keep = self.redis.register_script(script_source("keep_permits"))
        self._publish = self.redis.register_script(script_source("publish_progress"))
        self._finish = self.redis.register_script(script_source("finish_batch"))
        self._flag = self.redis.register_script(script_source("raise_flag"))

    # -- flags ------------------------------------------------------------------------------
    def cancel(self) -> None:
        self.redis.set(self.keys.cancel, 1, ex=self.ttl)

    def cancelled(self) -> bool:
        """Whether the run was cancelled; RunPurged if it was purged (the caller holds a task of a run that is gone)."""
        cancel, purged = self.redis.mget(self.keys.cancel, self.keys.tombstone)
        if purged is not None:
            self._gone()
        return cancel is not None

    def _gone(self) -> None:
        self.purged = True
        raise RunPurged(f"run {self.run_id} was purged: this task of it stops and writes nothing")

    def abort(self, batch: str) -> None:
        """fail_fast: the first failed item stops every other chunk of this batch (unless the run was purged)."""
        self._flag(keys=[self.keys.abort(batch), self.keys.tombstone], args=[self.ttl])

    def mark_dispatched(self, batch: str) -> bool:
        """True the first time for a batch key: a redelivered advance must not plan the batch again."""
        return bool(self.redis.set(self.keys.dispatched(batch), 1, nx=True, ex=self.ttl))

    def clear_stops(self) -> None:
        """Before a resume: no cancel flag, abort flag, dispatch mark, failure count or stored result stays; and
        `resumed` says when, by Redis's clock: a chunk that began before it (still finishing an item, it has not seen
        the flags it stopped for, cleared here) stops before its next item instead of running items the resumed
        plan runs too (and paying for a model call twice)."""
        k = self.keys
        stale = [k.cancel]
        for pattern in (k.abort("*"), k.dispatched("*"), k.result("*"), k.failed("*"), k.window("*").plan):
            stale.extend(self.redis.scan_iter(match=pattern, count=1000))
        seconds, micros = self.redis.time()
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.resumed, f"{seconds}.{micros:06d}", ex=self.ttl)
        pipe.delete(*stale)
        pipe.execute()

    def set_batch_total(self, batch: str, total: int) -> None:
        pipe = self.redis.pipeline(transaction=False)  # one round trip: a dataset's submit sets it per chunk
        pipe.hset(self.keys.totals, batch, total).expire(self.keys.totals, self.ttl)
        pipe.execute()

    def batch_total(self, batch: str) -> int:
        return int(self.redis.hget(self.keys.totals, batch) or 0)

    def _stops(self, batch: str) -> list[str]:
        stops = [self.keys.cancel, self.keys.abort(batch), self.keys.tombstone]
        return [*stops, self.keys.resumed] if self.began is not None else stops

    def should_stop(self, batch: str) -> bool:
        """The run cancelled, the batch aborted, or the run purged (then `purged` is set too): one round trip."""
        return self._stopped(self.redis.mget(self._stops(batch)))

    def _stopped(self, flags: list[bytes | None]) -> bool:
        self.purged = self.purged or flags[2] is not None
        if self.purged or any(flag is not None for flag in flags[:3]):
            return True
        resumed = flags[3] if len(flags) > 3 else None  # a resume after this chunk began: it planned the batch again
        return resumed is not None and self.began is not None and float(resumed) > self.began

    def overrides(self) -> dict[str, Any]:
        """The limits `chordflow update` changed (worker/batch/overrides.py), typed; empty when none."""
        return overrides.parse(self.redis.hgetall(self.keys.overrides))

    def chunk_start(self, batch: str) -> tuple[bool, dict[str, Any]]:
        """What a chunk reads as it starts, in one round trip: whether to stop at once (`should_stop`) and the
        run's overrides (its limits as `chordflow update` left them); and when it began, by Redis's clock (`began`:
        a resume after that stops it)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.mget(self._stops(batch))
        pipe.hgetall(self.keys.overrides)
        pipe.time()
        flags, raw, (seconds, micros) = pipe.execute()
        self.began = seconds + micros / 1_000_000
        return self._stopped(flags), overrides.parse(raw)

    # -- progress ---------------------------------------------------------------------------
    def publish(
        self, batch: str, outcomes: list[tuple[int, bool]], failures: tuple[int, int, int] | None = None
    ) -> None:
        """Append outcomes to the run's stream. `failures` (chunk start, the chunk's failed items so far,
        the most the batch tolerates): also count them, and abort the batch once it has more. Nothing is written for a
        purged run (`purged` is set: the chunk stops at its next stop check and reports nothing)."""
        keys, args = [self.keys.events, self.keys.tombstone], [batch, msgpack.packb(outcomes), self.ttl]
        if failures is not None:
            keys += [self.keys.failed(batch), self.keys.abort(batch)]
            args += list(failures)
        try:
            written = connection.replicated(self.redis, self._publish, keys, args, "a chunk's outcomes")
            self.purged = self.purged or not written
        except ReplicationLost:
            self.abort(batch)  # the batch fails with this chunk: the others stop between items
            raise

    def read_progress(self, last_id: str, block_ms: int) -> tuple[str, list[tuple[str, bytes | None]]]:
        """Entries after `last_id` (waits up to block_ms): (new last id, [(batch, packed outcomes)]).

        Outcomes stay packed (`unpack_outcomes`) so a scheduler nobody listens to skips decoding them;
        an entry with `None` instead marks the end of that batch: its result is stored.
        """
        reply = self.redis.xread({self.keys.events: last_id}, block=block_ms or None, count=1000)
        batches: list[tuple[str, bytes | None]] = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                batches.append((fields[b"batch"].decode(), fields.get(b"b")))
        return last_id, batches

    def publish_branch_event(self, event: dict[str, Any]) -> None:
        """A parallel branch's event (`parallel_state` without its state, `parallel_error`, `branch_complete`)
        on the run's branch stream, for whoever follows the run (`wait`)."""
        fields = {
            k: str(v) for k, v in event.items() if k in ("type", "branch", "node", "error", "ok") and v is not None
        }
        pipe = self.redis.pipeline()
        pipe.xadd(self.keys.branch_events, fields)
        pipe.expire(self.keys.branch_events, self.ttl)
        pipe.execute()

    def read_branch_events(self, last_id: str) -> tuple[str, list[dict[str, Any]]]:
        """Branch events after `last_id` (no wait): (new last id, events)."""
        reply = self.redis.xread({self.keys.branch_events: last_id}, count=1000)
        found = []
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
                event: dict[str, Any] = {k.decode(): v.decode() for k, v in fields.items()}
                if "ok" in event:
                    event["ok"] = event["ok"] == "True"
                found.append(event)
        return last_id, found

    @staticmethod
    def unpack_outcomes(packed: bytes) -> list[tuple[int, bool]]:
        return msgpack.unpackb(packed)

    def finish_batch(self, batch: str, result: bytes) -> None:
        """Store a batch's merged result, then announce it on the stream (one atomic script); RunPurged (nothing
        written) for a purged run."""
        keys = [self.keys.result(batch), self.keys.events, self.keys.tombstone]
        if not self._finish(keys=keys, args=[result, batch, self.ttl]):
            self._gone()

    def batch_result(self, batch: str) -> bytes | None:
        return self.redis.get(self.keys.result(batch))

    # -- snapshots ---------------------------------------------------------------------------
    def store_snapshot(self, blob: bytes, batch: str = "") -> str:
        """Stores the bytes once per batch under their content hash; chunk messages carry only the key.
        Deleted when the batch is merged (`drop_snapshot`) or the run ends (`drop_snapshots`)."""
        key = self.keys.snapshot(batch, hashlib.sha256(blob).hexdigest())
        self.redis.set(key, blob, ex=self.ttl)
        return key

    def drop_snapshot(self, key: str) -> None:
        self.redis.delete(key)

    def drop_snapshots(self) -> None:
        """Every snapshot of the run: none is needed once it ended (a resume stores its batch's again)."""
        stale = list(self.redis.scan_iter(match=self.keys.snapshots + "*", count=1000))
        if stale:
            self.redis.delete(*stale)

    def load_snapshot(self, key: str) -> bytes:
        blob = self.redis.get(key)
        if blob is None:
            raise LookupError(f"snapshot {key} is missing from Redis (expired after {self.ttl}s, or flushed)")
        return blob

    # -- chunks and permits -----------------------------------------------------------------
    def record_chunks(self, task_ids: list[str]) -> None:
        pipe = self.redis.pipeline()
        pipe.rpush(self.keys.chunk_ids, *task_ids)
        pipe.expire(self.keys.chunk_ids, self.ttl)
        pipe.execute()

    def chunk_ids(self) -> list[str]:
        return [t.decode() for t in self.redis.lrange(self.keys.chunk_ids, 0, -1)]

    def acquire_permit(self, batch: str, token: str, limit: int, lease: float, reclaim: str | None = None) -> bool:
        """Take or renew `token`'s permit for `lease` seconds; `reclaim`: a chunk's token prefix, whose earlier
        deliveries' permits are taken back first (acquire_permit.lua)."""
        now = time.time()
        keys = [self.keys.permits(batch), self.keys.overrides, self.keys.tombstone]  # overrides: `chordflow update`
        args = [token, limit, now + lease, now, self.ttl] + ([reclaim] if reclaim else [])
        return bool(self._acquire(keys=keys, args=args))

    def keep_permits(self, batch: str, tokens: list[str], limit: int, lease: float) -> set[str]:
        """Extend the leases of `tokens` (permits whose items may be in flight); the tokens lost (keep_permits.lua)."""
        now = time.time()
        keys = [self.keys.permits(batch), self.keys.overrides, self.keys.tombstone]
        lost = self._keep(keys=keys, args=[now + lease, now, limit, self.ttl, *tokens])
        return {token.decode() if isinstance(token, bytes) else token for token in lost}

    def release_permit(self, batch: str, token: str) -> None:
        self.redis.zrem(self.keys.permits(batch), token)

    def exists(self) -> bool:
        """Whether the run's state is in Redis (its metadata, written when it dispatches a batch)."""
        return bool(self.redis.exists(self.keys.meta))

    def keep_driver(self) -> None:
        """The client driving this run is alive for DRIVER_LEASE seconds more. It renews the lease while it waits on
        a batch; once it stops (it ended, or was killed), the lease runs out and aging forgets the messages the run
        left queued (worker/cluster/aging.py): nothing on the cluster reads its record, which only its host has."""
        self.redis.set(self.keys.driver, 1, ex=DRIVER_LEASE)

    def describe(self, **fields: Any) -> None:
        """Run metadata for `chordflow status`."""
        pipe = self.redis.pipeline()
        pipe.hset(self.keys.meta, mapping={k: str(v) for k, v in fields.items()})
        pipe.expire(self.keys.meta, self.ttl)
        pipe.execute()
