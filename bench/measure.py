"""Measurement helpers: wall time, the scheduler's peak RSS increase, Redis bytes in, worker-log phases."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import re
import signal
import sys
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


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- resident set size ---------------------------------------------------------------------------
def _status_kb(field_name: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field_name}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match.group(1)) if match else None


def current_rss() -> int:
    """This process's resident set size in bytes."""
    if psutil is not None:
        return psutil.Process().memory_info().rss
    kb = _status_kb("VmRSS")
    return (kb or 0) * 1024


def _reset_peak() -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


class PeakRss:
    """Peak RSS increase over a block: VmHWM after a reset (exact), else a 2 ms psutil sampler."""

    def __init__(self) -> None:
        self.before = 0
        self.peak = 0
        self.method = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.before = current_rss()
        if _reset_peak():
            self.method = "VmHWM"
        else:
            self.method = "sampled"
            self.peak = self.before
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, current_rss())

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, current_rss())
        else:
            self.peak = (_status_kb("VmHWM") or 0) * 1024

    @property
    def increase(self) -> int:
        return max(0, self.peak - self.before)


# -- a per-run deadline --------------------------------------------------------------------------
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


# -- Redis bytes -------------------------------------------------------------------------------
def redis_bytes_in(client: Any) -> int:
    """total_net_input_bytes of the bench's own redis-server (everything clients wrote to it)."""
    return int(client.info("stats")["total_net_input_bytes"])


# -- worker logs ---------------------------------------------------------------------------------
_LINE = re.compile(
    r"^\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): \w+/[\w-]+\] Task (?P<name>[\w.]+)\[(?P<id>[\w-]+)\] "
    r"(?P<what>received|succeeded in (?P<secs>[\d.e-]+)s)"
)


def _epoch(stamp: str) -> float:
    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


@dataclass
class Phases:
    """What the workers' own log lines (ms timestamps, same clock) say about one run."""

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
    """Reads what the workers logged since `mark()`; the chord body's "succeeded" line ends a run."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self.offsets = {p: 0 for p in paths}

    def mark(self) -> None:
        self.offsets = {p: p.stat().st_size if p.exists() else 0 for p in self.paths}

    def _new_lines(self) -> Iterator[str]:
        for path in self.paths:
            with path.open("rb") as f:
                f.seek(self.offsets[path])
                for raw in f:
                    yield raw.decode("utf-8", "replace")

    def phases(self, body_task: str, timeout: float = 10.0) -> Phases:
        """Parse the lines since mark(); waits (up to `timeout`) for the body's line to be written."""
        stop = time.monotonic() + timeout
        while True:
            phases = Phases()
            for line in self._new_lines():
                m = _LINE.match(line)
                if not m:
                    continue
                at = _epoch(m.group("ts"))
                if m.group("what") == "received":
                    if m.group("name") != body_task and (phases.first_received is None or at < phases.first_received):
                        phases.first_received = at
                elif m.group("name") == body_task:
                    phases.body_s += float(m.group("secs"))
                    phases.body_done = at
                    phases.body_id = m.group("id")
                else:
                    phases.tasks += 1
                    phases.busy_s += float(m.group("secs"))
                    phases.last_header_done = max(phases.last_header_done or at, at)
            if phases.body_done is not None or time.monotonic() > stop:
                return phases
            time.sleep(0.02)


# -- one measured call -----------------------------------------------------------------------------
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


def measure(
    call: Callable[[], Any],
    *,
    redis_client: Any = None,
    logs: WorkerLogs | None = None,
    body_task: str = "",
    meta_reader: Callable[[str], dict[str, Any]] | None = None,
    limit: int = 600,
    what: str = "run",
) -> tuple[Sample, Any]:
    """Time `call()` (perf_counter around the whole dispatch-and-wait) with its peak RSS increase."""
    gc.collect()  # the previous run's garbage (e.g. 2,000 AsyncResults unsubscribing) is not this run's
    if logs is not None:
        logs.mark()
    before_bytes = redis_bytes_in(redis_client) if redis_client is not None else None
    with deadline(limit, what), PeakRss() as rss:
        wall_start = time.time()
        t0 = time.perf_counter()
        value = call()
        seconds = time.perf_counter() - t0
        wall_end = wall_start + seconds
    sample = Sample(seconds, rss.increase)
    if logs is not None:  # waits for the body's log line: its trailing writes (ack, events) land first
        phases = logs.phases(body_task)
        if phases.body_id and meta_reader is not None:
            phases.body_done = stored_at(meta_reader, phases.body_id) or phases.body_done
        sample.phases = phases.as_dict(wall_start, wall_end)
    if redis_client is not None and before_bytes is not None:
        sample.bytes_in = redis_bytes_in(redis_client) - before_bytes
    return sample, value
