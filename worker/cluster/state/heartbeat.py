"""The worker registry: every live worker's pool size in Redis, kept alive by a heartbeat (docs/ARCHITECTURE.md).

A worker sets `cf:{workers}:<hostname>` = its pool size when it is ready, refreshes it every
`worker_heartbeat` seconds from a daemon thread and deletes it on shutdown; a worker that dies without
shutting down (SIGKILL, lost host) drops out when its key expires. Chunk sizing reads the registry with
one SCAN and one MGET instead of broadcasting to the workers. The `{workers}` hash tag keeps every entry
in one Redis Cluster slot, so the MGET works there as well.
"""

from __future__ import annotations

import contextlib
import logging

import redis

from worker.cluster.state.keys import WORKERS, worker_key
from worker.periodic import Periodic

log = logging.getLogger(__name__)

#: An entry outlives this many missed heartbeats.
MISSED_BEATS = 3


def pool_sizes(client: redis.Redis) -> dict[str, int]:
    """Pool size of every registered worker, by hostname."""
    keys = list(client.scan_iter(match=WORKERS + "*", count=1000))
    if not keys:
        return {}
    sizes = {}
    for name, value in zip(keys, client.mget(keys), strict=True):
        if value is not None:  # expired between the SCAN and the MGET
            hostname = name.decode() if isinstance(name, bytes) else name
            sizes[hostname[len(WORKERS) :]] = int(value)
    return sizes


class Heartbeat(Periodic):
    """Keeps one worker's registry entry alive until `stop()`.

    Parameters: the state Redis client, the worker's hostname, its pool size, and the seconds between
    refreshes (the entry expires after MISSED_BEATS of them).
    """

    name = "chordflow-heartbeat"

    def __init__(self, client: redis.Redis, hostname: str, processes: int, interval: int):
        super().__init__(interval)
        self.client = client
        self.key = worker_key(hostname)
        self.processes = processes

    def start(self) -> None:
        self.tick()  # registered before the worker says it is ready
        super().start()

    def stop(self) -> None:
        super().stop()
        with contextlib.suppress(redis.RedisError, OSError):  # the entry expires anyway
            self.client.delete(self.key)

    def tick(self) -> None:
        try:
            self.client.set(self.key, self.processes, ex=self.interval * MISSED_BEATS)
        except (redis.RedisError, OSError) as exc:  # Redis away for a moment: the next beat tries again
            log.warning("could not register this worker in Redis: %s", exc)
