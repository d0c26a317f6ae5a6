"""A Redis primary with one replica and three sentinels, all real processes on loopback free ports.

`sentinel_cluster()` gives a `Cluster` (tests/support/cluster.py) whose redis-server is the primary and whose env
points the workers at the sentinels (`sentinel://...;...` with CHORDFLOW_REDIS_MASTER_NAME), as a deployment with
Sentinel does: `cluster.redis.kill()` is the primary's death, and the sentinels promote the replica.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

from scheduler.localcluster import Cluster, ManagedProcess, RedisServer, free_port, redis_binary

MASTER_NAME = "cfprimary"
#: The sentinels call the primary down after this long without an answer (Sentinel's default: 30 s).
DOWN_AFTER_MS = 1000


@dataclass
class Sentinels:
    replica: RedisServer
    processes: list[ManagedProcess] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{port}/0" for port in self.ports)

    def primary_port(self) -> int:
        """The port of the primary the sentinels name now."""
        reply = redis.Redis(port=self.ports[0]).sentinel_get_master_addr_by_name(MASTER_NAME)
        return int(reply[1])

    def stop(self) -> None:
        for process in [*self.processes, self.replica]:
            process.kill(signal.SIGKILL)


def wait_for(condition: Callable[[], object], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {seconds:g} s")
        time.sleep(0.1)


def start_sentinels(workdir: Path, primary_port: int) -> Sentinels:
    """A replica of the Redis on `primary_port`, in sync, and three sentinels watching both (quorum 2)."""
    replica = RedisServer(workdir, ["--replicaof", "127.0.0.1", str(primary_port)])
    made = Sentinels(replica)
    try:
        client = redis.Redis(port=replica.port)
        wait_for(lambda: client.info("replication").get("master_link_status") == "up", 30, "the replica's sync")
        for _ in range(3):
            port = free_port()
            config = workdir / f"sentinel-{port}.conf"  # Sentinel rewrites it: one file each
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
                f"sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            )
            argv = [redis_binary(), str(config), "--sentinel"]
            made.processes.append(ManagedProcess(argv, workdir / f"sentinel-{port}.log", "+monitor master"))
            made.ports.append(port)
        for port in made.ports:  # each knows the replica and the two other sentinels: a failover can happen
            sentinel = redis.Redis(port=port)
            wait_for(
                lambda s=sentinel: (
                    len(s.sentinel_slaves(MASTER_NAME)) == 1 and len(s.sentinel_sentinels(MASTER_NAME)) == 2
                ),
                30,
                "the sentinels to find the replica and each other",
            )
    except BaseException:
        made.stop()
        raise
    return made


@contextlib.contextmanager
def sentinel_cluster(workdir: Path, plugins: str) -> Iterator[tuple[Cluster, Sentinels]]:
    """A `Cluster` on a watched primary: its env (broker and state) names the sentinels, not the primary."""
    cluster = Cluster(workdir, plugins=plugins)
    sentinels = None
    try:
        sentinels = start_sentinels(workdir, cluster.redis.port)
        cluster.env.update(
            CHORDFLOW_BROKER_URL=sentinels.url,
            CHORDFLOW_RESULT_BACKEND=sentinels.url,
            CHORDFLOW_REDIS_MASTER_NAME=MASTER_NAME,
        )
        yield cluster, sentinels
    finally:
        cluster.stop()
        if sentinels is not None:
            sentinels.stop()
