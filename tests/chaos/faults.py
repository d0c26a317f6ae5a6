"""Faults injected into the campaign's real processes: why a module of its own? Each kind needs to find its target
(a worker, a prefork pool child, redis-server, the client process) and to undo itself (a paused process continued,
a killed worker replaced, Redis started again) so the next schedule meets the same cluster. The runner decides when;
this module only does, and times what it did, so the report can give recovery times.

The cluster (`chaos_cluster`): redis-server with AOF (fsync every write: a restart loses nothing acknowledged), a
solo worker `s1` and a prefork worker `p1` of two pool children, a dead-delivery bound of `BOUND` seconds.

`cut_worker` needs a worker on another host: `far_side` makes one (tests/support/netns.py `far_host`: a network
namespace and a veth link; Redis told to listen on the link's address too, the model provider reached through a
`relay`), and `Far.start` runs the solo worker `n1` there. Why `n1` only for a schedule that draws `cut_worker`, started
before its runs and stopped after them, and not from the campaign's start: every other schedule then runs on the
cluster it was run on (`s1` and `p1`; a third worker would change where chunks go, and so what schedules 1-500 replay),
and a schedule's cluster never depends on which schedules ran before it in the same campaign. The namespace, link and
relay (no worker process, a few `ip` calls) are made once, on the first such schedule, and kept to the campaign's
end; the cut is the link down (packets dropped: connections hang, nothing is refused) for the hold, then up again.

`restart_broker` needs RabbitMQ: `rabbitmq_cluster` is a second cluster, made on the first schedule with the `rabbitmq`
feature and kept to the campaign's end: a RabbitMQ node of the campaign's own (tests/support/rabbitmq.py `own_node`:
the machine's server on 5672 is shared with other test runs and never stopped), the same two workers on it, and a
redis-server of its own for the state (a deployment has one broker: the Redis-brokered workers' sweeps would act on
RabbitMQ runs' state if both shared one). The restart is `rabbitmqctl stop_app`, the hold, `start_app`: it closes
every connection and recovers the durable queue from disk as a restart of the node does, in ~1 s down and ~2 s up,
where stopping and starting the node (the Erlang VM booted again) takes ~7 s to come up whatever the hold, which would
make every hold the same.
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

import redis

from scheduler.localcluster import Cluster, ManagedProcess
from tests.chaos.generator import Fault
from tests.support import netns, rabbitmq
from tests.support.cluster import PLUGINS

#: The dead-delivery bound (CHORDFLOW_VISIBILITY_TIMEOUT): a dead or paused holder's messages come back after it.
BOUND = 5
#: The workers: name -> `start_worker` options.
WORKERS: dict[str, dict[str, Any]] = {"s1": {}, "p1": {"pool": "prefork", "concurrency": 2}}


#: The far worker (`cut_worker`'s target): a solo worker on a host of its own.
FAR = "n1"


@contextlib.contextmanager
def chaos_cluster(workdir: Path, env: dict[str, str], broker_url: str | None = None) -> Iterator[Cluster]:
    """The campaign's cluster (above), its workers given `env` on top of the cluster's (the model provider's
    variables), its broker `broker_url` if given (else its redis-server); this process points at it meanwhile."""
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(
        workdir,
        visibility_timeout=BOUND,
        plugins=f"{PLUGINS},tests.support.counting_nodes",
        redis_args=["--appendonly", "yes", "--appendfsync", "always"],
        broker_url=broker_url,
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


@contextlib.contextmanager
def rabbitmq_cluster(workdir: Path, env: dict[str, str]) -> Iterator[tuple[Cluster, rabbitmq.Node]]:
    """The cluster of the schedules with the `rabbitmq` feature: a RabbitMQ node of its own as the broker, a
    redis-server of its own for the state, the same workers; this process points at it meanwhile."""
    with rabbitmq.own_node(workdir / "rabbitmq") as node, chaos_cluster(workdir, env, node.url) as cluster:
        yield cluster, node


@dataclass
class Far:
    """The far host (`host`), the env its worker runs with (Redis and the model provider at the link's address)
    and the worker `n1` while one runs (`start`, `stop`)."""

    host: netns.FarHost
    cluster: Cluster
    env: dict[str, str]
    worker: ManagedProcess | None = None

    def start(self, label: str) -> ManagedProcess:
        """`n1` started on the far host (solo; its log `worker-n1-<label>.log`), once it is ready."""
        argv = self.host.argv(self.cluster.worker_argv(FAR))
        log = self.cluster.workdir / f"worker-{FAR}-{label}.log"
        self.worker = ManagedProcess(argv, log, "ready.", env=self.env)
        return self.worker

    def stop(self) -> int | None:
        """Stop `n1` (SIGTERM: a warm shutdown gives back what it holds), the link up first so that it can; returns
        its exit code if it had ended on its own before, else None."""
        worker, self.worker = self.worker, None
        if worker is None:
            return None
        ended = worker.proc.poll()
        self.host.restore()
        worker.kill(signal.SIGTERM)
        return ended

    def busy(self, ledgers: list[str], r: redis.Redis) -> bool:
        """Whether `n1` is inside an execution of a ledger's (begun, no span yet): a solo worker runs items in its
        own process, whose pid the ledger records. An execution is its token, the last field of its `runs` entry
        ("<label> <start> <pid> <token>") and the field of its span (tests/support/counting_nodes.py)."""
        if self.worker is None:
            return False
        for ledger in ledgers:
            begun = [e.decode().split()[2:4] for e in r.lrange(f"{ledger}:runs", 0, -1)]
            ended = {token.decode() for token in r.hkeys(f"{ledger}:spans")}
            if any(pid == str(self.worker.pid) and token not in ended for pid, token in begun):
                return True
        return False


@contextlib.contextmanager
def far_side(cluster: Cluster, provider_url: str) -> Iterator[Far]:
    """The far host of `cut_worker` for `cluster`: a namespace and its link (netns.far_host), the cluster's
    redis-server listening on the link's address too (now, and on every restart after), the loopback model provider
    (`provider_url`) relayed there. The worker is stopped, the link restored and everything removed on exit."""
    with netns.far_host() as host:
        port = int(provider_url.rsplit(":", 1)[1])
        with netns.relay(host, port) as provider:
            state = redis.Redis.from_url(cluster.redis.url)
            state.config_set("protected-mode", "no")  # a private link
            state.config_set("bind", f"127.0.0.1 {host.gateway}")
            state.close()
            argv = cluster.redis.argv  # a restart of redis-server (restart_redis) keeps listening there
            argv[argv.index("--bind") + 2 : argv.index("--bind") + 2] = [host.gateway, "--protected-mode", "no"]
            url = f"redis://{host.gateway}:{cluster.redis.port}/0"
            env = {k: v.replace(f"127.0.0.1:{port}", provider) for k, v in cluster.env.items()}
            env |= {"CHORDFLOW_BROKER_URL": url, "CHORDFLOW_RESULT_BACKEND": url}
            far = Far(host, cluster, env)
            try:
                yield far
            finally:
                with contextlib.suppress(Exception):  # never leave a worker inside a namespace being removed
                    far.stop()
                host.restore()


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
    far: Far | None = None  # `cut_worker`'s target, on a schedule that has `n1`
    broker: rabbitmq.Node | None = None  # `restart_broker`'s, on a schedule that runs on RabbitMQ
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

    def cut_worker(self, fault: Fault, record: Injected) -> None:
        """Take the far host's link down for the fault's length, then up: `n1` lives on, its connections to Redis
        (broker and state) hang, its packets dropped; nothing to do without a far worker (a shrunk schedule's)."""
        if self.far is None or self.far.worker is None:
            record.target, record.ended = "no far worker", time.monotonic()
            return
        record.target = FAR
        self.far.host.cut()
        self.later(fault.hold, self.far.host.restore, record)

    def restart_broker(self, fault: Fault, record: Injected) -> None:
        """RabbitMQ's application stopped (every connection closed, the listener gone), kept down for the fault's
        length, started again; nothing to do on a Redis broker (a shrunk schedule's: `restart_redis` is that)."""
        if self.broker is None:
            record.target, record.ended = "no RabbitMQ broker", time.monotonic()
            return
        record.target = f"rabbitmq {self.broker.name}"
        self.broker.stop_app()
        self.later(fault.hold, self.broker.start_app, record)

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
        """Every fault ended (timers joined), every worker and Redis up, the far host's link up and RabbitMQ
        started (a timer that failed, or a schedule ended early): the cluster as the campaign began."""
        for thread in self.timers:
            thread.join(timeout)
        if self.far is not None:
            self.far.host.restore()  # idempotent: up whether it was cut or not
        if self.broker is not None and not self.broker.running:
            self.broker.start_app()
        for name, worker in list(self.cluster.workers.items()):
            if worker.proc.poll() is not None:
                self.cluster.start_worker(name, **WORKERS[name])
            else:
                worker.kill(signal.SIGCONT)  # a pause the timer's own end missed: never left paused
        self.cluster.redis.kill(signal.SIGCONT)  # likewise Redis
        for pid in children(self.cluster.workers["p1"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
