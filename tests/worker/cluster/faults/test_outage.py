"""An outage of chordflow's own Redis is never a node's failure, and a command gives up after a set time.

With real processes: tests/worker/cluster/faults/test_network_cut.py (a worker's host cut off) and
tests/worker/cluster/faults/test_redis_outage.py.
"""

from __future__ import annotations

import time

import pytest
import redis

import scheduler
from ir.errors import Outage
from scheduler.localcluster import free_port
from worker.cluster.outage import DeadlineRetry

LOSE = {"type": "python", "params": {"function": "tests.support.pyfuncs:lose_redis"}}


def test_a_command_retries_a_lost_connection_for_its_budget_then_fails() -> None:
    client = redis.Redis(
        port=free_port(), socket_connect_timeout=0.2, retry=DeadlineRetry(1.0), retry_on_error=[redis.ConnectionError]
    )
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        client.ping()  # nothing listens there: refused, tried again with backoff, until the budget is spent
    assert 0.5 <= time.monotonic() - started < 5  # a 1 s budget: retried meanwhile, then given up


def test_an_outage_inside_a_batch_item_is_not_the_items_failure() -> None:
    """error_handling `continue` would record an item failure and go on; an Outage leaves the chunk instead."""
    node = {**LOSE, "id": "b", "batch": {"items": "${items}", "error_handling": "continue"}}
    with pytest.raises(Outage):
        scheduler.run({"nodes": [node]}, {"items": [1, 2]}, backend="local")


def test_an_outage_is_never_routed_to_the_error_successor() -> None:
    workflow = {
        "nodes": [{**LOSE, "id": "a"}, {"id": "handled", "type": "echo", "params": {"text": "handled"}}],
        "edges": [{"from": "a", "to": "handled", "action": "error"}],
    }
    with pytest.raises(Outage):
        scheduler.run(workflow, backend="local")
