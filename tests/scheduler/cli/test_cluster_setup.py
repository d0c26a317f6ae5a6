"""The cluster set-up tells the truth: `chordflow flower` without flower, its auth hint, and
`runs` when the cluster's Redis does not answer. (Unnamed workers: tests/worker/cluster/test_worker_registry.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from scheduler.localcluster import free_port
from tests.scheduler.cli.test_cli import ROOT, cli_env, run_cli

pytestmark = pytest.mark.processes  # every test here starts real processes (commands, servers, workers)


def test_flower_not_installed_says_how_to_install_it() -> None:
    """An interpreter where `import flower` fails (a None entry in sys.modules is how Python spells "absent")."""
    code = "import sys; sys.modules['flower'] = None; from scheduler.cli import main; main(['flower'])"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr == "error: flower is not installed: make install (or pip install flower)\n"
    assert "Usage:" not in proc.stdout + proc.stderr


def test_flower_without_basic_auth_shows_the_placeholder_unmasked() -> None:
    env = {k: v for k, v in cli_env().items() if k != "FLOWER_BASIC_AUTH"}
    proc = run_cli("flower", env=env)
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: FLOWER_BASIC_AUTH is not set: set it to user:password (or pass --unauthenticated) to start Flower\n"
    )


def test_runs_with_redis_unreachable_warns_that_it_lists_local_runs_only() -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    proc = run_cli("runs", env=cli_env(CHORDFLOW_BROKER_URL=nowhere, CHORDFLOW_RESULT_BACKEND=nowhere))
    assert proc.returncode == 0
    assert proc.stdout.startswith("run\tworkflow\t")
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"warning: local runs only: cannot reach Redis at {nowhere} (")
