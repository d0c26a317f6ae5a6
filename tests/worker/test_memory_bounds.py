"""Bounded memory: a run's snapshots leave Redis when they are no longer needed, and a worker keeps decoded
snapshots within a byte budget (not a count: eight 200 MB snapshots would hold gigabytes)."""

from __future__ import annotations

from typing import Any

import redis

import scheduler
from scheduler import durable
from scheduler.localcluster import Cluster
from worker.cluster.batches.snapshot_cache import SnapshotCache

BIG = "x" * 200_000  # far above the 16 KiB inline limit: the snapshot travels by reference


def workflow(fail_on: int | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"value": "${item}"}  # the store, `big` included, is the snapshot
    if fail_on is not None:
        params["fail_on"] = fail_on
    batch = {"items": "${items}", "chunk_size": 3}
    return {"nodes": [{"id": "b", "type": "test-fail", "params": params, "batch": batch}]}


def snapshot_keys(cluster: Cluster, run_id: str) -> list[bytes]:
    return list(redis.Redis.from_url(cluster.redis.url).scan_iter(match=f"cf:{{{run_id}}}:snap:*"))


def test_snapshots_are_deleted_when_the_batch_is_merged(celery_cluster: Cluster) -> None:
    result = scheduler.run(workflow(), {"items": list(range(10)), "big": BIG}, backend="celery")
    assert result.status == "success" and result.shared["b"]["count"] == 10
    assert snapshot_keys(celery_cluster, result.run_id) == []


def test_a_cluster_runs_snapshots_are_gone_when_it_ends_even_failed(celery_cluster: Cluster) -> None:
    for fail_on, status in ((None, "success"), (4, "failed")):
        run_id = durable.submit(workflow(fail_on), {"items": list(range(10)), "big": BIG})
        try:
            outcome = durable.wait(run_id, timeout=60).status
        except ValueError:  # fail_fast: the item's exception is raised again here
            outcome = "failed"
        assert outcome == status
        assert snapshot_keys(celery_cluster, run_id) == []


def test_the_worker_snapshot_cache_is_bounded_by_bytes_least_recently_used_first() -> None:
    cache = SnapshotCache(budget_bytes=250)
    fetched: list[str] = []

    def get(key: str, size: int) -> Any:
        def fetch() -> bytes:
            fetched.append(key)
            return b"." * size

        return cache.get(key, fetch, len)

    assert get("a", 100) == 100 and get("b", 100) == 100
    assert get("a", 100) == 100  # a hit: not fetched again, and now the most recently used
    assert fetched == ["a", "b"]
    get("c", 100)  # 300 > 250: the least recently used ("b") goes
    assert "b" not in cache and "a" in cache and "c" in cache and cache.used == 200
    get("huge", 1000)  # bigger than the whole budget: decoded, not kept, nothing else evicted
    assert "huge" not in cache and len(cache) == 2 and cache.used == 200
