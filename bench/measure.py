"""What the benches read off processes: peak RSS (this one's, the workers'), CPU, Redis memory and bytes, and
what the workers' own log lines say about a run. Nothing here starts a process (bench/harness.py does)."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import psutil
except ImportError:  # psutil is optional: /proc is enough on Linux
    psutil = None


# -- resident set size: this process, and others by pid ------------------------------------------------
def status_kb(name: str, pid: int | str = "self") -> int | None:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM), in bytes; None when unreadable."""
    with contextlib.suppress(OSError):
        match = re.search(rf"^{name}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.MULTILINE)
        if match:
            return int(match.group(1)) * 1024
    return None


def reset_peak(pid: int | str = "self") -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return status_kb("VmHWM", pid) is not None


def current_rss() -> int:
    if psutil is not None:
        return psutil.Process().memory_info().rss
    return status_kb("VmRSS") or 0


class PeakRss:
    """This process's peak RSS increase over a block: VmHWM after a reset (exact), else a 2 ms sampler."""

    def __init__(self) -> None:
        self.before = self.peak = 0
        self.method = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.before = current_rss()
        if reset_peak():
            self.method = "VmHWM"
        else:
            self.method, self.peak = "sampled", self.before
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, current_rss())

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            self.peak = status_kb("VmHWM") or 0
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, current_rss())

    @property
    def increase(self) -> int:
        return max(0, self.peak - self.before)


def process_tree(pid: int) -> list[int]:
    """pid and its descendants (a prefork worker's pool children; none for solo)."""
    pids = [pid]
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{pid}/task/{tid}/children").read_text().split():
                    pids += process_tree(int(child))
    return pids


class WorkerPeaks:
    """Peak RSS (VmHWM) of the worker processes, reset before a phase; `resettable` False when a reset failed
    (the peaks are then lifetime peaks)."""

    def __init__(self, pids: Callable[[], list[int]]):
        self.pids = pids
        self.resettable = True

    def reset(self) -> None:
        for pid in self.pids():
            self.resettable = reset_peak(pid) and self.resettable

    def read(self) -> dict[int, int]:
        return {pid: status_kb("VmHWM", pid) or 0 for pid in self.pids()}


# -- CPU -----------------------------------------------------------------------------------------------
def process_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) these processes have used so far (/proc/<pid>/stat)."""
    ticks = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / os.sysconf("SC_CLK_TCK")


def machine_busy() -> float:
    """CPU seconds every core of the machine has spent busy since boot (/proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


class CpuUse:
    """CPU used over a block by the workers, by redis-server, by this process and the children it reaped (the
    CLI processes), and by the whole machine: the difference is other processes' load on the same cores."""

    def __init__(self, workers: Callable[[], list[int]], redis_pid: int):
        self.workers, self.redis_pid = workers, redis_pid
        self.start: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def read(self) -> dict[str, float]:
        mine = os.times()
        return {
            "workers": process_cpu(self.workers()),
            "redis": process_cpu([self.redis_pid]),
            "clients": mine.user + mine.system + mine.children_user + mine.children_system,
            "machine": machine_busy(),
            "wall": time.perf_counter(),
        }

    def __enter__(self) -> CpuUse:
        self.start = self.read()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self.read()
        self.used = {k: end[k] - self.start[k] for k in end}
        self.used["others"] = self.used["machine"] - self.used["workers"] - self.used["redis"] - self.used["clients"]

    def text(self) -> str:
        u, cores = self.used, os.cpu_count() or 1
        return (
            f"{u['machine']:.0f} s busy of {u['wall'] * cores:.0f} s ({cores} cores x wall): "
            f"workers {u['workers']:.0f} s, redis-server {u['redis']:.0f} s, the CLI processes and this bench "
            f"{u['clients']:.0f} s, **other processes {max(0.0, u['others']):.0f} s**"
        )


# -- Redis -----------------------------------------------------------------------------------------------
def redis_bytes_in(client: Any) -> int:
    """total_net_input_bytes of the bench's own redis-server (everything clients wrote to it)."""
    return int(client.info("stats")["total_net_input_bytes"])


class RedisPeak:
    """Redis's used_memory sampled every 10 ms over a block, beside its lifetime used_memory_peak
    (CONFIG RESETSTAT does not reset the peak on Redis 7.0)."""

    def __init__(self, client: Any):
        self.client = client
        self.before = self.sampled = self.lifetime = self.lifetime_before = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RedisPeak:
        memory = self.client.info("memory")
        self.before = self.sampled = int(memory["used_memory"])
        self.lifetime_before = int(memory["used_memory_peak"])
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            with contextlib.suppress(Exception):
                self.sampled = max(self.sampled, int(self.client.info("memory")["used_memory"]))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        memory = self.client.info("memory")
        self.sampled = max(self.sampled, int(memory["used_memory"]))
        self.lifetime = int(memory["used_memory_peak"])

    def as_dict(self) -> dict[str, int]:
        return {
            "redis_before": self.before,
            "redis_sampled": self.sampled,
            "redis_lifetime": self.lifetime,
            "redis_lifetime_before": self.lifetime_before,
        }


# -- worker logs -------------------------------------------------------------------------------------------
_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[\w-]+\] Task (?P<name>[\w.]+)\[(?P<id>[\w-]+)\] "
    r"(?:received|succeeded in (?P<secs>[\d.e-]+)s)"
)


@dataclass
class Phases:
    """What the workers' log lines (ms timestamps, same clock) say about one chord: its header and body."""

    tasks: int = 0  # header tasks that succeeded
    busy_s: float = 0.0  # sum of the header tasks' run times, over both workers
    body_s: float = 0.0  # the chord body's run time
    first_received: float | None = None
    last_header_done: float | None = None
    body_done: float | None = None  # the log line; replaced by the result's `date_done` when readable
    body_id: str | None = None

    def as_dict(self, started: float, returned: float) -> dict[str, Any]:
        def ms(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round((b - a) * 1000, 1)

        return {
            "tasks": self.tasks,
            "busy_s": round(self.busy_s, 4),
            "body_s": round(self.body_s, 4),
            "to_first_ms": ms(started, self.first_received),
            "headers_done_ms": ms(started, self.last_header_done),
            "body_done_ms": ms(started, self.body_done),
            "notice_ms": ms(self.body_done, returned),
        }


class WorkerLogs:
    """The workers' `Task ... received` / `succeeded in` lines written since `mark()`."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.offsets = dict.fromkeys(paths, 0)

    def mark(self) -> None:
        self.offsets = {p: p.stat().st_size if p.exists() else 0 for p in self.paths}

    def entries(self) -> Iterator[tuple[float, str, str, float | None]]:
        """(epoch, task name, task id, run seconds or None for "received") per line since mark()."""
        for path in self.paths:
            with path.open("rb") as f:
                f.seek(self.offsets[path])
                for raw in f:
                    m = _LINE.match(raw.decode("utf-8", "replace"))
                    if m:
                        at = dt.datetime.strptime(m.group("ts"), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                        secs = m.group("secs")
                        yield at, m.group("name"), m.group("id"), None if secs is None else float(secs)

    def phases(self, body_task: str, timeout: float = 10.0) -> Phases:
        """One chord's phases; waits (up to `timeout`) for the body's "succeeded" line to be written."""
        stop = time.monotonic() + timeout
        while True:
            phases = Phases()
            for at, name, task_id, secs in self.entries():
                if secs is None:
                    if name != body_task and (phases.first_received is None or at < phases.first_received):
                        phases.first_received = at
                elif name == body_task:
                    phases.body_s += secs
                    phases.body_done, phases.body_id = at, task_id
                else:
                    phases.tasks += 1
                    phases.busy_s += secs
                    phases.last_header_done = max(phases.last_header_done or at, at)
            if phases.body_done is not None or time.monotonic() > stop:
                return phases
            time.sleep(0.02)

    def tasks(self, settle: float = 0.5) -> dict[str, Any]:
        """Per task name, [succeeded, summed run seconds]; when the first task was received and the last done."""
        time.sleep(settle)  # the last task's "succeeded" line is written after its result
        tasks: dict[str, list[float]] = {}
        first = last = None
        for at, name, _id, secs in self.entries():
            if secs is None:
                first = at if first is None else min(first, at)
            else:
                entry = tasks.setdefault(name, [0, 0.0])
                entry[0] += 1
                entry[1] += secs
                last = at if last is None else max(last, at)
        return {"tasks": tasks, "first_received": first, "last_done": last}


# -- one measured in-process call ----------------------------------------------------------------------
@contextlib.contextmanager
def deadline(seconds: int, what: str) -> Iterator[None]:
    """Raise TimeoutError in the main thread if the block runs longer than `seconds`."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} did not finish within {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Sample:
    seconds: float
    rss_increase: int
    bytes_in: int | None = None
    phases: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def stored_at(meta_reader: Callable[[str], dict[str, Any]], task_id: str) -> float | None:
    """When the worker stored a task's result (its `date_done`, microseconds, timezone-aware)."""
    try:
        done = meta_reader(task_id).get("date_done")
    except Exception:
        return None
    if isinstance(done, str):
        done = dt.datetime.fromisoformat(done)
    return done.timestamp() if isinstance(done, dt.datetime) else None


def time_call(
    call: Callable[[], Any],
    *,
    redis_client: Any = None,
    logs: WorkerLogs | None = None,
    body_task: str = "",
    meta_reader: Callable[[str], dict[str, Any]] | None = None,
    limit: int = 600,
    what: str = "run",
) -> Sample:
    """Time `call()` (perf_counter around the whole dispatch-and-wait) with its peak RSS increase."""
    gc.collect()  # the previous run's garbage (e.g. 2,000 AsyncResults unsubscribing) is not this run's
    if logs is not None:
        logs.mark()
    before_bytes = redis_bytes_in(redis_client) if redis_client is not None else None
    with deadline(limit, what), PeakRss() as rss:
        wall_start = time.time()
        t0 = time.perf_counter()
        call()
        seconds = time.perf_counter() - t0
    sample = Sample(seconds, rss.increase)
    if logs is not None:  # waits for the body's log line: its trailing writes (ack, events) land first
        phases = logs.phases(body_task)
        if phases.body_id and meta_reader is not None:
            phases.body_done = stored_at(meta_reader, phases.body_id) or phases.body_done
        sample.phases = phases.as_dict(wall_start, wall_start + seconds)
    if before_bytes is not None:
        sample.bytes_in = redis_bytes_in(redis_client) - before_bytes
    return sample
