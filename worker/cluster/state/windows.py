"""A batch's window in Redis: which of its chunks remain, which are in flight, what the finished ones returned.

Fair dispatch (worker/cluster/batches/dispatch.py) keeps only `window` chunks of a batch in the broker at a time and
hands out the next ones as chunks finish, so runs sharing the workers take turns. Everything a refill needs lives
here before the first chunk is sent: the batch's items in blocks, the chunk header (node spec, snapshot, what the
merge needs), the blocks left to do. Each step is one call of `batch_window.lua` (keys and arguments documented
there): a finish is counted once (a redelivered chunk's finish only returns the chunks it had claimed, to be sent
again), and exactly one finish sees the batch end.

Keys, under the run's hash tag: `win:<batch>` (the plan) and `win:<batch>:todo|pending|out|items|next|begun`; and one
cluster-wide set of the open windows (`cf:{windows}`), so that the batches sharing the workers divide them: each
keeps about (processes + 1) / (open batches) chunks in flight, at least one, and a newcomer's chunk waits behind
about one chunk per open batch.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import msgpack

from worker.cluster.state.keys import WINDOWS
from worker.cluster.state.once import once
from worker.cluster.state.runstate import RunState

#: Seconds without a chunk beginning or finishing after which a batch no longer counts as sharing the workers
#: (a run whose worker died mid-batch, or a chunk longer than this, is left out of the share meanwhile).
IDLE_SECONDS = 30.0


@dataclass(frozen=True)
class Chunk:
    """Items [start, end) of a batch, made of the stored blocks starting at `blocks`."""

    start: int
    end: int
    blocks: list[int]

    @classmethod
    def parse(cls, text: str | bytes) -> Chunk:
        raw = text.decode() if isinstance(text, bytes) else text
        start, end, blocks = raw.split(":", 2)
        return cls(int(start), int(end), [int(b) for b in blocks.split(",")])


@dataclass(frozen=True)
class WindowStep:
    """What a step of the window says: `state` ('go', 'end', 'dup', 'dupend', 'stale', 'purged'; a finish: 'short',
    its outcome passes the chunk's `end`; a split: 'gone', nothing to hand back), the run's priority, how long the
    batch's last finished chunk waited in the queue (seconds), and the chunks to send now."""

    state: str
    priority: str = "normal"
    waited: float = 0.0
    chunks: list[Chunk] = field(default_factory=list)
    end: int | None = None

    @property
    def ended(self) -> bool:
        """The batch's chunks have all finished (or stopped): its outcomes can be merged."""
        return self.state in ("end", "dupend")


class BatchWindow:
    def __init__(self, state: RunState, batch: str, plan_id: str | None = None):
        self.state, self.batch = state, batch
        self.plan_id = plan_id or uuid.uuid4().hex
        self.keys = state.keys.window(batch)
        self._step = once(state.redis, "batch_window")
        self.again = False  # set by `begin`

    def _keys(self) -> list[str]:
        w, run = self.keys, self.state.keys
        stops = [run.cancel, run.abort(self.batch)]
        return [w.plan, w.todo, w.pending, w.out, w.items, *stops, w.next, run.run, run.tombstone]

    def _call(self, mode: str, *args: object) -> WindowStep:
        reply = self._step(keys=self._keys(), args=[mode, self.state.ttl, self.plan_id, *args])
        state = reply[0].decode()
        if state in ("stale", "purged", "gone"):
            return WindowStep(state)
        if state == "short":
            return WindowStep(state, end=int(reply[1]))
        chunks = [Chunk.parse(c) for c in reply[3:]]
        return WindowStep(state, reply[1].decode(), float(reply[2]), chunks)

    def plan(
        self,
        blocks: list[tuple[int, int, bytes]],
        header: dict[str, object],
        *,
        window: int,
        max_items: int,
        min_items: int,
        chunk_seconds: float,
        priority: str,
    ) -> WindowStep:
        """Store the batch's blocks (start, end, encoded items) and header, then claim the first window."""
        pipe = self.state.redis.pipeline(transaction=False)
        items = self.keys.items
        pipe.delete(items, self.keys.begun)
        for i in range(0, len(blocks), 500):
            pipe.hset(items, mapping={str(a): payload for a, _, payload in blocks[i : i + 500]})
        pipe.expire(items, self.state.ttl)
        pipe.execute()
        spans = [f"{a}:{b}" for a, b, _ in blocks]
        header_bytes = msgpack.packb(header, use_bin_type=True)
        return self._call(
            "plan", window, max_items, min_items, chunk_seconds, header_bytes, priority, time.time(), *spans
        )

    def finish(
        self, start: int, outcome: bytes, items: int, seconds: float, window: int, end: int | None = None
    ) -> WindowStep:
        """Record a chunk's outcome once and claim what its place in the window (now `window` chunks) lets go.
        `end`: the first index past the outcome; 'short' if the chunk now ends before it (split meanwhile)."""
        return self._call("finish", start, outcome, items, f"{seconds:.6f}", window, time.time(), end or "")

    def split(self, start: int, at: int, end: int, block: bytes | None) -> WindowStep:
        """Items [at, end) of chunk `start` (as its holder read it: `claimed`) become a chunk of their own, claimed
        to be sent (`block`: the items from `at` to the next block, when `at` starts none). 'gone' when the chunk
        finished or was split meanwhile."""
        return self._call("split", start, at, end, block or b"", time.time())

    def claimed(self, start: int) -> Chunk | None:
        """Chunk `start` as the window holds it now (a split shortens it), None once it finished (or never was)."""
        held = self.state.redis.hget(self.keys.pending, str(start))
        if held is None:
            return None
        end, blocks = held.decode().split("@", 1)[0].split(":", 1)
        return Chunk.parse(f"{start}:{end}:{blocks}")

    def open_windows(self) -> int:
        """Mark this batch's window open (now) and count the open ones across the cluster, this one included."""
        now = time.time()
        pipe = self.state.redis.pipeline(transaction=False)
        pipe.zadd(WINDOWS, {self.member: now})
        pipe.zremrangebyscore(WINDOWS, "-inf", now - IDLE_SECONDS)
        pipe.zcard(WINDOWS)
        return max(1, int(pipe.execute()[2]))

    @property
    def member(self) -> str:
        return f"{self.state.run_id}|{self.batch}"

    def header(self) -> dict[str, object]:
        raw = self.state.redis.hget(self.keys.plan, "header")
        if raw is None:
            raise LookupError(f"batch {self.batch} of run {self.state.run_id}: its plan is gone from Redis")
        return msgpack.unpackb(raw, raw=False)

    def items(self, blocks: list[int]) -> list[bytes]:
        """The encoded items of these blocks (a chunk's message carries them)."""
        found = self.state.redis.hmget(self.keys.items, [str(b) for b in blocks])
        if any(blob is None for blob in found):
            raise LookupError(f"batch {self.batch} of run {self.state.run_id}: items of blocks {blocks} are gone")
        return list(found)

    def begin(self, start: int, task_id: str) -> bool:
        """A delivery of chunk `start` begins: False when another message of it (a copy, one sent again by a
        redelivered advance) began first. A redelivery of the one that began (same task id: its worker died) begins
        again. False too for a chunk of an earlier plan (a resume planned the batch again: its items are in this
        plan's chunks); a chunk of no window at all (sent by hand) runs, and its finish is `stale`."""
        begun, field = self.keys.begun, f"{self.plan_id}:{start}"
        pipe = self.state.redis.pipeline(transaction=False)
        pipe.hget(self.keys.plan, "id")
        pipe.hsetnx(begun, field, task_id)
        pipe.hget(begun, field)
        pipe.expire(begun, self.state.ttl)
        plan, first, holder, _ = pipe.execute()
        self.again = not first  # this message of the chunk began before: its earlier delivery died or was cut off
        if plan is not None and plan.decode() != self.plan_id:
            return False
        return holder is None or holder.decode() == task_id

    def pending(self) -> WindowStep:
        """The chunks claimed and not finished (sent, or about to be when their sender died), as a step to send
        again; `ended` if the batch has ended. Raises LookupError when the batch was never planned."""
        pipe = self.state.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.plan, "id", "ended", "priority", "waited")
        pipe.hgetall(self.keys.pending)
        pipe.hget(self.state.keys.run, "priority")
        (plan, ended, priority, waited), pending, run_priority = pipe.execute()
        if plan is None:
            raise LookupError(f"batch {self.batch} of run {self.state.run_id} was never planned")
        self.plan_id = plan.decode()
        chunks = []
        for start, held in sorted(pending.items(), key=lambda kv: int(kv[0])):
            end, blocks = held.decode().split("@", 1)[0].split(":", 1)
            chunks.append(Chunk.parse(f"{int(start)}:{end}:{blocks}"))
        state = "end" if ended else "go"
        return WindowStep(state, (run_priority or priority or b"normal").decode(), float(waited or 0), chunks)

    def chunk_items(self, blocks: list[int]) -> list[bytes] | None:
        """The encoded items of these blocks, None if the batch was planned again since this window's plan."""
        pipe = self.state.redis.pipeline(transaction=False)
        pipe.hget(self.keys.plan, "id")
        pipe.hmget(self.keys.items, [str(b) for b in blocks])
        plan, found = pipe.execute()
        if plan is None or plan.decode() != self.plan_id or any(blob is None for blob in found):
            return None
        return list(found)

    def outcomes(self) -> list[bytes]:
        """Every finished chunk's outcome bytes, in index order (what the merge task merges)."""
        out = self.state.redis.hgetall(self.keys.out)
        return [out[k] for k in sorted(out, key=int)]

    def crash(self, error: str) -> None:
        """A chunk raised (not an item failure): the batch can never be merged; a client following it is told, and
        it no longer shares the workers."""
        pipe = self.state.redis.pipeline(transaction=False)
        pipe.hset(self.keys.plan, "error", error)
        pipe.zrem(WINDOWS, self.member)
        pipe.execute()

    def crashed(self) -> str | None:
        raw = self.state.redis.hget(self.keys.plan, "error")
        return raw.decode() if raw else None

    def drop(self) -> None:
        """The window is merged: its keys go (the kept outcomes live on in `chunks:<batch>`), but for `:begun`, kept
        to its TTL: a second message of a chunk (an aging copy, one sent again) delivered after the merge still
        finds its chunk begun, and is skipped instead of running the chunk's items again."""
        w = self.keys
        self.state.redis.delete(w.plan, w.todo, w.pending, w.out, w.items, w.next)
        self.state.redis.zrem(WINDOWS, self.member)
