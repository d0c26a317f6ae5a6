"""A message the broker lost is sent again: a run at any priority goes on.

kombu's Redis transport takes a message off its list with BRPOP and only then, once it has read the reply, records it
in `unacked`; a worker killed in between (the fault campaign saw it after SIGKILLs of a worker just started) loses the
message: no list, no `unacked`, nothing to deliver again. Before, a message below the top level came back only by
aging (after `CHORDFLOW_PRIORITY_AGING`, a minute by default), and a top-level one never: its run stayed `queued`.
Now every message is recorded when it is sent, and an aging sweep sends again one whose list has let it go and that
no delivery began (worker/cluster/aging.py).

Real redis-server and `celery` workers. The state the loss leaves is made on purpose: no worker consumes the queue
while the run's first message is taken off its list by the test (RPOP, as the killed worker's BRPOP did); then a
worker that consumes it starts. Aging is an hour, so no aging copy runs it instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from scheduler import durable
from scheduler.localcluster import Cluster
from tests.scheduler.test_durable import lines, side_effect
from tests.support.cluster import sweeping_cluster
from tests.worker.cluster.faults.test_long_chunks import until
from worker import settings
from worker.cluster.broker.redis import RedisBroker

#: The dead-delivery bound (CHORDFLOW_VISIBILITY_TIMEOUT): a record older than it and a sweep of deliveries (1 s)
#: may be taken for lost.
BOUND = 2


@pytest.fixture
def idle_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with sweeping_cluster(tmp_path, visibility_timeout=BOUND) as cluster:
        yield cluster


@pytest.mark.processes
@pytest.mark.parametrize("priority", ["high", "normal"])
def test_a_runs_message_the_broker_lost_is_sent_again_and_the_run_goes_on(
    priority: str, idle_cluster: Cluster, tmp_path: Path
) -> None:
    r = redis.Redis.from_url(idle_cluster.redis.url)
    log = tmp_path / "log"
    run_id = durable.submit({"nodes": [side_effect("n1", log)], "priority": priority})
    lists = [name for _, name in RedisBroker(settings.load()).lists(settings.load().queue)]
    taken = until(lambda: next((m for name in lists if (m := r.rpop(name)) is not None), None), 30, "its advance sent")
    assert taken is not None and r.hlen("unacked") == 0  # the lost message: in no list, not unacked
    lost_at = time.monotonic()
    idle_cluster.start_worker("k2")
    result = durable.wait(run_id, timeout=60)
    assert result.status == "success", result.error
    assert lines(log) == ["n1"]
    assert any("was lost by the broker" in w.log.read_text() for w in idle_cluster.workers.values())
    print(f"{priority}: the run ended {time.monotonic() - lost_at:.1f} s after its message was lost")
