"""Run ids a person can use: `runs` prints whole ids (a tab-separated table in a pipe, whole
ids in an 80-column terminal), and every command taking a run id takes a unique prefix of 4 characters or more."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import scheduler
from scheduler.localcluster import RedisServer
from tests.scheduler.cli.test_cli import cli_env, run_cli
from tests.scheduler.cli.test_cli_terminal import run_in_terminal
from tests.support.kinds import starts

#: No cluster: the shared Redis of the machine holds other suites' runs.
NO_REDIS = "redis://127.0.0.1:1/0"
WF = {"name": "a-workflow-with-a-rather-long-name", "nodes": [{"id": "a", "type": "echo", "params": {"x": 1}}]}


@pytest.fixture
def two_runs(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two finished local runs whose ids share their first 10 characters, alone in an embedded store of their own
    (other tests' runs, e.g. one with a 100-character id, would widen the table) and with no cluster to list."""
    monkeypatch.setenv("CHORDFLOW_HOME", str(tmp_path_factory.mktemp("home")))
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", NO_REDIS)
    monkeypatch.setenv("CHORDFLOW_RESULT_BACKEND", NO_REDIS)
    stem = "r" + uuid.uuid4().hex[:9]
    ids = (f"{stem}-first-of-two", f"{stem}-second-of-two")
    for run_id in ids:
        assert scheduler.run(WF, run_id=run_id).status == "success"
    return ids


@pytest.mark.processes
def test_runs_in_a_pipe_is_a_tab_separated_table_of_whole_values(two_runs: tuple[str, str]) -> None:
    proc = run_cli("runs", "--limit", "100", env=cli_env(CHORDFLOW_BROKER_URL=NO_REDIS))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = ["run", "workflow", "backend", "priority", "status", "progress", "started", "duration"]
    assert lines[0].split("\t") == header
    rows = {line.split("\t")[0]: line.split("\t") for line in lines[1:]}
    for run_id in two_runs:
        assert rows[run_id][1:5] == [WF["name"], "local", "normal", "succeeded"]


@pytest.mark.processes
def test_runs_in_an_80_column_terminal_prints_whole_ids_and_statuses(two_runs: tuple[str, str]) -> None:
    code, screen = run_in_terminal("runs", "--limit", "100", columns=80)
    assert code == 0, screen
    table = [line for line in screen.splitlines() if not line.startswith("warning: local runs only")]  # no cluster
    assert all(len(line) <= 80 for line in table), screen
    for run_id in two_runs:
        line = next(line for line in screen.splitlines() if run_id in line)  # whole, on one line
        assert "succeeded" in line


@pytest.mark.processes
def test_a_unique_prefix_names_the_run_and_an_ambiguous_one_lists_the_matches(two_runs: tuple[str, str]) -> None:
    first, second = two_runs
    env = cli_env(CHORDFLOW_BROKER_URL=NO_REDIS)
    status = run_cli("status", first[:13], "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert f'"run_id": "{first}"' in status.stdout
    ambiguous = run_cli("status", first[:10], env=env)
    assert ambiguous.returncode == 2
    assert ambiguous.stderr.strip() == (
        f"error: run id prefix '{first[:10]}' matches 2 runs: {first}, {second} (give more characters)"
    )
    short = run_cli("status", first[:3], env=env)  # fewer than 4 characters: looked up as a whole id, not found
    assert short.returncode == 1 and first not in short.stdout and "cannot reach Redis" in short.stderr


@pytest.fixture(scope="module")
@starts("processes")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("run-ids"))
    try:
        yield server
    finally:
        server.kill()


@pytest.mark.parametrize("call", [scheduler.status, scheduler.wait])
def test_an_unknown_run_is_a_lookup_error_not_a_validation_error(
    call, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHORDFLOW_BROKER_URL", redis_server.url)
    with pytest.raises(LookupError, match=r"^unknown run 'no-such-run-21b'") as raised:
        call("no-such-run-21b")
    assert not isinstance(raised.value, ValueError) and raised.value.run_id == "no-such-run-21b"
