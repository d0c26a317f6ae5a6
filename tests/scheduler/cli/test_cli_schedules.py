"""`chordflow schedule add|list|pause|resume|remove` and their Python functions against a real redis-server (no
worker: nothing here fires): what each prints, the table and `--json` of `list`, a replaced schedule said so, and
every bad value (name, cron, timezone, catchup, workflow, input, no signing key, an unknown schedule) one `error:` line
with no traceback and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import UnknownSchedule, ValidationError
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import ROOT, assert_one_line_error
from tests.scheduler.test_durable import cli
from tests.support.cluster import PLUGINS
from tests.support.kinds import starts

pytestmark = pytest.mark.processes  # every test runs `chordflow` commands

WORKFLOW = {
    "inputs": {"who": {"description": "whom to greet", "required": True}},
    "nodes": [{"id": "hi", "type": "echo", "params": {"text": "hello ${who}"}}],
}


@pytest.fixture(scope="module")
@starts("processes")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A redis-server of its own (no worker: a schedule added here never fires); this process points at it."""
    cluster = Cluster(tmp_path_factory.mktemp("schedules"), plugins=PLUGINS)
    previous = cluster.apply_env()
    try:
        yield cluster
    finally:
        cluster.restore_env(previous)
        cluster.stop()


@pytest.fixture
def wf(tmp_path: Path) -> Path:
    path = tmp_path / "greet.json"
    path.write_text(json.dumps(WORKFLOW))
    return path


def listed(state: Cluster) -> list[dict[str, Any]]:
    proc = cli(state, "schedule", "list", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_add_list_pause_resume_remove(state: Cluster, wf: Path) -> None:
    added = cli(state, "schedule", "add", "nightly", wf, "--cron", "0 2 * * *", "--timezone", "Europe/Berlin",
                "--input", "who=ann", "--catchup", "all")  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith(f"added schedule 'nightly': {wf} at '0 2 * * *' (Europe/Berlin), catchup all; ")
    assert " 02:00:00 CE" in added.stdout and " UTC)" in added.stdout  # the next fire, in its timezone and in UTC
    assert "no chordflow worker is registered" in added.stderr
    [shown] = listed(state)
    assert {k: shown[k] for k in ("name", "cron", "timezone", "catchup", "paused", "priority", "last_run")} == {
        "name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Berlin", "catchup": "all", "paused": False,
        "priority": "normal", "last_run": None,
    }  # fmt: skip
    assert shown["next_fire"] > time.time() and shown["next_fire_local"].startswith(time.strftime("%Y-"))
    assert shown["next_fire_local"][11:19] == "02:00:00" and shown["next_fire_utc"].endswith("+00:00")

    table = cli(state, "schedule", "list").stdout.splitlines()  # a pipe: tab-separated, a header first
    assert table[0].split("\t") == ["name", "cron", "timezone", "catchup", "paused", "next fire", "next fire (UTC)",
                                    "last run"]  # fmt: skip
    row = table[1].split("\t")
    assert row[:5] == ["nightly", "0 2 * * *", "Europe/Berlin", "all", "no"] and row[-1] == "-"
    assert row[5].endswith((" CET", " CEST")) and row[6].endswith(" UTC")

    paused = cli(state, "schedule", "pause", "nightly")
    assert (paused.returncode, paused.stdout) == (0, "paused schedule 'nightly'\n"), paused.stderr
    [shown] = listed(state)
    assert shown["paused"] is True and shown["next_fire"] is None
    assert cli(state, "schedule", "list").stdout.splitlines()[1].split("\t")[4:7] == ["yes", "-", "-"]

    resumed = cli(state, "schedule", "resume", "nightly")
    assert resumed.returncode == 0 and resumed.stdout.startswith("resumed schedule 'nightly': next fire ")
    [shown] = listed(state)
    assert shown["paused"] is False and shown["next_fire"] > time.time()

    removed = cli(state, "schedule", "remove", "nightly")
    assert (removed.returncode, removed.stdout) == (0, "removed schedule 'nightly'\n")
    assert listed(state) == []


def test_adding_a_name_again_replaces_the_schedule_and_says_so(state: Cluster, wf: Path) -> None:
    first = cli(state, "schedule", "add", "again", wf, "--cron", "0 2 * * *", "-i", "who=ann")
    assert first.returncode == 0 and first.stdout.startswith("added schedule 'again'"), first.stderr
    second = cli(state, "schedule", "add", "again", wf, "--cron", "*/30 * * * * *", "-i", "who=bob", "--priority",
                 "high")  # fmt: skip
    assert second.returncode == 0 and second.stdout.startswith("replaced schedule 'again'"), second.stderr
    [shown] = listed(state)
    assert (shown["cron"], shown["catchup"], shown["priority"]) == ("*/30 * * * * *", "last", "high")
    assert shown["next_fire"] - time.time() <= 30  # seconds first: every 30 s
    cli(state, "schedule", "remove", "again")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--cron", "61 * * * *", "-i", "who=ann"], "error: --cron '61 * * * *': "),
        (["--cron", "* * *", "-i", "who=ann"], "error: --cron '* * *': 3 fields; expected 5 fields"),
        (
            ["--cron", "@daily", "--timezone", "Mars/Olympus", "-i", "who=a"],
            "error: --timezone 'Mars/Olympus': unknown",
        ),
        (["--cron", "@daily", "--catchup", "some", "-i", "who=a"], "error: Invalid value for '--catchup': 'some' is"),
        (["--cron", "@daily", "--priority", "urgent", "-i", "who=a"], "error: Invalid value for '--priority'"),
        (["-i", "who=ann"], "error: Missing option '--cron'"),
        (["--cron", "@daily", "-i", "whom=ann"], "error: --input whom=...: "),
        (["--cron", "@daily"], "error: inputs.who: required input 'who' was not given"),
    ],
)
def test_a_bad_option_is_one_error_line_and_nothing_is_written(
    state: Cluster, wf: Path, args: list[str], said: str
) -> None:
    line = assert_one_line_error(cli(state, "schedule", "add", "bad", wf, *args), 2)
    assert line.startswith(said), line
    assert listed(state) == []


def test_a_bad_name_workflow_or_key_is_one_error_line_and_nothing_is_written(state: Cluster, tmp_path: Path) -> None:
    good = tmp_path / "ok.json"
    good.write_text(json.dumps(WORKFLOW))
    line = assert_one_line_error(cli(state, "schedule", "add", "no spaces", good, "--cron", "@daily", "-i", "who=a"), 2)
    assert line.startswith("error: schedule name 'no spaces': expected 1 to 100 letters")
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"nodes": [{"id": "a", "type": "no-such-type"}]}))
    line = assert_one_line_error(cli(state, "schedule", "add", "wf", broken, "--cron", "@daily"), 2)
    assert "no-such-type" in line
    line = assert_one_line_error(cli(state, "schedule", "add", "wf", tmp_path / "missing.json", "--cron", "@daily"), 2)
    assert "missing.json" in line
    env = {**state.env, "CHORDFLOW_PLUGINS": PLUGINS, "CHORDFLOW_SECRET_KEY": ""}  # a client without the key
    argv = ["schedule", "add", "keyless", str(good), "--cron", "@daily", "-i", "who=a"]
    keyless = subprocess.run([sys.executable, "-m", "scheduler.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=120)  # fmt: skip
    assert "CHORDFLOW_SECRET_KEY" in assert_one_line_error(keyless, 1)
    assert listed(state) == []


@pytest.mark.parametrize("command", ["remove", "pause", "resume"])
def test_an_unknown_schedule_is_one_error_line(state: Cluster, command: str) -> None:
    line = assert_one_line_error(cli(state, "schedule", command, "nope"), 2)
    assert line == "error: no schedule named 'nope' (`chordflow schedule list` shows them)"


def test_the_python_functions(state: Cluster, wf: Path) -> None:
    added = scheduler.schedule("py", str(wf), "*/10 * * * * *", inputs={"who": "cy"}, catchup="none")
    assert (added["name"], added["replaced"], added["catchup"], added["workflow"]) == ("py", False, "none", str(wf))
    assert [s["name"] for s in scheduler.list_schedules()] == ["py"]
    assert scheduler.pause_schedule("py")["paused"] is True
    assert scheduler.resume_schedule("py")["next_fire"] is not None
    scheduler.unschedule("py")
    with pytest.raises(UnknownSchedule):
        scheduler.unschedule("py")
    with pytest.raises(ValidationError, match=r"^catchup 'often': expected one of none, last, all$"):
        scheduler.schedule("py", str(wf), "@daily", inputs={"who": "cy"}, catchup="often")
    assert scheduler.list_schedules() == []
