"""Pytest fixtures for distributed tests: a real redis-server and real Celery workers (no fakes)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from scheduler.localcluster import Cluster

# The workers' environment: the suite's, as it is when conftest loads this plugin — not whatever a
# monkeypatching test happens to have set when the session cluster is first started.
BASE_ENV = dict(os.environ)


@pytest.fixture(scope="session")
def celery_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The suite's shared cluster: its own redis-server on a free port and two solo workers."""
    cluster = Cluster(
        tmp_path_factory.mktemp("cluster"), plugins="tests.support.nodes,tests.support.dist_nodes", base_env=BASE_ENV
    )
    try:
        cluster.start_worker("w1")
        cluster.start_worker("w2")
        previous = cluster.apply_env()
        yield cluster
        cluster.restore_env(previous)
    finally:
        cluster.stop()
