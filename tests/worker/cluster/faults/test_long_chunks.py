"""Chunks that run longer than the visibility timeout, with a real redis-server and real workers (no fakes).

kombu's Redis transport delivers an unacknowledged message again once its entry in the `unacked_index`
sorted set is older than the visibility timeout. A running chunk's lease (worker/cluster/broker/deliveries.py) keeps
renewing that entry while its worker is alive, so a long chunk runs once; a killed worker stops renewing,
so its chunk is delivered again after the timeout. Side effects are counted in files: "ran exactly once"
is a fact on disk, and worker logs say how often each chunk was received.
"""

from __future__ import annotations

import collections
import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kombu.transport import redis as kombu_redis

from scheduler import durable
from scheduler.localcluster import Cluster
from tests.support.cluster import destroyable_cluster
from tests.support.kinds import starts

VISIBILITY_TIMEOUT = 4
#: A long chunk runs this many visibility timeouts.
LONG = 2.5


@pytest.fixture(scope="module")
@starts("faults")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the tests that keep their workers alive (low visibility timeout)."""
    with destroyable_cluster(tmp_path_factory.mktemp("long-chunks"), VISIBILITY_TIMEOUT) as cluster:
        yield cluster


@pytest.fixture
@starts("faults")
def own_cluster(tmp_path: Path) -> Iterator[Cluster]:
    with destroyable_cluster(tmp_path, VISIBILITY_TIMEOUT) as cluster:
        yield cluster


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def until(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `condition` (Redis, a file) until it is truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.05)
    return value


def long_batch(log: Path, chunk_size: int, **params: Any) -> dict[str, Any]:
    """A batch whose items append their item to `log`; each chunk of `chunk_size` items runs LONG timeouts."""
    seconds = LONG * VISIBILITY_TIMEOUT / chunk_size
    node = {"id": "b", "type": "test-side-effect", "params": {"log": str(log), "label": "${item}", "seconds": seconds}}
    node["params"].update(params)
    return {"nodes": [{**node, "batch": {"items": "${items}", "chunk_size": chunk_size}}]}


def task_log(cluster: Cluster, task: str, word: str) -> list[str]:
    """Lines of every worker's log about a `task` task that contain `word` ("received", ...)."""
    found = []
    for worker in cluster.workers.values():
        found += [line for line in lines(worker.log) if f"{task}[" in line and word in line]
    return found


def chunk_log(cluster: Cluster, word: str) -> list[str]:
    """Lines of every worker's log about a `chordflow.run_chunk` task that contain `word` ("received", ...)."""
    return task_log(cluster, "chordflow.run_chunk", word)


def chunk_seconds(lines_: list[str]) -> list[float]:
    """Run times of chunks from the workers' "succeeded in 10.01s" lines."""
    return [float(m.group(1)) for line in lines_ if (m := re.search(r"succeeded in ([0-9.]+)s", line))]


def assert_each_index_once(result: Any, total: int) -> None:
    assert result.status == "success"
    aggregate = result.shared["b"]
    assert (aggregate["count"], aggregate["success_count"], aggregate["error_count"]) == (total, total, 0)
    assert [r["label"] for r in aggregate["results"]] == [str(i) for i in range(total)]  # each outcome once, in order


def running_chunks(broker: redis.Redis) -> dict[str, float]:
    """Delivery tag -> score of every `chordflow.run_chunk` message in kombu's unacked index."""
    found = {}
    for tag, score in broker.zrange("unacked_index", 0, -1, withscores=True):
        payload = broker.hget("unacked", tag)
        if payload is None:  # acknowledged between the two reads
            continue
        message, _exchange, _routing_key = json.loads(payload)
        assert message["properties"]["delivery_tag"] == tag.decode()  # the member IS the delivery tag
        if message["headers"]["task"] == "chordflow.run_chunk":
            found[tag.decode()] = score
    return found


# -- the kombu behaviour the lease relies on ----------------------------------------------------------------


def test_kombu_redis_transport_keeps_the_names_the_lease_relies_on() -> None:
    """Fails loudly when a kombu upgrade renames the unacked index or its transport options."""
    assert kombu_redis.Channel.unacked_index_key == "unacked_index"
    assert kombu_redis.Channel.unacked_key == "unacked"
    options = set(kombu_redis.Channel.from_transport_options)
    assert {"visibility_timeout", "unacked_index_key", "unacked_key", "global_keyprefix"} <= options
    assert "ZADD" in kombu_redis.PrefixedStrictRedis.PREFIXED_SIMPLE_COMMANDS  # a key prefix reaches the renewal


def test_a_running_chunk_is_indexed_by_delivery_tag_and_its_lease_keeps_it_fresh(
    cluster: Cluster, tmp_path: Path
) -> None:
    log, gate = tmp_path / "side-effects.log", tmp_path / "gate"
    broker = redis.Redis.from_url(cluster.redis.url)
    received = len(chunk_log(cluster, "received"))
    run_id = durable.submit(long_batch(log, 1, seconds=0, gate=str(gate)), {"items": [0]})
    tag, first = next(iter(until(lambda: running_chunks(broker), 60, "the chunk in kombu's unacked index").items()))
    while time.time() < first + LONG * VISIBILITY_TIMEOUT:  # the chunk waits for the gate meanwhile
        score = running_chunks(broker).get(tag)
        assert score is not None, "the running chunk left the unacked index: it was delivered again"
        assert time.time() - score < VISIBILITY_TIMEOUT, "the running chunk's entry is older than the timeout"
        time.sleep(0.2)
    assert lines(log) == []  # still running: nobody got past the gate
    gate.touch()
    assert_each_index_once(durable.wait(run_id, timeout=60), 1)
    assert lines(log) == ["0"]
    assert len(chunk_log(cluster, "received")) == received + 1  # delivered once
    assert broker.zscore("unacked_index", tag) is None  # acknowledged: the lease added nothing back
    assert broker.hget("unacked", tag) is None


# -- long chunks ------------------------------------------------------------------------------------------


def test_chunks_longer_than_the_visibility_timeout_run_each_item_exactly_once(cluster: Cluster, tmp_path: Path) -> None:
    total, chunk_size = 40, 10
    log = tmp_path / "side-effects.log"
    received, succeeded = len(chunk_log(cluster, "received")), len(chunk_log(cluster, "succeeded"))
    started = time.monotonic()
    run_id = durable.submit(long_batch(log, chunk_size), {"items": list(range(total))})
    result = durable.wait(run_id, timeout=120)
    elapsed = time.monotonic() - started
    assert_each_index_once(result, total)
    assert collections.Counter(lines(log)) == {str(i): 1 for i in range(total)}  # every item ran once
    assert len(chunk_log(cluster, "received")) == received + total // chunk_size  # no chunk delivered twice
    seconds = chunk_seconds(chunk_log(cluster, "succeeded")[succeeded:])
    assert len(seconds) == total // chunk_size and min(seconds) > VISIBILITY_TIMEOUT, seconds
    print(f"\n{total} items, chunks of {max(seconds):.1f}s under a {VISIBILITY_TIMEOUT}s timeout: {elapsed:.1f}s")


def test_probe_scaled_down_many_long_chunks_finish_with_each_item_once(cluster: Cluster, tmp_path: Path) -> None:
    """A probe that once never finished (20k items, 11 s chunks, 8 s timeout, never finished), scaled down."""
    total, chunk_size = 2000, 250
    log = tmp_path / "side-effects.log"
    received = len(chunk_log(cluster, "received"))
    started = time.monotonic()
    run_id = durable.submit(long_batch(log, chunk_size), {"items": list(range(total))})
    result = durable.wait(run_id, timeout=200)
    elapsed = time.monotonic() - started
    assert_each_index_once(result, total)
    executions = collections.Counter(lines(log))
    assert executions == {str(i): 1 for i in range(total)}, f"{sum(executions.values())} executions"
    assert len(chunk_log(cluster, "received")) == received + total // chunk_size
    print(f"\n{total} items in {total // chunk_size} chunks of ~{LONG * VISIBILITY_TIMEOUT:.0f}s: {elapsed:.1f}s")


def test_a_plain_node_and_a_branch_node_longer_than_the_visibility_timeout_run_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Every long task holds a lease, not only chunks: an advance running a long plain node and a branch advance
    running a long node inside a parallel branch are renewed like any delivery, so neither is delivered again."""
    log, seconds = tmp_path / "side-effects.log", LONG * VISIBILITY_TIMEOUT

    def node(name: str, wait: float = 0) -> dict[str, Any]:
        return {"id": name, "type": "test-side-effect", "params": {"log": str(log), "label": name, "seconds": wait}}

    edges = [
        {"from": "long", "to": "fork"},
        {"from": "fork", "to": "a", "parallel": True, "fan_in": "merge"},
        {"from": "fork", "to": "b", "parallel": True, "fan_in": "merge"},
        {"from": "a", "to": "merge"},
        {"from": "b", "to": "merge"},
    ]
    nodes = [node("long", seconds), node("fork"), node("a", seconds), node("b"), node("merge")]
    advances = len(task_log(cluster, "chordflow.advance", "received"))
    result = durable.wait(durable.submit({"nodes": nodes, "edges": edges}), timeout=120)
    assert result.status == "success", result.error
    assert collections.Counter(lines(log)) == {"long": 1, "fork": 1, "a": 1, "b": 1, "merge": 1}
    # The run's advances: the first (long, fork -> the branches) and the one at the section after the join.
    assert len(task_log(cluster, "chordflow.advance", "received")) == advances + 2
    assert not task_log(cluster, "chordflow.advance", "delivered again")


# -- a worker dies mid-chunk --------------------------------------------------------------------------------


def test_chunk_of_a_sigkilled_worker_is_delivered_again_after_the_timeout(own_cluster: Cluster, tmp_path: Path) -> None:
    total, chunk_size = 40, 10
    log = tmp_path / "side-effects.log"
    run_id = durable.submit(long_batch(log, chunk_size), {"items": list(range(total))})
    victim = own_cluster.workers["k1"]
    victim.wait_for_line("chordflow.run_chunk[")  # k1 received a chunk...
    until(lambda: len(lines(log)) >= 2, 60, "items to run")  # ...and items are running
    victim.kill(signal.SIGKILL)
    killed = time.monotonic()
    assert not [line for line in lines(victim.log) if "succeeded" in line and "chordflow.run_chunk[" in line]
    result = durable.wait(run_id, timeout=120)
    recovered = time.monotonic() - killed
    assert_each_index_once(result, total)
    executions = collections.Counter(lines(log))
    assert set(executions) == {str(i) for i in range(total)}  # every item ran (at least once)
    twice = sorted(int(item) for item, count in executions.items() if count > 1)
    assert all(count <= 2 for count in executions.values()), executions
    assert len({i // chunk_size for i in twice}) <= 1, twice  # only the killed chunk's items ran again
    print(f"\nkilled mid-chunk; run done {recovered:.1f}s later; items run twice: {twice}")
