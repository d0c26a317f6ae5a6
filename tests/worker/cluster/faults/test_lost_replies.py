"""A write Redis ran whose reply was lost is sent again, and must not count twice or fence its own sender.

Every chordflow client rides out a dropped connection by sending the command again (worker/cluster/outage.py). When
the connection drops after Redis ran the command and before its reply came back — Redis stopped with SIGTERM does
exactly that (it flushes its AOF, not the replies; the fault campaign's schedule 408 met it) — the command runs
twice. A relay in front of a real redis-server (tests/support/lost_replies.py) loses one chosen reply on purpose;
real `celery` workers reach the run state through it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import scheduler
from scheduler import durable
from scheduler.localcluster import Cluster
from tests.scheduler.test_durable import lines, side_effect
from tests.support import llm_server
from tests.support.cluster import PLUGINS
from tests.support.llm_server import Provider
from tests.support.lost_replies import Relay, relay
from tests.worker.llm.test_llm_budget import BILLED, budgeted
from worker.cluster.state.keys import RunKeys
from worker.cluster.state.once import once


def lose_reply_of(through: Relay, cluster: Cluster, name: str, *arguments: str) -> None:
    """Lose the reply to the next run of a chordflow Lua script run once per call (worker/cluster/state/once.py):
    loaded first, so that run is its EVALSHA (an unloaded script's first EVALSHA only fails NOSCRIPT, and losing
    that reply loses nothing); with `arguments`, the next run given them."""
    direct = redis.Redis.from_url(cluster.redis.url)
    script = once(direct, name).script
    direct.script_load(script.script)
    through.arm(script.sha.encode(), *(f"${len(a)}\r\n{a}\r\n".encode() for a in arguments))


@contextlib.contextmanager
def relayed_cluster(workdir: Path, env: dict[str, str] | None = None) -> Iterator[tuple[Cluster, Relay]]:
    """A cluster (one solo worker, `env` on top of this process's) whose run state, for the worker and this process,
    goes through a relay."""
    cluster = Cluster(workdir, visibility_timeout=5, plugins=PLUGINS, base_env={**os.environ, **(env or {})})
    with relay(cluster.redis.port) as through:
        cluster.env["CHORDFLOW_RESULT_BACKEND"] = through.url
        previous = cluster.apply_env()
        try:
            cluster.start_worker("k1")
            yield cluster, through
        finally:
            cluster.restore_env(previous)
            cluster.stop()


@pytest.fixture
def relayed(tmp_path: Path) -> Iterator[tuple[Cluster, Relay]]:
    with relayed_cluster(tmp_path) as made:
        yield made


def test_a_checkpoint_whose_reply_was_lost_is_its_own_when_sent_again_and_the_run_goes_on(
    relayed: tuple[Cluster, Relay], tmp_path: Path
) -> None:
    """Before: the checkpoint sent again found the run one step on, took it for another worker's, and the advance
    stopped (Fenced); no advance was left to go on, and the run stayed `running`."""
    cluster, through = relayed
    log = tmp_path / "log"
    lose_reply_of(through, cluster, "checkpoint")
    run_id = durable.submit({"nodes": [side_effect("n1", log), side_effect("n2", log), side_effect("n3", log)]})
    result = durable.wait(run_id, timeout=30)
    assert through.dropped.is_set()
    assert result.status == "success"
    assert lines(log) == ["n1", "n2", "n3"]


@pytest.mark.parametrize("script", ["reserve_budget", "settle_budget"])
def test_a_budget_write_whose_reply_was_lost_counts_once(script: str, tmp_path: Path) -> None:
    """Four model calls of 3 tokens each (11 reserved each) under a budget; the reply of the first call's
    reservation, or settlement, is lost. Before: the write ran twice, so 11 tokens stayed reserved for a call long
    over (reserve) or the call was billed twice and 11 tokens un-reserved that no call held (settle)."""
    with llm_server.serving(Provider()) as provider:
        given = llm_server.environment(provider)
        with relayed_cluster(tmp_path, given) as (cluster, through), pytest.MonkeyPatch.context() as patch:
            for name, value in given.items():
                patch.setenv(name, value)
            lose_reply_of(through, cluster, script)
            run_id = scheduler.submit(budgeted(1000, 4, chunk_size=4))
            result = scheduler.wait(run_id, timeout=60)
            budget = redis.Redis.from_url(cluster.redis.url).hgetall(RunKeys(run_id).budget)
    assert through.dropped.is_set()
    assert result.status == "success", result.error
    assert sum(provider.tokens()) == 4 * BILLED
    assert int(budget[b"spent_tokens"]) == 4 * BILLED
    assert int(budget[b"reserved_tokens"]) == 0


@pytest.mark.parametrize("script", ["batch_window", "dataset_step"])
def test_a_finish_whose_reply_was_lost_sends_the_chunks_it_claimed_and_each_item_runs_once(
    script: str, relayed: tuple[Cluster, Relay], tmp_path: Path
) -> None:
    """12 items (a batch's, a dataset job's records) in chunks of 1, a few in flight at most (2 of a batch, 4 of a
    job): the first chunk to finish claims the next in its reply, which is lost. Before, for a dataset job: sent
    again, the finish found itself counted (`dup`) and claimed nothing, so that chunk was never sent and the job
    never ended. (A batch's window sends a counted finish's claims again, so the batch ended before too.)"""
    cluster, through = relayed
    log = tmp_path / "log"
    lose_reply_of(through, cluster, script, "finish")
    node = side_effect("b", log, label="${item}")
    labels = [f"i{n}" for n in range(12)]
    if script == "batch_window":
        node["batch"] = {"items": "${items}", "chunk_size": 1}
        run_id = scheduler.submit({"nodes": [node]}, {"items": labels})
    else:
        node["params"]["label"] = "${record}"
        run_id = scheduler.submit({"nodes": [node]}, items=labels, as_="record", chunk_size=1)
    result = scheduler.wait(run_id, timeout=30)
    assert through.dropped.is_set()
    assert result.status == "success", result.error
    assert sorted(lines(log)) == sorted(labels)
