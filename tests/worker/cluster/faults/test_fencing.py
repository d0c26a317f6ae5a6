"""A worker whose claim on a run was taken over never acts again.

A worker paused (SIGSTOP) past the dead-delivery bound during a plain node: its advance is delivered again,
another worker goes on from the checkpoint and finishes the run. When the paused one wakes up (SIGCONT), the
node it was running finishes — the one side effect that may happen twice — and its checkpoint is refused (the
run moved on): it stops there with one WARNING, and runs none of the following nodes again.
Real redis-server, real workers, default settings (tests/worker/cluster/faults/test_dead_workers.py's cluster and
counting node).
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from scheduler import api
from tests.worker.cluster.faults.test_dead_workers import WITHIN, Counts, default_cluster, log_lines, until

pytestmark = pytest.mark.processes  # every test here starts real processes (commands, servers, workers)

TAKEN_OVER = "was taken over by another worker"


def test_a_worker_paused_during_a_plain_node_stops_at_its_checkpoint_when_it_wakes_up(tmp_path: Path) -> None:
    with default_cluster(tmp_path) as cluster:
        counts = Counts(cluster)
        nodes = [
            {"id": f"n{i}", "type": "test-count", "params": {"key": counts.key, "label": str(i), "seconds": s}}
            for i, s in enumerate([0, 3, 0, 0])
        ]
        run_id = api.submit({"nodes": nodes})
        who = until(lambda: next((w for w, label in counts.runs() if label == "1"), None), 60, "n1 to start")
        paused = cluster.workers[who]
        paused.kill(signal.SIGSTOP)
        try:
            result = api.wait(run_id, timeout=WITHIN)  # the other worker goes on from n1's checkpoint
        finally:
            paused.kill(signal.SIGCONT)
        assert result.status == "success"
        until(lambda: log_lines(cluster, TAKEN_OVER), 60, "the woken worker to find it was fenced")
        effects = counts.effects()
        assert effects == {0: 1, 1: 2, 2: 1, 3: 1}  # only the node in flight when it was paused ran twice
        assert [label for w, label in counts.runs() if w == who and label in ("2", "3")] == []  # nothing after n1
        assert len(log_lines(cluster, TAKEN_OVER)) == 1


def test_a_worker_paused_inside_a_parallel_branch_stops_at_its_checkpoint_when_it_wakes_up(tmp_path: Path) -> None:
    """The same inside a branch of a parallel section: the branch's advance is delivered again and goes on from
    the branch's checkpoint; the woken worker's branch checkpoint is refused (its branch lease was taken over)."""
    with default_cluster(tmp_path) as cluster:
        counts = Counts(cluster)

        labels = {"start": 0, "a1": 1, "a2": 2, "b1": 3, "merge": 4}

        def node(name: str, seconds: float = 0) -> dict:
            params = {"key": counts.key, "label": labels[name], "seconds": seconds}
            return {"id": name, "type": "test-count", "params": params}

        nodes = [node("start"), node("a1", 3), node("a2"), node("b1"), node("merge")]
        edges = [
            {"from": "start", "to": "a1", "parallel": True, "fan_in": "merge"},
            {"from": "start", "to": "b1", "parallel": True, "fan_in": "merge"},
            {"from": "a1", "to": "a2"},
            {"from": "a2", "to": "merge"},
            {"from": "b1", "to": "merge"},
        ]
        run_id = api.submit({"nodes": nodes, "edges": edges})
        who = until(lambda: next((w for w, label in counts.runs() if label == "1"), None), 60, "a1 to start")
        paused = cluster.workers[who]
        paused.kill(signal.SIGSTOP)
        try:
            result = api.wait(run_id, timeout=WITHIN)  # the other worker goes on from the branch's checkpoint
        finally:
            paused.kill(signal.SIGCONT)
        assert result.status == "success", result.error
        until(lambda: log_lines(cluster, TAKEN_OVER), 60, "the woken worker to find it was fenced")
        effects = counts.effects()
        assert effects == {0: 1, 1: 2, 2: 1, 3: 1, 4: 1}, effects  # only a1 ran twice
        after = [label for w, label in counts.runs() if w == who and label in ("2", "4")]
        assert after == [], after  # the woken worker ran nothing after a1
        assert len(log_lines(cluster, TAKEN_OVER)) == 1
