"""`chordflow dashboard`: a web page of runs — what Flower, which sees tasks one by one, cannot show.

A small Starlette app (served by uvicorn, `chordflow dashboard`, scheduler/cli/dashboard.py) over the
same reads as the CLI: `durable.recent` lists runs from both stores, `durable.find_run` opens one. The
page (HTML, below: plain HTML and JavaScript, no build step) follows two server-sent event streams —
the runs list, or one run with its nodes and batches — each sending the whole JSON every second.

Live batch progress of a cluster run comes from the run's progress stream (the one `wait` follows):
`LiveProgress` keeps, per followed run, its position in the stream and which items it has counted, so
each refresh reads only the entries written since the last one. A run record's `batches` hold a batch's
counts once it ended; a dataset job's `records` counts come from its chunk store.

Every request needs basic auth (USERS_VARIABLE, as `chordflow flower` needs FLOWER_BASIC_AUTH) unless the
server was started `--unauthenticated`; the buttons (cancel, resume, redrive) POST with a header a page of
another site cannot send without CORS, which this app never grants.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import itertools
import json
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ir.errors import BackendError, ValidationError
from worker.runs.record import FINAL, RunRecord

#: Where `chordflow dashboard` reads its users: `user:password[,user2:password2]`.
USERS_VARIABLE = "CHORDFLOW_DASHBOARD_BASIC_AUTH"
#: Seconds between two messages of an event stream.
REFRESH_SECONDS = 1.0
#: The items/s rate is measured over this many seconds of a run's progress.
RATE_WINDOW_SECONDS = 10.0
#: Runs in the list, and failed items per page (at most MAX_PAGE).
RUNS_LIMIT, FAILED_PAGE, MAX_FAILED_PAGE = 50, 50, 500
#: Longest error text sent for one failed item.
ERROR_CHARS = 2000
#: The header every POST must carry (a form or an image of another site cannot set it).
ACTION_HEADER = "x-chordflow-action"


class UsersError(ValueError):
    """USERS_VARIABLE is missing (and --unauthenticated was not given) or is not `user:password[,...]`."""


def users_from(value: str | None, unauthenticated: bool) -> dict[str, str] | None:
    """The users allowed in ({name: password}), or None for a server without auth (`--unauthenticated`)."""
    if not value:
        if unauthenticated:
            return None
        raise UsersError(f"set {USERS_VARIABLE} to user:password (or pass --unauthenticated) to start the dashboard")
    pairs = [pair.split(":", 1) for pair in value.split(",")]
    if not all(len(pair) == 2 and pair[0] and pair[1] for pair in pairs):
        raise UsersError(f"{USERS_VARIABLE} must be user:password[,user2:password2]")
    return dict(pairs)  # type: ignore[arg-type]


class BasicAuth:
    """ASGI middleware: a request without the credentials of a known user gets 401 (event streams too)."""

    def __init__(self, app: ASGIApp, users: dict[str, str]):
        self.app, self.users = app, {u.encode(): p.encode() for u, p in users.items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._allowed(dict(scope["headers"]).get(b"authorization", b"")):
            response = PlainTextResponse(
                "authentication required", 401, headers={"WWW-Authenticate": 'Basic realm="chordflow"'}
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, header: bytes) -> bool:
        scheme, _, encoded = header.partition(b" ")
        if scheme.lower() != b"basic":
            return False
        try:
            user, _, password = base64.b64decode(encoded.strip(), validate=True).partition(b":")
        except (binascii.Error, ValueError):
            return False
        expected = self.users.get(user)
        return expected is not None and hmac.compare_digest(password, expected)


# -- live progress of cluster runs ----------------------------------------------------------------------


@dataclass
class _Batch:
    """One dispatch of a batch node (`node#n`): the items counted so far, once each."""

    total: int
    seen: bytearray = field(default_factory=bytearray)
    done: int = 0
    failed: int = 0

    def count(self, index: int, ok: bool) -> None:
        if index >= len(self.seen):
            self.seen.extend(bytes(index + 1 - len(self.seen)))
        if not self.seen[index]:  # a redelivered chunk reports some items again
            self.seen[index] = 1
            self.done += 1
            self.failed += not ok


@dataclass
class _Followed:
    position: str = "0-0"
    batches: dict[str, _Batch] = field(default_factory=dict)
    samples: deque[tuple[float, int]] = field(default_factory=deque)
    lock: threading.Lock = field(default_factory=threading.Lock)


class LiveProgress:
    """Batch counts of cluster runs as their items finish, read from each run's progress stream.

    Only the entries written since the last read are read; the `keep` most recently followed runs are
    remembered (a run that ended keeps the counts it had, including those of a batch cut short).
    """

    #: Stream entries read per refresh at most (each holds several items' outcomes).
    MAX_ENTRIES = 20_000

    def __init__(self, keep: int = 256):
        self.keep = keep
        self._runs: OrderedDict[str, _Followed] = OrderedDict()
        self._lock = threading.Lock()

    def _followed(self, run_id: str) -> _Followed:
        with self._lock:
            followed = self._runs.pop(run_id, None) or _Followed()
            self._runs[run_id] = followed
            while len(self._runs) > self.keep:
                self._runs.popitem(last=False)
            return followed

    def read(self, run_id: str) -> tuple[dict[str, dict[str, int]], float | None]:
        """({node: {total, done, failed}} of each node's latest dispatch, items/s lately or None)."""
        from worker.cluster.state.runstate import RunState

        state = RunState(run_id)
        followed = self._followed(run_id)
        with followed.lock:
            read = 0
            while read < self.MAX_ENTRIES:
                followed.position, entries = state.read_progress(followed.position, 0)
                for batch, packed in entries:
                    if packed is None:  # the end of a batch, or of the run
                        continue
                    counted = followed.batches.setdefault(batch, _Batch(0))
                    counted.total = counted.total or state.batch_total(batch)
                    for index, ok in RunState.unpack_outcomes(packed):
                        counted.count(index, bool(ok))
                read += len(entries)
                if len(entries) < 1000:  # read_progress's count: fewer means the stream is read to its end
                    break
            latest: dict[str, tuple[int, _Batch]] = {}
            for key, batch in followed.batches.items():  # `node#<step>`: a node run again has a later step
                node, _, step = key.partition("#")
                number = int(match[0]) if (match := re.match(r"\d+", step)) else 0
                if node not in latest or number >= latest[node][0]:
                    latest[node] = (number, batch)
            done = sum(b.done for b in followed.batches.values())
            return {
                node: {"total": max(b.total, b.done), "done": b.done, "failed": b.failed}
                for node, (_, b) in latest.items()
            }, _rate(followed.samples, done)


def _rate(samples: deque[tuple[float, int]], done: int) -> float | None:
    """Items per second over the last RATE_WINDOW_SECONDS of samples (None until two are a moment apart)."""
    now = time.monotonic()
    samples.append((now, done))
    while len(samples) > 2 and now - samples[1][0] >= RATE_WINDOW_SECONDS:
        samples.popleft()
    first_time, first_done = samples[0]
    return (done - first_done) / (now - first_time) if now - first_time >= 0.5 else None


# -- what the page shows -------------------------------------------------------------------------------


class Views:
    """The JSON the page shows, built from the run stores (blocking reads: called in a worker thread)."""

    def __init__(self, live: LiveProgress | None = None, cache_seconds: float = REFRESH_SECONDS / 2):
        self.live = live or LiveProgress()
        self.cache_seconds = cache_seconds
        self._cache: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def _cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """One build per moment, however many pages follow the same stream."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.cache_seconds:
            return hit[1]
        value = build()
        with self._lock:
            self._cache[key] = (now, value)
            for stale in [k for k, (t, _) in self._cache.items() if now - t > 60]:
                del self._cache[stale]
        return value

    def runs(self, status: str | None = None, limit: int = RUNS_LIMIT) -> dict[str, Any]:
        return self._cached(("runs", status, limit), lambda: self._runs(status, limit))

    def _runs(self, status: str | None, limit: int) -> dict[str, Any]:
        from scheduler import durable

        return {"runs": [self._summary(record)[0] for record in durable.recent(status, limit)], "at": time.time()}

    def run(self, run_id: str) -> dict[str, Any]:
        return self._cached(("run", run_id), lambda: self._run(run_id))

    def _run(self, run_id: str) -> dict[str, Any]:
        from scheduler import durable

        record, runs = durable.find_run(run_id)
        summary, batches = self._summary(record, follow=True)
        trail = set(runs.trail(run_id))
        nodes = []
        for spec in record.workflow.get("nodes", []):
            node = spec["id"]
            if node == record.node and record.status not in ("queued", "succeeded"):
                state = record.status
            else:
                state = "done" if node in trail else "pending"
            nodes.append(
                {"id": node, "type": spec.get("type"), "batch": bool(spec.get("batch")), "state": state,
                 "progress": batches.get(node)}
            )  # fmt: skip
        return {"run": summary, "nodes": nodes, "at": time.time()}

    def _summary(self, record: RunRecord, follow: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the run's row: status, progress, rate, ETA, ...; its batches by node)."""
        from scheduler import datasets

        running = record.status not in FINAL
        ended = record.updated if not running else time.time()
        row: dict[str, Any] = {
            "run_id": record.run_id, "workflow": record.name, "backend": record.backend, "status": record.status,
            "node": record.node, "steps": record.step, "error": record.error, "created": record.created,
            "duration": max(0.0, ended - record.created), "dataset": record.dataset is not None,
            "rate": None, "eta_s": None,
        }  # fmt: skip
        batches: dict[str, Any] = dict(record.batches)
        if record.dataset is not None:
            records = datasets.progress(record)
            row.update(done=records["done"], total=records["total"], read=records["read"], failed=records["failed"])
            row.update(rate=records["rate"], eta_s=records["eta_s"] if running else None)
            batches = {"records": {k: records[k] for k in ("total", "done", "failed")}}
            return row, batches
        rate = None
        if record.backend == "celery" and (running or follow):
            live, rate = self.live.read(record.run_id)
            for node, counts in live.items():
                if node not in batches or (running and node == record.node):
                    batches[node] = counts
        done = sum(c["done"] for c in batches.values())
        total = sum(c["total"] for c in batches.values())
        failed = sum(c["failed"] for c in batches.values())
        if not running:
            rate = done / row["duration"] if done and row["duration"] > 0 else None
        row.update(done=done, total=total, read=total, failed=failed, rate=rate)
        if running and rate:
            row["eta_s"] = max(0, total - done) / rate
        return row, batches

    def failed_items(self, run_id: str, node: str | None, skip: int, limit: int) -> dict[str, Any]:
        """A page of failed items in index order: skip `skip` failures, then up to `limit`; `more` says
        whether another follows. Rows are streamed (a chunk at a time) and the stream is left after the page."""
        from scheduler import datasets, durable

        record, runs = durable.find_run(run_id)
        page: dict[str, Any] = {"node": node, "skip": skip, "limit": limit, "items": [], "more": False, "note": None}
        if record.dataset is not None:
            page["node"] = "records"
            rows = datasets.rows(record, done_only=True, is_final=lambda: True)
        else:
            if not node:
                page["note"] = "choose a batch node"
                return page
            try:
                rows = runs.batch_rows(run_id, node)
            except LookupError:
                still = record.status not in FINAL and node == record.node
                page["note"] = "its failed items are listed once the batch ends" if still else "no batch results"
                return page
        failures = (row for row in rows if row["error"])
        found = list(itertools.islice(failures, skip, skip + limit + 1))
        failures.close()
        with contextlib.suppress(AttributeError):
            rows.close()  # type: ignore[union-attr]  # let go of the store at once, not at garbage collection
        page["more"] = len(found) > limit
        page["items"] = [{"index": r["index"], "error": str(r["error"])[:ERROR_CHARS]} for r in found[:limit]]
        return page


# -- actions --------------------------------------------------------------------------------------------


def cancel(run_id: str) -> str:
    from scheduler import durable

    revoked = durable.cancel_run(run_id)
    return f"cancel requested for run {run_id}" + (f": {revoked} chunks revoked" if revoked else "")


def resume(run_id: str) -> str:
    """A cluster run goes back to the workers; a local run goes on in this process (a thread of its own)."""
    import scheduler
    from scheduler import durable

    record, _ = durable.find_run(run_id)
    if record.status not in ("failed", "cancelled"):
        raise ValidationError(f"run {run_id} is {record.status}; only a failed or cancelled run can be resumed")
    if record.dataset is not None:
        raise ValidationError(f"run {run_id} is a dataset job: redrive it")
    if record.backend == "celery":
        durable.resume_cluster(run_id)
        return f"run {run_id} resumed on the cluster"
    _in_background(lambda: scheduler.resume(run_id))
    return f"run {run_id} resumed in the dashboard's process"


def redrive(run_id: str) -> str:
    from scheduler import datasets, durable

    record, _ = durable.find_run(run_id)
    if record.backend == "celery":
        return f"run {run_id}: {datasets.redrive(run_id)} records to run again"
    if record.dataset is None or record.status not in FINAL:
        datasets.redrive(run_id)  # not redrivable: raises the ValidationError saying why, here, at once
    _in_background(lambda: datasets.redrive(run_id))
    return f"run {run_id}: redriven in the dashboard's process"


def _in_background(work: Callable[[], Any]) -> None:
    def run() -> None:
        with contextlib.suppress(Exception):  # the outcome is in the run's record, which the page shows
            work()

    threading.Thread(target=run, daemon=True, name="chordflow-dashboard-action").start()


ACTIONS: dict[str, Callable[[str], str]] = {"cancel": cancel, "resume": resume, "redrive": redrive}


# -- the app --------------------------------------------------------------------------------------------


def _json(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(value, default=str), status, media_type="application/json")


def _failure(exc: Exception) -> Response:
    """409 for what the run's state refuses (a ValidationError's message), 503 when a store is unreachable."""
    if isinstance(exc, ValidationError | BackendError):
        return _json({"error": str(exc)}, 409 if isinstance(exc, ValidationError) else 503)
    return _json({"error": f"{type(exc).__name__}: {exc}"}, 503)


async def _blocking(work: Callable[[], Any]) -> Response:
    try:
        return _json(await run_in_threadpool(work))
    except (ValidationError, BackendError, ConnectionError, OSError) as exc:
        return _failure(exc)


def _int_param(request: Request, name: str, default: int, most: int) -> int:
    try:
        return max(0, min(most, int(request.query_params.get(name, default))))
    except ValueError:
        return default


def create_app(users: dict[str, str] | None, views: Views | None = None, refresh: float = REFRESH_SECONDS) -> ASGIApp:
    """The dashboard; `users` None serves it without auth (`--unauthenticated`)."""
    views = views or Views()

    async def page(request: Request) -> Response:
        return HTMLResponse(HTML)

    async def runs(request: Request) -> Response:
        return await _blocking(lambda: views.runs(request.query_params.get("status") or None))

    async def run(request: Request) -> Response:
        return await _blocking(lambda: views.run(request.path_params["run_id"]))

    async def failed_items(request: Request) -> Response:
        run_id, node = request.path_params["run_id"], request.query_params.get("node") or None
        skip, limit = _int_param(request, "skip", 0, 10**12), _int_param(request, "limit", FAILED_PAGE, MAX_FAILED_PAGE)
        return await _blocking(lambda: views.failed_items(run_id, node, skip, max(1, limit)))

    async def action(request: Request) -> Response:
        if request.headers.get(ACTION_HEADER) != "1":
            return _json({"error": f"a POST needs the header {ACTION_HEADER}: 1"}, 403)
        act, run_id = ACTIONS[request.path_params["action"]], request.path_params["run_id"]
        return await _blocking(lambda: {"message": act(run_id)})

    def events(build: Callable[[], Any]) -> Response:
        return StreamingResponse(
            _events(build, refresh),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def runs_events(request: Request) -> Response:
        status = request.query_params.get("status") or None
        return events(lambda: views.runs(status))

    async def run_events(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        return events(lambda: views.run(run_id))

    app: ASGIApp = Starlette(
        routes=[
            Route("/", page),
            Route("/api/runs", runs),
            Route("/api/runs/events", runs_events),
            Route("/api/runs/{run_id}", run),
            Route("/api/runs/{run_id}/events", run_events),
            Route("/api/runs/{run_id}/failed", failed_items),
            Route("/api/runs/{run_id}/{action:str}", action, methods=["POST"]),
        ]
    )
    return app if users is None else BasicAuth(app, users)


async def _events(build: Callable[[], Any], refresh: float) -> AsyncIterator[str]:
    """`data: <json>` every `refresh` seconds; a failed read is sent as `{"error"}`. Starlette ends the
    generator when the page goes away."""
    yield f"retry: {int(refresh * 2000)}\n\n"
    while True:
        try:
            data = await run_in_threadpool(build)
        except (ValidationError, BackendError, ConnectionError, OSError) as exc:
            data = {"error": str(exc), "at": time.time()}
        yield f"data: {json.dumps(data, default=str)}\n\n"
        await asyncio.sleep(refresh)


def serve(users: dict[str, str] | None, address: str, port: int) -> None:
    """Serve the dashboard until interrupted (open event streams are closed within 2 s on shutdown)."""
    import uvicorn

    uvicorn.run(create_app(users), host=address, port=port, log_level="info", timeout_graceful_shutdown=2)


HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>chordflow runs</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { display: flex; gap: 1em; align-items: baseline; padding: .6em 1.2em; background: #1d2330; color: #fff; }
  header a { color: #fff; text-decoration: none; font-weight: 600; }
  #live { font-size: 12px; color: #9aa4b8; }
  main { padding: 1em 1.2em; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid #e3e6eb; vertical-align: top; }
  th { font-weight: 600; font-size: 12px; color: #5b6577; }
  tr.link { cursor: pointer; } tr.link:hover { background: #eef3fb; }
  .status { font-weight: 600; } .succeeded { color: #1a7f37; } .failed { color: #c62828; }
  .cancelled { color: #8a6d00; } .running, .queued { color: #1f5fbf; }
  .bar { display: inline-block; width: 140px; height: 8px; background: #e3e6eb; border-radius: 4px;
         vertical-align: middle; margin-right: .5em; overflow: hidden; }
  .bar > div { height: 100%; float: left; } .bar > .ok { background: #1f5fbf; } .bar > .bad { background: #c62828; }
  #failed td:first-child { width: 6em; }
  .error { color: #c62828; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 12px; }
  .actions { margin: .8em 0; display: flex; gap: .5em; align-items: center; }
  button { padding: .3em .9em; } #message { color: #5b6577; }
  h2 { margin: .2em 0; font-size: 18px; } h3 { margin: 1.2em 0 .4em; font-size: 15px; }
  .meta { color: #5b6577; }
</style>
</head>
<body>
<header><a href="#/">chordflow runs</a><span id="live">connecting…</span></header>
<main id="runs-view">
  <table id="runs">
    <thead><tr><th>run</th><th>workflow</th><th>status</th><th>progress</th><th>rate</th><th>ETA</th>
      <th>started</th><th>duration</th></tr></thead>
    <tbody></tbody>
  </table>
</main>
<main id="run-view" hidden>
  <h2>run <span id="run-id"></span> <span id="run-status" class="status"></span></h2>
  <div class="meta" id="run-meta"></div>
  <div class="error" id="run-error"></div>
  <div class="actions">
    <button id="cancel">Cancel</button><button id="resume">Resume</button><button id="redrive">Redrive</button>
    <span id="message"></span>
  </div>
  <h3>nodes</h3>
  <table id="nodes"><thead><tr><th>node</th><th>type</th><th>state</th><th>items</th><th>failed</th></tr></thead>
    <tbody></tbody></table>
  <h3>failed items</h3>
  <div class="actions">
    <label>node <select id="failed-node"></select></label>
    <button id="failed-prev">&lsaquo; previous</button><span id="failed-range"></span>
    <button id="failed-next">next &rsaquo;</button>
  </div>
  <div class="meta" id="failed-note"></div>
  <table id="failed"><thead><tr><th>index</th><th>error</th></tr></thead><tbody></tbody></table>
</main>
<script>
"use strict";
// Same-origin URLs built from location.origin: a page opened as http://user:pw@host/ must not put the
// credentials in its requests (fetch refuses such URLs); the browser sends them from its auth cache.
const url = (path) => new URL(path, location.origin).href;
const $ = (id) => document.getElementById(id);
const PAGE = 50;
let source = null, current = null, failed = {node: null, skip: 0, key: null};

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("data-")) node.setAttribute(k, v); else node[k] = v;
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}
function seconds(s) {
  if (s === null || s === undefined) return "-";
  s = Math.round(s);
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
  return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
}
function bar(done, total, failedCount) {  // succeeded items blue, failed ones red
  const pct = (n) => (total ? Math.min(100, (100 * n) / total) : 0);
  return el("span", {class: "bar"}, el("div", {class: "ok", style: `width:${pct(done - failedCount)}%`}),
            el("div", {class: "bad", style: `width:${pct(failedCount)}%`}));
}
function progressCell(r) {
  if (!r.total && !r.done) return el("td", {class: "progress"}, r.steps + " steps");
  const total = r.total === null ? r.read + "+" : r.total;
  const cell = el("td", {class: "progress", "data-done": r.done, "data-total": r.total ?? ""});
  cell.append(bar(r.done, r.total || r.read, r.failed), `${r.done}/${total}`);
  if (r.failed) cell.append(el("span", {class: "failed"}, ` (${r.failed} failed)`));
  return cell;
}
function listen(path, onData) {
  if (source) source.close();
  source = new EventSource(url(path));
  source.onopen = () => { $("live").textContent = "live"; };
  source.onerror = () => { $("live").textContent = "reconnecting…"; };
  source.onmessage = (event) => {
    const data = JSON.parse(event.data);
    const at = new Date(data.at * 1000).toLocaleTimeString();
    $("live").textContent = data.error ? "error: " + data.error : "live · " + at;
    if (!data.error) onData(data);
  };
}

function showRuns() {
  current = null;
  $("runs-view").hidden = false; $("run-view").hidden = true;
  listen("api/runs/events", (data) => {
    const body = $("runs").tBodies[0];
    body.replaceChildren(...data.runs.map((r) => {
      const row = el("tr", {class: "link", "data-run": r.run_id},
        el("td", {}, el("a", {href: "#/run/" + encodeURIComponent(r.run_id)}, r.run_id)),
        el("td", {}, r.workflow), el("td", {class: "status " + r.status}, r.status), progressCell(r),
        el("td", {}, r.rate ? r.rate.toFixed(1) + "/s" : "-"), el("td", {}, seconds(r.eta_s)),
        el("td", {}, new Date(r.created * 1000).toLocaleString()), el("td", {}, seconds(r.duration)));
      row.onclick = () => { location.hash = "#/run/" + encodeURIComponent(r.run_id); };
      return row;
    }));
  });
}

function showRun(runId) {
  current = runId; failed = {node: null, skip: 0, key: null};
  $("runs-view").hidden = true; $("run-view").hidden = false;
  $("run-id").textContent = runId; $("message").textContent = "";
  $("nodes").tBodies[0].replaceChildren(); $("failed").tBodies[0].replaceChildren(); $("failed-node").replaceChildren();
  listen("api/runs/" + encodeURIComponent(runId) + "/events", (data) => renderRun(data));
}

function renderRun(data) {
  const r = data.run;
  if (r.run_id !== current) return;
  $("run-status").textContent = r.status; $("run-status").className = "status " + r.status;
  const total = r.total === null ? r.read + "+" : r.total;
  $("run-meta").textContent = `${r.workflow} · ${r.backend} · ${r.done}/${total} items · ${r.failed} failed · `
    + `${r.rate ? r.rate.toFixed(1) + "/s" : "-"} · ETA ${seconds(r.eta_s)} · started `
    + `${new Date(r.created * 1000).toLocaleString()} · ${seconds(r.duration)}`;
  $("run-error").textContent = r.error || "";
  const final = ["succeeded", "failed", "cancelled"].includes(r.status);
  $("cancel").disabled = final || r.backend !== "celery";
  $("resume").disabled = !(r.status === "failed" || r.status === "cancelled") || r.dataset;
  $("redrive").disabled = !(final && r.dataset && (r.failed > 0 || r.done < r.total));
  const nodes = r.dataset ? [{id: "records", type: "dataset job", batch: true, state: r.status,
                              progress: {total: r.total, done: r.done, failed: r.failed}}] : data.nodes;
  $("nodes").tBodies[0].replaceChildren(...nodes.map((n) => {
    const p = n.progress;
    const items = p ? el("td", {class: "progress", "data-done": p.done, "data-total": p.total ?? ""},
                         bar(p.done, p.total, p.failed), `${p.done}/${p.total ?? "?"}`)
                    : el("td", {class: "progress"}, n.batch ? "-" : "");
    return el("tr", {"data-node": n.id}, el("td", {}, n.id), el("td", {}, n.type),
              el("td", {class: "status " + n.state}, n.state), items,
              el("td", {class: p && p.failed ? "failed" : ""}, p ? p.failed : ""));
  }));
  const choices = nodes.filter((n) => n.batch).map((n) => n.id);
  const select = $("failed-node");
  if ([...select.options].map((o) => o.value).join() !== choices.join()) {
    select.replaceChildren(...choices.map((id) => el("option", {value: id}, id)));
    const withFailures = nodes.find((n) => n.progress && n.progress.failed);
    if (withFailures) select.value = withFailures.id;
  }
  const chosen = nodes.find((n) => n.id === select.value);
  const counts = chosen && chosen.progress ? chosen.progress.failed + "/" + chosen.progress.done : "";
  const key = select.value + ":" + counts + ":" + r.status;
  if (key !== failed.key) { failed.key = key; loadFailed(); }  // refresh when the node's counts change
}

async function loadFailed() {
  const node = $("failed-node").value, runId = current;
  if (!runId) return;
  if (node !== failed.node) { failed.node = node; failed.skip = 0; }
  const query = `?node=${encodeURIComponent(node)}&skip=${failed.skip}&limit=${PAGE}`;
  const response = await fetch(url("api/runs/" + encodeURIComponent(runId) + "/failed" + query));
  const page = await response.json();
  if (runId !== current) return;
  $("failed-note").textContent = page.error || page.note || (page.items.length ? "" : "no failed items");
  $("failed").tBodies[0].replaceChildren(...(page.items || []).map((item) =>
    el("tr", {"data-index": item.index}, el("td", {}, item.index), el("td", {class: "error"}, item.error))));
  $("failed-range").textContent = page.items && page.items.length
    ? ` ${failed.skip + 1} to ${failed.skip + page.items.length} ` : " ";
  $("failed-prev").disabled = failed.skip === 0;
  $("failed-next").disabled = !page.more;
}

async function act(action) {
  if (action === "cancel" && !confirm(`Cancel run ${current}?`)) return;
  $("message").textContent = action + "…";
  const response = await fetch(url(`api/runs/${encodeURIComponent(current)}/${action}`),
                               {method: "POST", headers: {"X-Chordflow-Action": "1"}});
  const body = await response.json();
  $("message").textContent = body.message || ("error: " + body.error);
}

$("cancel").onclick = () => act("cancel");
$("resume").onclick = () => act("resume");
$("redrive").onclick = () => act("redrive");
$("failed-node").onchange = () => loadFailed();
$("failed-prev").onclick = () => { failed.skip = Math.max(0, failed.skip - PAGE); loadFailed(); };
$("failed-next").onclick = () => { failed.skip += PAGE; loadFailed(); };
function route() {
  const match = location.hash.match(/^#\\/run\\/(.+)$/);
  if (match) showRun(decodeURIComponent(match[1])); else showRuns();
}
window.addEventListener("hashchange", route);
route();
</script>
</body>
</html>
"""
