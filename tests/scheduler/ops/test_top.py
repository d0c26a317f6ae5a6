"""`chordflow top`: a live view of the cluster's runs and workers, driven through a
pseudo-terminal against the suite's cluster while a run is held by a gate; `q` quits and the terminal's mode
comes back."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import scheduler
from scheduler.localcluster import Cluster, free_port
from tests.scheduler.cli.test_cli import ROOT, run_cli
from tests.scheduler.cli.test_cli_terminal import ANSI
from tests.scheduler.ops.test_metrics import gated_batch
from tests.support.cluster import TEST_BROKER
from worker.llm import fake


def read_until(master: int, pattern: re.Pattern[str], timeout: float = 60) -> str:
    """What the terminal got (escape sequences removed) once `pattern` is in it; fails after `timeout` seconds."""
    captured, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            captured += os.read(master, 65536)
            screen = ANSI.sub("", captured.decode("utf-8", "replace"))
            if pattern.search(screen):
                return screen
    raise AssertionError(f"no {pattern.pattern!r} on the screen:\n{ANSI.sub('', captured.decode('utf-8', 'replace'))}")


def test_top_shows_a_running_runs_progress_and_quits_on_q(celery_cluster: Cluster, tmp_path: Path) -> None:
    wf, inputs, gate = gated_batch(tmp_path, "top-gated")
    run_id = scheduler.submit(wf, inputs)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # rows, columns
    cooked = termios.tcgetattr(slave)
    env = {**celery_cluster.env, "TERM": "xterm", "COLUMNS": "160", "LINES": "40"}
    top = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "top"], cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave
    )
    try:
        # Item 0 waits at its gate on one worker; the other worker ran items 1-5 (item 5 failed).
        frame = rf"{run_id}.*top-gated.*running.* b .*5/6 83%.* 1 (?s:.*)workers \(2\)"
        if TEST_BROKER == "redis":  # RabbitMQ does not tell a client its unacknowledged messages (README)
            frame += r"(?s:.*)chunks in flight 1"
        read_until(master, re.compile(frame))  # the whole frame (workers, queues): a read may end mid-frame
        assert termios.tcgetattr(slave)[3] & (termios.ICANON | termios.ECHO) == 0  # cbreak, no echo
        os.write(master, b"q")
        assert top.wait(timeout=30) == 0
        assert termios.tcgetattr(slave)[3] == cooked[3]  # the terminal's mode is back
    finally:
        if top.poll() is None:
            top.kill()
        os.close(master)
        os.close(slave)
        gate.write_text("open")
    assert scheduler.wait(run_id, timeout=60).status == "success"


def test_top_in_an_80x24_terminal_shows_whole_run_ids_and_the_progress(celery_cluster: Cluster, tmp_path: Path) -> None:
    """The columns that do not fit are dropped (workflow, node first), not the run id cut to `d4070b62…`."""
    wf, inputs, gate = gated_batch(tmp_path, "top-narrow")
    run_id = scheduler.submit(wf, inputs)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # rows, columns
    env = {**celery_cluster.env, "TERM": "xterm", "COLUMNS": "80", "LINES": "24"}
    top = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "top"], cwd=ROOT, env=env, stdin=slave, stdout=slave, stderr=slave
    )
    try:
        screen = read_until(master, re.compile(rf"{run_id} +. running .*5/6 83%.* 1 .(?s:.*)workers \(2\)"))
        assert "top-narrow" not in screen  # the workflow column made room
        assert max(len(line) for line in screen.splitlines()) <= 80
        os.write(master, b"q")
        assert top.wait(timeout=30) == 0
    finally:
        if top.poll() is None:
            top.kill()
        os.close(master)
        os.close(slave)
        gate.write_text("open")
    assert scheduler.wait(run_id, timeout=60).status == "success"


def test_top_without_a_terminal_prints_one_view(celery_cluster: Cluster, tmp_path: Path) -> None:
    wf, inputs, gate = gated_batch(tmp_path, "top-once")
    run_id = scheduler.submit(wf, inputs)
    try:
        shown = run_cli("top", env={**celery_cluster.env, "COLUMNS": "160"})
    finally:
        gate.write_text("open")
    assert shown.returncode == 0, shown.stderr
    assert run_id in shown.stdout and "top-once" in shown.stdout
    assert scheduler.wait(run_id, timeout=60).status == "success"


def test_top_shows_what_a_running_runs_model_calls_cost(celery_cluster: Cluster, tmp_path: Path) -> None:
    """A model call, then the gated batch: while the run waits, its llm column has the call's tokens."""
    wf, inputs, gate = gated_batch(tmp_path, "top-llm")
    ask = {"id": "ask", "type": "llm", "params": {"prompt": "one two three", "model": "fake"}}
    wf = {**wf, "nodes": [ask, *wf["nodes"]], "edges": [{"from": "ask", "to": "b"}]}
    _, tokens_in, tokens_out = fake.answer("fake", None, "one two three", 1.0)
    run_id = scheduler.submit(wf, inputs)
    cell = re.compile(rf"{run_id} .* 1 calls {tokens_in + tokens_out} tok")
    deadline = time.monotonic() + 60
    try:
        while not cell.search((shown := run_cli("top", env={**celery_cluster.env, "COLUMNS": "200"})).stdout):
            assert shown.returncode == 0, shown.stderr
            assert time.monotonic() < deadline, f"no {cell.pattern!r} in:\n{shown.stdout}"
    finally:
        gate.write_text("open")
    assert scheduler.wait(run_id, timeout=60).status == "success"


@pytest.mark.processes
def test_top_without_a_terminal_and_redis_away_says_so_in_one_line_and_exits_1() -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    shown = run_cli("top", env={**os.environ, "CHORDFLOW_BROKER_URL": nowhere, "CHORDFLOW_RESULT_BACKEND": nowhere})
    assert shown.returncode == 1
    [line] = shown.stderr.strip().splitlines()
    assert line.startswith(f"error: chordflow top: cannot read the cluster at {nowhere}: ")
