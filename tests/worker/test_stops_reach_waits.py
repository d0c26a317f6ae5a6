"""Cancel, fail_fast and threshold aborts reach items that wait (worker/stopping.py): a rate-limit admission, a
retry's pause, a response not yet come. On the cluster a cancelled run reads `cancelled` within 5 s whatever its
items are doing, makes no call after the cancel and leaves its bucket to the next run; locally a fail_fast abort,
a cancel or a SIGINT of `chordflow run` ends waiting items within a couple of seconds.

The service is a real loopback HTTP server that records every request with its arrival time; a slow path holds
its answer and records when the client closed the connection under it."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

import scheduler
from ir.errors import BatchItemFailed
from scheduler import api
from scheduler.localcluster import Cluster
from tests.support.http_server import serving
from worker.cluster.state.runstate import RunState

#: The bound the spec names: a cancelled cluster run reads `cancelled` this soon after the cancel.
CANCELLED_WITHIN = 5.0
#: Seconds a slow answer is held (far past every bound below).
HELD = 60.0
#: 6 requests a minute: one call per 10.5 s with the bucket's headroom (worker/engine/rate_limits.py HEADROOM).
PER_MINUTE = 6
INTERVAL = 60 / (PER_MINUTE * 0.95)


class Service:
    """`/ok/<tag>/<i>` answers at once; `/slow/...` holds its answer HELD seconds, or until the client closes the
    connection (recorded in `closed`); `/fail/...` answers 500 once `fail_after` slow requests have arrived;
    `/busy/...` answers 429 asking for HELD seconds; `/drop/...` closes the connection without an answer."""

    def __init__(self, fail_after: int = 0) -> None:
        self.calls: list[tuple[float, str]] = []  # (arrival, path)
        self.closed: list[float] = []
        self.fail_after = fail_after
        self.changed = threading.Condition()
        self.released = threading.Event()

    def handler(self) -> type[BaseHTTPRequestHandler]:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with service.changed:
                    service.calls.append((time.monotonic(), self.path))
                    service.changed.notify_all()
                if self.path.startswith("/slow/"):
                    self.hold()
                    return
                if self.path.startswith("/drop/"):
                    self.close_connection = True  # no response at all
                    return
                if self.path.startswith("/busy/"):
                    self.answer(429, {"Retry-After": str(int(HELD))})
                    return
                if self.path.startswith("/fail/"):
                    with service.changed:
                        service.changed.wait_for(lambda: service.count("/slow/") >= service.fail_after, HELD)
                self.answer(500 if self.path.startswith("/fail/") else 200)

            def hold(self) -> None:
                """Wait for the release, watching the socket: a read of nothing means the client hung up."""
                deadline = time.monotonic() + HELD
                while time.monotonic() < deadline and not service.released.is_set():
                    readable, _, _ = select.select([self.connection], [], [], 0.05)
                    if readable and not self.connection.recv(1, socket.MSG_PEEK):
                        with service.changed:
                            service.closed.append(time.monotonic())
                            service.changed.notify_all()
                        return
                self.answer(200)

            def answer(self, status: int, headers: dict[str, str] | None = None) -> None:
                body = b'{"ok": true}'
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def count(self, prefix: str) -> int:
        return sum(1 for _, path in self.calls if path.startswith(prefix))

    def times(self, prefix: str) -> list[float]:
        with self.changed:
            return [at for at, path in self.calls if path.startswith(prefix)]

    def wait_for(self, condition: Callable[[], bool], timeout: float) -> None:
        with self.changed:
            assert self.changed.wait_for(condition, timeout), f"not within {timeout:g}s: {self.calls}"


@pytest.fixture
def service() -> Iterator[tuple[Service, str]]:
    svc = Service(fail_after=3)
    with serving(svc.handler()) as url:
        try:
            yield svc, url
        finally:
            svc.released.set()  # a held answer the test left behind goes out: the server's threads end


def http_batch(url: str, *, rate_key: str | None = None, items: str = "${items}", **batch: Any) -> dict:
    node: dict[str, Any] = {
        "id": "call",
        "type": "http",
        "params": {"url": url + "${item}", "timeout": HELD * 2},
        "batch": {"items": items, **batch},
    }
    if rate_key is not None:
        node["rate_limit"] = {"key": rate_key, "requests_per_minute": PER_MINUTE}
    return {"inputs": {"items": {"type": "array"}}, "nodes": [node]}


def status_within(run_id: str, expected: str, seconds: float) -> float:
    """Seconds until the run's status reads `expected` (polled), failing past `seconds`."""
    began = time.monotonic()
    while (status := api.status(run_id)["status"]) != expected:
        assert time.monotonic() - began < seconds, f"run {run_id} still {status} after {seconds:g}s"
        time.sleep(0.05)
    return time.monotonic() - began


def permits_held(run_id: str) -> int:
    """Permits (max_concurrent) the run's batches hold in Redis."""
    state = RunState(run_id)
    return sum(state.redis.zcard(key) for key in state.redis.scan_iter(match=state.keys.permits("*")))


# -- the cluster ---------------------------------------------------------------------------------------------------
def test_a_cancel_during_a_rate_limit_wait_makes_no_call_after_it_and_frees_the_bucket(
    celery_cluster: Cluster, service: tuple[Service, str]
) -> None:
    """6 calls a minute, 8 items waiting on the bucket in each running chunk: after the cancel no call goes, the
    run reads cancelled within 5 s, and a new run on the same key calls at the bucket's next slot (not after the
    cancelled run's waits: before, its waiting items took the next slots, 8 calls over 84 s)."""
    svc, url = service
    key = f"cancel-{uuid.uuid4().hex[:8]}"
    wf = http_batch(f"{url}/ok/a/", rate_key=key, parallel=True, max_concurrent=8, error_handling="continue")
    run_id = api.submit(wf, {"items": list(range(24))})
    svc.wait_for(lambda: svc.count("/ok/a/") >= 2, 60)
    assert permits_held(run_id) > 0  # the items waiting on the bucket hold max_concurrent's permits
    cancelled_at = time.monotonic()
    api.cancel(run_id)
    status_within(run_id, "cancelled", CANCELLED_WITHIN)
    assert permits_held(run_id) == 0  # the chunks gave them back as they ended

    submitted = time.monotonic()
    after = api.submit(http_batch(f"{url}/ok/b/", rate_key=key), {"items": [0]})
    result = api.wait(after, timeout=60)
    assert result.shared["call"]["success_count"] == 1
    first_b = svc.times("/ok/b/")[0]
    last_a = svc.times("/ok/a/")[-1]
    assert [at for at in svc.times("/ok/a/") if at > cancelled_at] == []  # not one call after the cancel
    assert first_b - last_a <= INTERVAL + 2.0  # the bucket's next slot, give or take a worker's wake-up
    assert first_b - submitted <= INTERVAL + 2.0


def test_items_a_cancel_interrupted_have_no_outcome_and_run_once_on_resume(
    celery_cluster: Cluster, service: tuple[Service, str]
) -> None:
    """Items given up mid-wait are neither successes nor failures: the resume runs exactly the items that never
    called, each once, and the batch ends with every item a success. (Sequential chunks: a parallel chunk is cut
    before its first interrupted item, and items after it that had ended run again.)"""
    svc, url = service
    wf = http_batch(f"{url}/ok/r/", rate_key=f"resume-{uuid.uuid4().hex[:8]}", chunk_size=8)
    wf["nodes"][0]["rate_limit"] = {"key": wf["nodes"][0]["rate_limit"]["key"], "requests_per_second": 2}
    run_id = api.submit(wf, {"items": list(range(16))})
    svc.wait_for(lambda: svc.count("/ok/r/") >= 4, 60)
    api.cancel(run_id)
    status_within(run_id, "cancelled", CANCELLED_WITHIN)
    api.resume_cluster(run_id)
    result = api.wait(run_id, timeout=120)
    assert result.shared["call"]["success_count"] == 16
    assert sorted(int(path.rsplit("/", 1)[1]) for _, path in svc.calls) == list(range(16))  # each item called once


def test_a_cancel_interrupts_an_item_waiting_for_a_long_response(
    celery_cluster: Cluster, service: tuple[Service, str]
) -> None:
    """Each worker's chunk has an item 60 s into nothing (the server holds its answer): both are given up, their
    connections closed, and the run reads cancelled within 5 s; the chunks' second items never call."""
    svc, url = service
    wf = http_batch(f"{url}/slow/c/", chunk_size=2, error_handling="continue")
    run_id = api.submit(wf, {"items": [0, 1, 2, 3]})
    svc.wait_for(lambda: svc.count("/slow/c/") == 2, 60)
    cancelled_at = time.monotonic()
    api.cancel(run_id)
    status_within(run_id, "cancelled", CANCELLED_WITHIN)
    svc.wait_for(lambda: len(svc.closed) == 2, CANCELLED_WITHIN)
    assert max(svc.closed) - cancelled_at < 2.0
    assert sorted(path for _, path in svc.calls) == ["/slow/c/0", "/slow/c/2"]


def test_a_fail_fast_abort_on_one_worker_ends_the_other_workers_waiting_item(celery_cluster: Cluster) -> None:
    """Chunk A's item is held by the server; chunk B's first item fails once A's call is in: the batch's abort
    reaches A's item within a second, its connection closed, and the run reads failed within 5 s."""
    svc = Service(fail_after=1)
    with serving(svc.handler()) as url:
        try:
            wf = http_batch(url, items="${paths}", chunk_size=2)
            wf["inputs"] = {"paths": {"type": "array"}}
            run_id = api.submit(wf, {"paths": ["/slow/0", "/slow/1", "/fail/2", "/slow/3"]})
            svc.wait_for(lambda: svc.count("/fail/") == 1, 60)
            failed_at = time.monotonic()
            status_within(run_id, "failed", CANCELLED_WITHIN)
            svc.wait_for(lambda: len(svc.closed) == 1, CANCELLED_WITHIN)
            assert svc.closed[0] - failed_at < 2.0
            assert sorted(path for _, path in svc.calls) == ["/fail/2", "/slow/0"]
            assert "item 2 failed: HTTP 500" in (api.status(run_id).get("error") or "")
        finally:
            svc.released.set()


# -- this process ------------------------------------------------------------------------------------------------
def test_a_fail_fast_abort_ends_the_items_waiting_for_their_responses(service: tuple[Service, str]) -> None:
    """Items 1-3 are held by the server; item 0 fails once they are all waiting. The batch ends with item 0's
    failure within a couple of seconds (not after the 60 s answers), every held connection closed."""
    svc, url = service
    wf = http_batch(url, items="${paths}", parallel=True, max_concurrent=4)
    wf["inputs"] = {"paths": {"type": "array"}}
    began = time.monotonic()
    with pytest.raises(BatchItemFailed, match="item 0 failed: HTTP 500"):
        scheduler.run(wf, {"paths": ["/fail/0", "/slow/1", "/slow/2", "/slow/3"]})
    assert time.monotonic() - began < 5.0
    svc.wait_for(lambda: len(svc.closed) == 3, 2.0)


@pytest.mark.parametrize(
    ("path", "batch"),
    [
        ("/busy/", {}),  # 429 with Retry-After: 60: the backoff wait
        ("/drop/", {"max_retries": 2, "retry_wait": HELD}),  # no response (raises): the batch's retry pause
    ],
)
def test_a_local_cancel_ends_a_backoff_or_a_retry_wait(
    service: tuple[Service, str], path: str, batch: dict[str, Any]
) -> None:
    """An item told to wait 60 s (a 429's Retry-After, or `retry_wait` after a call that got no response): a cancel
    ends the wait at once, and no call goes after it."""
    svc, url = service
    cancelled = threading.Event()
    at: list[float] = []

    def cancel_once_called() -> None:
        svc.wait_for(lambda: svc.count(path) >= 1, 30)
        at.append(time.monotonic())
        cancelled.set()

    canceller = threading.Thread(target=cancel_once_called)
    canceller.start()
    result = scheduler.run(http_batch(url + path, **batch), {"items": [0, 1]}, cancelled=cancelled)
    ended = time.monotonic()
    canceller.join()
    assert result.status == "cancelled"
    assert ended - at[0] < 2.0
    assert [t for t in svc.times(path) if t > at[0] + 0.5] == []  # a GET that got no response is sent once more


def test_a_local_cancel_kills_a_long_shell_command(tmp_path: Path) -> None:
    """A batch item running `sleep 60` (after writing its pid): a cancel kills the command at once."""
    cancelled = threading.Event()
    pid_file = tmp_path / "pid"
    node = {
        "id": "cmd",
        "type": "shell",
        "params": {"command": 'echo $$ > "$PID"; exec sleep 60', "vars": {"PID": str(pid_file)}},
        "batch": {"items": "${items}"},
    }

    def cancel_once_running() -> None:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        cancelled.set()

    canceller = threading.Thread(target=cancel_once_running)
    canceller.start()
    began = time.monotonic()
    result = scheduler.run({"inputs": {"items": {"type": "array"}}, "nodes": [node]}, {"items": [0, 1]},
                           cancelled=cancelled)  # fmt: skip
    canceller.join()
    assert result.status == "cancelled"
    assert time.monotonic() - began < 5.0
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # the command is gone, not left sleeping


@pytest.mark.processes
def test_sigint_of_chordflow_run_ends_a_rate_limit_wait(service: tuple[Service, str], tmp_path: Path) -> None:
    """`chordflow run` of a 6/minute batch, Ctrl-C after two calls: the process ends cancelled within a couple of
    seconds and makes no call after the signal (before, it waited out its items' admissions: 41.8 s)."""
    svc, url = service
    wf = tmp_path / "limited.json"
    wf.write_text(
        json.dumps(
            http_batch(f"{url}/ok/l/", rate_key=f"sigint-{uuid.uuid4().hex[:8]}", parallel=True, max_concurrent=8)
        )
    )
    items = "[" + ",".join(str(i) for i in range(16)) + "]"
    argv = [sys.executable, "-m", "scheduler.cli", "run", str(wf), "--input", f"items={items}"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        svc.wait_for(lambda: svc.count("/ok/l/") >= 2, 60)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        ended = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "cancelled" in err
    assert "Traceback" not in err
    assert ended < 3.0
    assert [at for at in svc.times("/ok/l/") if at > signalled] == []
