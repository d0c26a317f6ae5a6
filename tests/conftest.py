"""Test configuration: the test node types as a plugin, the `backend` fixture, per-test state reset."""

from __future__ import annotations

import os
import tempfile

import pytest

# Set at import time: the scheduler and every worker started later read the same variable.
os.environ["CHORDFLOW_PLUGINS"] = "tests.support.nodes,tests.support.dist_nodes"
# Local runs record checkpoints in the embedded store: never the developer's ~/.chordflow.
os.environ["CHORDFLOW_HOME"] = tempfile.mkdtemp(prefix="chordflow-home-")

from tests.support import kinds
from tests.support import nodes as test_nodes  # imported after the environment is set

pytest_plugins = ["tests.support.cluster", "tests.support.llm_server"]

BACKENDS = ["local", "celery"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The batch backend to run on; every batch behaviour test through scheduler.run takes it.

    "celery" runs on the suite's own redis-server and real worker processes (tests/support/cluster.py).
    """
    if request.param == "celery":
        request.getfixturevalue("celery_cluster")
    return request.param


@pytest.fixture(autouse=True)
def _reset_test_nodes() -> None:
    """Module-level state of the in-process test nodes starts empty in every test."""
    test_nodes.reset()


def pytest_configure(config: pytest.Config) -> None:
    for kind in kinds.KINDS:
        config.addinivalue_line("markers", f"{kind}: the test starts real processes ({kind}); tests/support/kinds.py")
    runs_tests = hasattr(config, "workerinput") or not config.getoption("numprocesses", None)  # not xdist's controller
    if (
        os.environ.get("CHORDFLOW_TEST_FAST") and runs_tests
    ):  # `make test-fast`: a test starting a process unmarked fails
        kinds.refuse_processes()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test's markers from what it starts: its fixtures' `@starts` tags, a cluster backend (kinds.py)."""
    for item in items:
        for kind in sorted(kinds.kinds_of(item)):
            item.add_marker(kind)
