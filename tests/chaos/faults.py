"""Faults injected into the campaign's real processes: why a module of its own? Each kind needs to find its target
(a worker, a prefork pool child, redis-server, the client process) and to undo itself (a paused process continued,
a killed worker replaced, Redis started again) so the next schedule meets the same cluster. The runner decides when;
this module only does, and times what it did, so the report can give recovery times.

The cluster (`chaos_cluster`): redis-server with AOF (fsync every write: a restart loses nothing acknowledged), a
solo worker `s1` and a prefork worker `p1` of two pool children, a dead-delivery bound of `BOUND` seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.localcluster import Cluster, ManagedProcess
from tests.chaos.generator import Fault
from tests.support.cluster import PLUGINS

#: The dead-delivery bound (CHORDFLOW_VISIBILITY_TIMEOUT): a dead or paused holder's messages come back after it.
BOUND = 5
#: The workers: name -> `start_worker` options.
WORKERS: dict[str, dict[str, Any]] = {"s1": {}, "p1": {"pool": "prefork", "concurrency": 2}}


@contextlib.contextmanager
def chaos_cluster(workdir: Path, env: dict[str, str]) -> Iterator[Cluster]:
    """The campaign's cluster (above), its workers given `env` on top of the cluster's (the model provider's
    variables); this process points at it meanwhile."""
    cluster = Cluster(
        workdir,
        visibility_timeout=BOUND,
        plugins=f"{PLUGINS},tests.support.counting_nodes",
        redis_args=["--appendonly", "yes", "--appendfsync", "always"],
    )
    cluster.env.update(env)
    previous = cluster.apply_env()
    try:
        for name, options in WORKERS.items():
            cluster.start_worker(name, **options)
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


def children(worker: ManagedProcess) -> list[int]:
    """The pool children of a prefork worker (its main process's children), by pid."""
    path = Path(f"/proc/{worker.pid}/task/{worker.pid}/children")
    with contextlib.suppress(OSError):
        return [int(pid) for pid in path.read_text().split()]
    return []


@dataclass
class Injected:
    """What one fault did: its kind, when it began and ended (monotonic seconds), what it hit."""

    kind: str
    began: float
    ended: float | None = None
    target: str = ""


@dataclass
class Injector:
    """Injects a schedule's faults into `cluster`; `client` is the process driving the first run, when one does;
    `stop_runs` cancels the run(s), `resume_runs` cancels them and then resumes each that ended cancelled (returns
    the ids resumed), `update_runs(cap)` sets each submitted run's `max_concurrent` (returns the ids acknowledged).
    A fault with a length ends on a timer, so the next one may begin meanwhile (a
    cancel mid-pause); `settle` waits for every fault to have ended and every worker to be back."""

    cluster: Cluster
    stop_runs: Any
    client: Any = None
    resume_runs: Any = None
    update_runs: Any = None
    done: list[Injected] = field(default_factory=list)
    timers: list[threading.Thread] = field(default_factory=list)

    def inject(self, fault: Fault) -> Injected:
        record = Injected(fault.kind, time.monotonic())
        self.done.append(record)
        getattr(self, fault.kind)(fault, record)
        return record

    def later(self, seconds: float, then: Any, record: Injected) -> None:
        def run() -> None:
            time.sleep(seconds)  # the fault's length, not a wait for anything
            then()
            record.ended = time.monotonic()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.timers.append(thread)

    def worker_of(self, fault: Fault) -> str:
        return sorted(WORKERS)[fault.after % len(WORKERS)]

    def kill_worker(self, fault: Fault, record: Injected) -> None:
        """SIGKILL a worker's whole process group, then start one of the same name in its place."""
        name = record.target = self.worker_of(fault)
        self.cluster.workers[name].kill(signal.SIGKILL)
        self.cluster.start_worker(name, **WORKERS[name])
        record.ended = time.monotonic()

    def stop_worker(self, fault: Fault, record: Injected) -> None:
        """SIGSTOP a worker's process group for the fault's length, then SIGCONT it."""
        name = record.target = self.worker_of(fault)
        worker = self.cluster.workers[name]
        worker.kill(signal.SIGSTOP)
        self.later(fault.hold, lambda: worker.kill(signal.SIGCONT), record)

    def _child(self, record: Injected) -> int | None:
        pids = children(self.cluster.workers["p1"])
        pid = pids[0] if pids else None
        record.target = f"p1 child {pid}"
        return pid

    def kill_child(self, fault: Fault, record: Injected) -> None:
        """SIGKILL one pool child of the prefork worker (its main process starts another)."""
        pid = self._child(record)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        record.ended = time.monotonic()

    def stop_child(self, fault: Fault, record: Injected) -> None:
        """SIGSTOP one pool child of the prefork worker for the fault's length, then SIGCONT it."""
        pid = self._child(record)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(pid, signal.SIGCONT)  # type: ignore[arg-type]

        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        self.later(fault.hold, resume, record)

    def restart_redis(self, fault: Fault, record: Injected) -> None:
        """Stop redis-server (SIGTERM: it writes its AOF), keep it down for the fault's length, start it again."""
        record.target = "redis-server"
        self.cluster.redis.kill(signal.SIGTERM)
        self.later(fault.hold, self.cluster.redis.restart, record)

    def pause_redis(self, fault: Fault, record: Injected) -> None:
        """SIGSTOP redis-server for the fault's length, then SIGCONT it: Redis unreachable, nothing lost."""
        record.target = "redis-server"
        self.cluster.redis.kill(signal.SIGSTOP)
        self.later(fault.hold, lambda: self.cluster.redis.kill(signal.SIGCONT), record)

    def resume(self, fault: Fault, record: Injected) -> None:
        """`cancel` the schedule's runs, then `resume` each that ended cancelled (a client-driven run is only
        cancelled: its process, not the cluster, holds it)."""
        resumed = self.resume_runs()
        record.target = ",".join(resumed) or "none cancelled in time"
        record.ended = time.monotonic()

    def update(self, fault: Fault, record: Injected) -> None:
        """`update RUN --max-concurrent cap` of the schedule's submitted runs still going."""
        updated = self.update_runs(fault.cap)
        record.target = f"{','.join(updated) or 'no run going'} max_concurrent={fault.cap}"
        record.ended = time.monotonic()

    def cancel(self, fault: Fault, record: Injected) -> None:
        """`chordflow cancel` of the schedule's runs, whatever other fault is on meanwhile."""
        record.target = "runs"
        self.stop_runs()
        record.ended = time.monotonic()

    def kill_client(self, fault: Fault, record: Injected) -> None:
        """SIGKILL the process driving the first run (`chordflow run --backend celery`), when one does."""
        if self.client is not None and self.client.poll() is None:
            record.target = f"client {self.client.pid}"
            self.client.kill()
            self.client.wait()
        record.ended = time.monotonic()

    def settle(self, timeout: float = 120) -> None:
        """Every fault ended (timers joined), every worker and Redis up: the cluster as the campaign began."""
        for thread in self.timers:
            thread.join(timeout)
        for name, worker in list(self.cluster.workers.items()):
            if worker.proc.poll() is not None:
                self.cluster.start_worker(name, **WORKERS[name])
            else:
                worker.kill(signal.SIGCONT)  # a pause the timer's own end missed: never left paused
        self.cluster.redis.kill(signal.SIGCONT)  # likewise Redis
        for pid in children(self.cluster.workers["p1"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
