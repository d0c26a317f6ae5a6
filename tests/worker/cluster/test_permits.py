"""`batch.max_concurrent` is a hard cap on the cluster, whatever an item's duration, and a dead holder's capacity comes
back within seconds.

A permit is a lease (worker/cluster/batches/middleware.py PERMIT_LEASE) that a PermitKeeper thread renews while its
chunk runs: an item longer than the lease keeps its permit. A SIGKILLed or SIGSTOPped worker stops renewing, so its
permits come back within one lease (a paused one, woken, waits for a free permit before its next item); a chunk
delivered again takes back its dead delivery's permits at once.

Real redis-server and real `celery` workers; in-flight calls are counted by a real loopback HTTP server (the `http`
node's target) or by `test-count` items recorded in the cluster's Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import redis

import scheduler
from scheduler.localcluster import Cluster
from tests.chaos.invariants import concurrency
from tests.support import counting_nodes  # noqa: F401  (the test node type, in this process too)
from tests.support.cluster import PLUGINS
from tests.support.http_server import running
from tests.worker.cluster.faults.test_long_chunks import until
from worker.cluster.batches.middleware import PERMIT_LEASE, ConcurrencyPermit
from worker.cluster.state.keys import run_key
from worker.cluster.state.runstate import RunState

#: The capacity of a SIGKILLed holder must be back within this many seconds.
WITHIN = 10.0


class InFlight:
    """What a loopback API saw: calls in flight now, the most at once, and how many calls it answered."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.now = self.most = self.calls = 0
        self.lock = threading.Lock()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        seen = self

        class Slow(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with seen.lock:
                    seen.now += 1
                    seen.most = max(seen.most, seen.now)
                try:
                    time.sleep(seen.seconds)  # the API's answer time: the thing whose length is under test
                finally:
                    # Out of flight before answering: once the client has the answer its permit may go to the next
                    # call, which this thread, slowed by a busy machine, must not still count as its own.
                    with seen.lock:
                        seen.now -= 1
                        seen.calls += 1
                body = json.dumps({"ok": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        return Slow


def test_max_concurrent_caps_calls_longer_than_a_lease_across_workers(celery_cluster: Cluster) -> None:
    # Two chunks of two items, one on each worker, each chunk's two threads wanting a permit; each call takes 35 s,
    # longer than any lease: the API must never see more than 2 calls at once.
    api = InFlight(seconds=35.0)
    with running(api.handler()) as server:
        node = {"id": "b", "type": "http", "params": {"url": server.url + "/slow", "timeout": 60}}
        node["batch"] = {"items": "${items}", "parallel": True, "max_concurrent": 2, "chunk_size": 2}
        result = scheduler.run({"nodes": [node]}, {"items": [0, 1, 2, 3]}, backend="celery")
    assert result.shared["b"]["success_count"] == 4
    assert api.calls == 4
    assert api.most == 2, f"the API saw {api.most} calls in flight under max_concurrent 2"


def test_a_long_item_keeps_its_permit_past_the_lease(celery_cluster: Cluster) -> None:
    # In-process on the suite's redis-server: a chunk's keeper renews its permit while its item runs three leases;
    # another chunk of the batch finds the one permit taken all that time, and takes it once the first chunk ends.
    state, batch, lease = RunState(f"keep-{uuid.uuid4().hex[:8]}"), "b#0", 0.6
    holder = ConcurrencyPermit(state, batch, 1, 0, lease=lease)
    assert holder.before_item(0)
    deadline = time.monotonic() + 3 * lease
    while time.monotonic() < deadline:
        assert not state.acquire_permit(batch, "other/x/0", 1, lease), "a live holder's permit was handed on"
        time.sleep(lease / 4)
    holder.close()
    assert state.acquire_permit(batch, "other/x/0", 1, lease)


class Holders:
    """Threads of chunks on this process, each holding a permit (its item in flight) until `release()`."""

    def __init__(self) -> None:
        self.done, self.admitted = threading.Event(), threading.Semaphore(0)

    def hold(self, permits: ConcurrencyPermit) -> None:
        threading.Thread(target=self._hold, args=(permits,), daemon=True).start()

    def _hold(self, permits: ConcurrencyPermit) -> None:
        if permits.before_item(0):
            self.admitted.release()
            self.done.wait()

    def granted(self, timeout: float) -> bool:
        return self.admitted.acquire(timeout=timeout)

    def release(self) -> None:
        self.done.set()


def test_a_chunk_delivered_again_takes_back_its_dead_deliverys_permits(celery_cluster: Cluster) -> None:
    # A delivery of chunk 0 holds two of 3 permits (two threads) for a minute and stops renewing (its process died);
    # chunk 10 holds the third. The chunk's next delivery is granted at once; chunk 10's permit is never taken.
    state, batch, holders = RunState(f"reclaim-{uuid.uuid4().hex[:8]}"), "b#0", Holders()
    dead = ConcurrencyPermit(state, batch, 3, 0, lease=60)
    other = ConcurrencyPermit(state, batch, 3, 10, lease=60)
    permits_key = state.keys.permits(batch)
    try:
        for permits in (dead, dead, other):
            holders.hold(permits)
            assert holders.granted(30)
        dead.keeper.stop()  # the dead process renews nothing (its permits stay in Redis, leased for a minute)
        assert not state.acquire_permit(batch, "20/x/0", 3, 60)  # all 3 taken
        again = ConcurrencyPermit(state, batch, 3, 0, lease=60)
        holders.hold(again)
        assert holders.granted(10), "the chunk's next delivery waited for its dead delivery's leases"
        held = {m.decode() for m in state.redis.zrange(permits_key, 0, -1)}
        assert len(held) == 2 and sum(h.startswith("10/") for h in held) == 1, held  # the other chunk's kept
        assert sum(h.startswith(again.delivery) for h in held) == 1, held
        assert state.acquire_permit(batch, "20/x/0", 3, 60)  # the dead delivery's second permit came back too
    finally:
        holders.release()


@contextlib.contextmanager
def three_workers(workdir: Path, **options: Any) -> Iterator[Cluster]:
    """Its own redis-server and three workers (k1 to k3, `start_worker` options); this process points at it."""
    cluster = Cluster(workdir, plugins=f"{PLUGINS},tests.support.counting_nodes")
    previous = cluster.apply_env()
    try:
        for name in ("k1", "k2", "k3"):
            cluster.start_worker(name, **options)
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def started(state: redis.Redis, key: str) -> list[tuple[str, str]]:
    """(worker, item label) of every `test-count` execution begun, in order."""
    return [tuple(entry.split(" ", 1)) for entry in state.lrange(f"{key}:runs", 0, -1)]  # type: ignore[misc]


def submit(key: str, items: int, **batch: Any) -> str:
    params = {"key": key, "label": "${item}", "seconds": 120}
    node = {"id": "b", "type": "test-count", "params": params, "batch": {"items": "${items}", **batch}}
    return scheduler.submit({"nodes": [node]}, {"items": list(range(items))})


@pytest.mark.processes
def test_a_sigkilled_workers_permits_come_back_within_seconds(tmp_path: Path) -> None:
    # max_concurrent 2, one item per chunk, items of two minutes: two workers hold the permits, the third waits
    # for one. SIGKILL a holder: the waiting worker starts its item within WITHIN seconds (the lease), not after
    # the dead delivery's visibility timeout or a long lease.
    with three_workers(tmp_path) as cluster:
        state, key = redis.Redis.from_url(cluster.redis.url, decode_responses=True), f"t:{uuid.uuid4().hex[:8]}"
        run_id = submit(key, 6, max_concurrent=2, chunk_size=1)
        holders = until(lambda: len(runs := started(state, key)) >= 2 and runs, 60, "two items running")
        assert state.zcard(run_key(run_id, "permits:b#0")) == 2
        time.sleep(PERMIT_LEASE + 1)  # longer than a lease: the live holders keep their permits all that time
        assert len(started(state, key)) == 2, "a third item started while two live holders held the permits"
        victim = holders[0][0]
        cluster.workers[victim].kill(signal.SIGKILL)
        killed = time.monotonic()
        until(lambda: len(started(state, key)) >= 3, WITHIN + 5, "an item after the holder died")
        back = time.monotonic() - killed
        runs = started(state, key)
        assert runs[2][0] != victim
        assert back < WITHIN, f"the dead holder's permit came back after {back:.1f}s"
        print(f"a SIGKILLed worker's permit back after {back:.2f}s")  # the figure in tests/RELIABILITY.md


@pytest.mark.processes
def test_a_pool_process_sigkilled_holding_every_permit_gives_them_to_its_chunks_next_delivery(tmp_path: Path) -> None:
    # One prefork worker with one pool process runs a parallel chunk holding all 4 permits. SIGKILL that process:
    # Celery gives the chunk back at once, and its next delivery takes back the 4 permits instead of waiting out
    # their leases, so 4 items are running again within WITHIN seconds.
    cluster = Cluster(tmp_path, plugins=f"{PLUGINS},tests.support.counting_nodes")
    previous = cluster.apply_env()
    try:
        worker = cluster.start_worker("p1", pool="prefork", concurrency=1)
        state, key = redis.Redis.from_url(cluster.redis.url, decode_responses=True), f"t:{uuid.uuid4().hex[:8]}"
        submit(key, 4, parallel=True, max_concurrent=4, chunk_size=4)
        first = until(lambda: len(runs := started(state, key)) >= 4 and runs, 60, "four items running")
        assert {label for _, label in first} == {"0", "1", "2", "3"}
        os.kill(pool_child(worker.pid), signal.SIGKILL)
        killed = time.monotonic()
        until(lambda: len(started(state, key)) >= 8, WITHIN + 10, "the chunk's items running again")
        back = time.monotonic() - killed
        assert back < WITHIN, f"the chunk's next delivery ran its items {back:.1f}s after the kill"
        print(f"a SIGKILLed pool process's 4 permits back after {back:.2f}s")  # the figure in tests/RELIABILITY.md
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def pool_child(parent: int) -> int:
    """The pid of the one pool process of a prefork worker."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


@pytest.mark.processes
def test_a_sigstopped_holders_permit_comes_back_and_it_takes_no_other_on_waking(tmp_path: Path) -> None:
    # max_concurrent 2, three chunks of two items of 10 s, one chunk per worker: two workers hold the permits, the
    # third waits. SIGSTOP a holder inside its first item: the waiting worker starts its item within WITHIN seconds
    # (a paused process renews no lease, like a dead one). Keep it paused until the other holder went on to its
    # second item, then SIGCONT it: its item's time is up, and it starts its second item only once a permit is
    # free, so every other item stays within the cap; only the item it was inside (its call already made) may
    # run past the cap, for its rest.
    with three_workers(tmp_path) as cluster:
        state, key = redis.Redis.from_url(cluster.redis.url, decode_responses=True), f"t:{uuid.uuid4().hex[:8]}"
        params = {"key": key, "label": "${item}", "fail": False, "seconds": 10}
        node = {"id": "b", "type": "test-ledger", "params": params}
        node["batch"] = {"items": "${items}", "max_concurrent": 2, "chunk_size": 2}
        scheduler.submit({"nodes": [node]}, {"items": list(range(6))})
        holders = until(lambda: len(runs := ledger_starts(state, key)) >= 2 and runs, 60, "two items running")
        paused_label, pid = holders[0]
        victim = next(w for w in cluster.workers.values() if w.pid == pid)
        victim.kill(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            until(lambda: len(ledger_starts(state, key)) >= 3, WITHIN + 5, "an item while the holder is paused")
            back = time.monotonic() - stopped
            until(lambda: len(ledger_starts(state, key)) >= 4, 30, "a fourth item while the holder is paused")
        finally:
            victim.kill(signal.SIGCONT)
        assert back < WITHIN, f"the paused holder's permit came back after {back:.1f}s"
        spans = until(lambda: len(done := ledger_spans(state, key)) == 6 and done, 120, "every item done")
        assert sorted(label for label, _ in ledger_starts(state, key)) == [str(i) for i in range(6)]  # each once
        others = [span for span in spans if span[0] != paused_label]
        assert concurrency(others, prefix="") == 2, f"an item started past max_concurrent 2: {sorted(spans)}"
        print(f"a SIGSTOPped holder's permit back after {back:.2f}s")  # the figure in tests/RELIABILITY.md


def ledger_starts(state: redis.Redis, key: str) -> list[tuple[str, int]]:
    """(item label, pid) of every `test-ledger` execution begun, in order."""
    return [(e.split()[0], int(e.split()[2])) for e in state.lrange(f"{key}:runs", 0, -1)]


def ledger_spans(state: redis.Redis, key: str) -> list[tuple[str, float, float]]:
    """(item label, start, end) of every `test-ledger` execution that ended."""
    return [(s.split()[0], float(s.split()[1]), float(s.split()[2])) for s in state.hvals(f"{key}:spans")]
