"""What `chordflow run` shows on a terminal while nodes run, captured through a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scheduler.cli.test_cli import ROOT, cli_env, run_cli, write_wf

pytestmark = pytest.mark.processes  # every test here starts real processes (commands, servers, workers)

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
SPINNER_LINE = re.compile(r"([\u2800-\u28ff]) running (\w+) (\d+\.\d)s")  # dots spinner frames are braille

SLEEPY_WF = {
    "nodes": [
        {"id": "nap", "type": "shell", "params": {"command": "sleep 1.5"}},
        {"id": "src", "type": "echo", "params": {"records": [1, 2, 3]}},
        {"id": "each", "type": "shell", "batch": {"items": "${src.records}"}, "params": {"command": "sleep 0.2"}},
    ]
}


def run_in_terminal(*args: str, timeout: float = 60, columns: int = 120) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pty; return its exit code and everything the terminal got."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", *args],
        cwd=ROOT,
        env=cli_env(TERM="xterm", COLUMNS=str(columns)),
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    captured = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            captured += chunk
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return code, ANSI.sub("", captured.decode("utf-8", "replace"))


def test_a_running_node_shows_a_spinner_with_its_elapsed_time(tmp_path: Path) -> None:
    code, screen = run_in_terminal("run", str(write_wf(tmp_path, SLEEPY_WF)))
    assert code == 0, screen
    frames = SPINNER_LINE.findall(screen)
    nap = [(frame, float(seconds)) for frame, node, seconds in frames if node == "nap"]
    assert nap, screen
    assert max(seconds for _, seconds in nap) >= 1.0  # the time counts up while the node runs
    assert len({frame for frame, _ in nap}) > 1  # and the spinner turns
    assert "status: success" in screen


def test_a_batch_progress_bar_replaces_the_spinner_of_its_node(tmp_path: Path) -> None:
    code, screen = run_in_terminal("run", str(write_wf(tmp_path, SLEEPY_WF)))
    assert code == 0, screen
    first_bar = re.search(r"each [━╸╺]+ 1/3", screen)  # the bar is drawn with heavy lines
    assert first_bar, screen
    assert screen.rfind("running each") < first_bar.start()  # no spinner for `each` once its bar shows
    assert "running" not in screen[screen.index("3/3") :]  # and none left over when the run ends


def test_no_spinner_without_a_terminal(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, SLEEPY_WF))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "running" not in proc.stdout
