"""worker/settings.py: every CHORDFLOW_* variable in one model, read at call time; a bad value is one line
naming it; a variable nothing reads is named at the CLI's start, with the one it most likely meant."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from worker import settings

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = [sys.executable, "-m", "scheduler.cli", "validate", "examples/word_counts.json"]


def cli(**env: str) -> subprocess.CompletedProcess[str]:
    """`chordflow validate` of an example, in this environment plus `env`."""
    return subprocess.run(VALIDATE, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.processes
def test_a_misspelt_variable_is_one_warning_with_the_one_it_meant_and_the_command_still_runs() -> None:
    proc = cli(CHORDFLOW_BROKER_ULR="redis://elsewhere:6379/0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok: 3 nodes"
    warning = "chordflow: unknown environment variable CHORDFLOW_BROKER_ULR (did you mean CHORDFLOW_BROKER_URL?)"
    assert proc.stderr.splitlines() == [warning]


@pytest.mark.processes
def test_known_variables_give_no_warning() -> None:
    proc = cli(CHORDFLOW_QUEUE="elsewhere", CHORDFLOW_MAX_STEPS="50", CHORDFLOW_FUZZ_EXAMPLES="10")
    assert (proc.returncode, proc.stderr) == (0, "")
    assert settings.unknown({name: "1" for name in settings.KNOWN}) == []


def test_an_unknown_variable_with_nothing_close_is_named_alone() -> None:
    assert settings.unknown({"CHORDFLOW_ZZZ": "1", "OTHER_THING": "1"}) == [
        "chordflow: unknown environment variable CHORDFLOW_ZZZ"
    ]


def test_every_variable_the_code_names_is_declared() -> None:
    """A CHORDFLOW_* name spelt out in chordflow's code is one it reads (or sets for a child): never unknown."""
    named = set()
    for package in ("ir", "scheduler", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            named |= set(re.findall(r"[\"'](CHORDFLOW_[A-Z0-9_]+)[\"']", path.read_text()))
    assert named
    assert named <= settings.KNOWN, named - settings.KNOWN


def test_a_bad_integer_is_one_line_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_VISIBILITY_TIMEOUT", "an hour")
    with pytest.raises(ValueError) as info:
        settings.load()
    assert str(info.value) == "environment variable CHORDFLOW_VISIBILITY_TIMEOUT must be an integer, got 'an hour'"


@pytest.mark.processes
def test_a_bad_value_read_where_used_fails_only_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_MAX_STEPS", "x")
    assert settings.load().queue == "chordflow"  # the cluster settings do not need it
    with pytest.raises(ValueError) as info:
        settings.get("max_steps")
    assert str(info.value) == "environment variable CHORDFLOW_MAX_STEPS must be an integer, got 'x'"
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "run", "examples/word_counts.json", "--input", "folder=examples/texts"],
        cwd=ROOT, env={**os.environ, "CHORDFLOW_MAX_STEPS": "x"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "error: ValueError: environment variable CHORDFLOW_MAX_STEPS must be an integer, got 'x'"
    ]


def test_a_read_sees_the_environment_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHORDFLOW_MAX_STEPS", "7")
    assert settings.get("max_steps") == 7
    monkeypatch.setenv("CHORDFLOW_MAX_STEPS", "")  # empty: unset
    assert settings.get("max_steps") is None
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", "redis://one:6379/0")
    monkeypatch.delenv("CHORDFLOW_RESULT_BACKEND", raising=False)
    first = settings.load()
    assert (first.broker_url, first.result_backend) == ("redis://one:6379/0", "redis://one:6379/0")
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", "redis://two:6379/0")
    assert settings.load().result_backend == "redis://two:6379/0"
    assert settings.load() != first and hash(settings.load()) == hash(settings.load())


def test_bounds_flags_and_the_former_dataclass_api(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [("WORKER_HEARTBEAT", "0"), ("POOL_TIMEOUT", "-5"), ("SNAPSHOT_CACHE_BYTES", "-1")]:
        monkeypatch.setenv(f"CHORDFLOW_{name}", value)
    monkeypatch.setenv("CHORDFLOW_INSECURE", " Yes")
    s = settings.load()
    assert (s.worker_heartbeat, s.pool_timeout, s.snapshot_cache_bytes, s.insecure) == (1, 1, 0, True)
    moved = dataclasses.replace(s, broker_url="redis://x:1/0", result_backend="redis://x:1/0")
    assert (moved.broker_url, moved.queue, moved.insecure) == ("redis://x:1/0", s.queue, True)
    monkeypatch.setenv("CHORDFLOW_SECRET_KEY", "k" * 32)
    assert "k" * 32 not in repr(settings.load())
