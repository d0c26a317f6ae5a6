"""Provider batches on a real cluster, against the loopback provider's batch APIs: a run waiting for its provider
batch holds no worker, outlives every worker, and is never in two provider batches (the one it made is found again,
even when its worker died before it could record the batch's id); `cancel` cancels the provider batch; `status`
shows each provider batch's counts and the deadline."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler import api
from scheduler.localcluster import Cluster
from tests.support import llm_server
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts
from tests.support.llm_server import Provider
from tests.worker.cluster.test_waits import shown_waiting
from tests.worker.llm.test_provider_batches import answered, batched, prompts, synced


@pytest.fixture
@starts("cluster")
def served(tmp_path: Path) -> Iterator[tuple[Provider, Cluster]]:
    """A loopback provider, and a cluster of no worker yet whose workers and this process point at it."""
    with llm_server.serving() as provider:
        env = {**os.environ, **llm_server.environment(provider)}
        env.pop("CHORDFLOW_LLM_MODEL", None)
        cluster = Cluster(tmp_path, plugins=PLUGINS, base_env=env)
        previous = cluster.apply_env()
        try:
            with pytest.MonkeyPatch.context() as patch:
                for name, value in llm_server.environment(provider).items():
                    patch.setenv(name, value)
                patch.delenv("CHORDFLOW_LLM_MODEL", raising=False)
                yield provider, cluster
        finally:
            cluster.restore_env(previous)
            cluster.stop()


def until(what: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_provider_batch_outlives_every_worker_and_is_made_once(served: tuple[Provider, Cluster]) -> None:
    provider, cluster = served
    provider.batch_delay = 6.0
    worker = cluster.start_worker("p1")
    run_id = api.submit(batched("openai/gpt-test", 40, deadline="1h"))
    waiting = shown_waiting(run_id)
    assert waiting["text"].startswith("waiting for 1 provider batch: 0/40 answered, deadline ")
    (shown,) = waiting["provider_batches"]
    assert shown["provider"] == "openai" and shown["total"] == 40 and shown["id"] == provider.batches_created[0][1]
    shown_text = subprocess.run([sys.executable, "-m", "scheduler.cli", "status", run_id], capture_output=True,
                                text=True, timeout=60).stdout  # fmt: skip
    assert waiting["text"] in shown_text and f"openai {shown['id']}: 0/40 answered, 0 refused (running)" in shown_text
    worker.kill()  # nothing alive while the provider answers
    until(lambda: time.time() > provider.batch_jobs[shown["id"]].created + provider.batch_delay + 1)
    cluster.start_worker("p2")
    done = api.wait(run_id, timeout=120)
    assert done.status == "success", done.error
    assert [r["response"] for r in done.shared["ask"]["results"]] == [f"echo: {p}" for p in prompts(40)]
    assert len(provider.batches_created) == 1  # found again, not made a second time
    assert answered(provider) == Counter(str(i) for i in range(40)) and not synced(provider)


@pytest.mark.parametrize("model", ["openai/gpt-test", "anthropic/claude-test"])
def test_a_batch_made_by_a_worker_that_died_before_recording_its_id_is_found_not_made_again(
    served: tuple[Provider, Cluster], model: str
) -> None:
    provider, cluster = served
    provider.batch_delay, provider.answer_creates = 1.0, threading.Event()  # creates are not answered: yet
    worker = cluster.start_worker("p1")
    run_id = api.submit(batched(model, 12))
    until(lambda: len(provider.batches_created) == 1)
    worker.kill()  # the provider made the batch; the worker never heard its id
    provider.answer_creates.set()
    started = time.monotonic()
    cluster.start_worker("p2")
    done = api.wait(run_id, timeout=180)
    assert done.status == "success", done.error
    assert [r["response"] for r in done.shared["ask"]["results"]] == [f"echo: {p}" for p in prompts(12)]
    assert len(provider.batches_created) == 1
    assert answered(provider) == Counter(str(i) for i in range(12)) and not synced(provider)
    print(f"\n{model}: the run found its batch and ended {time.monotonic() - started:.1f} s after a new worker")


def test_cancel_cancels_the_provider_batch(served: tuple[Provider, Cluster]) -> None:
    provider, cluster = served
    provider.batch_delay = 3600.0
    cluster.start_worker("p1")
    run_id = api.submit(batched("anthropic/claude-test", 5, deadline="2h"))
    (shown,) = shown_waiting(run_id)["provider_batches"]
    api.cancel(run_id)
    assert api.wait(run_id, timeout=60).status == "cancelled"
    assert provider.batch_cancels == [shown["id"]]
    assert not synced(provider)
