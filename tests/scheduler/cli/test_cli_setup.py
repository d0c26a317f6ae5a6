"""`make run` installs only what running needs; `make test` adds the dev tools (checked with `make -n`); both leave
chordflow's own bytecode compiled (a real `make install`)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.scheduler.cli.test_cli import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def dry_run(target: str, venv: Path) -> list[str]:
    """The commands `make TARGET` would run with the virtualenv at `venv`."""
    # Not the flags of a `make test` this suite may be running under (they would add "Entering directory").
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    argv = ["make", "--no-print-directory", "-n", target, f"VENV={venv}"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True)
    return proc.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    return [line.split("pip install --quiet ", 1)[1] for line in commands if "pip install --quiet " in line]


def test_make_run_on_a_fresh_machine_installs_without_the_dev_tools(tmp_path: Path) -> None:
    commands = dry_run("run", tmp_path / "venv")
    assert any(" -m venv " in line for line in commands)
    assert installs(commands) == ["--upgrade pip", "-e ."]
    assert commands[-1].endswith("chordflow run examples/word_counts.json --input folder=examples/texts")


@pytest.mark.parametrize("target", ["test", "install", "lint", "bench"])
def test_dev_targets_on_a_fresh_machine_install_the_dev_extra(tmp_path: Path, target: str) -> None:
    assert installs(dry_run(target, tmp_path / "venv")) == ["--upgrade pip", "-e .", "-e '.[dev]'"]


def test_each_level_is_installed_once(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".installed-run").touch()  # newer than pyproject.toml: `make run` has been done
    assert installs(dry_run("run", venv)) == []
    assert installs(dry_run("test", venv)) == ["-e '.[dev]'"]
    (venv / ".installed-dev").touch()
    assert installs(dry_run("test", venv)) == []


@pytest.mark.processes
def test_make_install_leaves_chordflows_own_bytecode_compiled(tmp_path: Path) -> None:
    """Each command is a fresh process: where PYTHONDONTWRITEBYTECODE=1 is set, nothing compiled at install time
    means every module compiled again at every start. A real `make install` into a fresh virtualenv, in a copy of the
    sources (none compiled yet), with that variable set: every module of ir, scheduler and worker has its .pyc.
    The virtualenv sees this one's packages (a .pth file), so pip finds every dependency installed, offline."""
    repo, venv = tmp_path / "repo", tmp_path / "venv"
    for package in ("ir", "scheduler", "worker"):
        shutil.copytree(ROOT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, repo / name)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([venv / "bin" / "python", "-c", purelib], capture_output=True, text=True, check=True)
    (Path(site.stdout.strip()) / "this_suite.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    made = subprocess.run(
        ["make", "--no-print-directory", "install", f"VENV={venv}"], cwd=repo,
        env={**env, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    modules = [path for package in ("ir", "scheduler", "worker") for path in (repo / package).rglob("*.py")]
    assert len(modules) > 100
    assert [m for m in modules if not Path(importlib.util.cache_from_source(str(m))).exists()] == []
