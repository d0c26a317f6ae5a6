"""The dashboard's web app: a small Starlette app (served by uvicorn) with the page, its JSON routes and
their server-sent event streams, each sending the whole JSON every `refresh` seconds.

A route taking a run id checks it (worker/runs/record.py valid_run_id) before any lookup: a bad one is a 400
that does not echo it. Errors are answered without the server's file paths (the CLI's messages name them,
for the local user): an unknown run is `run <id>: unknown run`, any other path is cut to its file name.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from ir.errors import BackendError, UnknownRun, ValidationError
from scheduler.ops.dashboard.actions import ACTIONS
from scheduler.ops.dashboard.auth import ACTION_HEADER, BasicAuth, FrameGuard
from scheduler.ops.dashboard.page import HTML
from scheduler.ops.dashboard.views import FAILED_PAGE, MAX_FAILED_PAGE, REFRESH_SECONDS, Views
from worker.runs.record import valid_run_id

#: An absolute file path in an error message (`/srv/home/runs.db`, `~/.chordflow/x`, `'/a b/c'` quoted), not
#: a URL's path.
_PATH = re.compile(r"'~?/[^'\n]*'|(?<![\w.:/~-])~?(?:/[^\s'\"/(),;:]+)+/?")


def _without_paths(text: str) -> str:
    """Each absolute path in `text` cut to its file name (`runs.db: disk full`)."""

    def name(match: re.Match[str]) -> str:
        path = match[0]
        quote = "'" if path.startswith("'") else ""
        return quote + path.strip("'").rstrip("/").rsplit("/", 1)[-1] + quote

    return _PATH.sub(name, text)


def _json(value: Any, status: int = 200) -> Response:
    return Response(json.dumps(value, default=str), status, media_type="application/json")


def _public(exc: Exception) -> tuple[int, str]:
    """(status, message) of an error, without the server's paths: 404 for an unknown run, 409 for what the
    run's state refuses (a ValidationError's message), 503 when a store is unreachable (or its disk full)."""
    if isinstance(exc, UnknownRun):
        return 404, f"run {exc.run_id}: unknown run"  # the id was checked (valid_run_id) before the lookup
    if isinstance(exc, ValidationError | BackendError):
        status, text = 409 if isinstance(exc, ValidationError) else 503, str(exc)
    else:
        status, text = 503, f"{type(exc).__name__}: {exc}"
    return status, _without_paths(text)


def _failure(exc: Exception) -> Response:
    status, message = _public(exc)
    return _json({"error": message}, status)


def _takes_run_id(endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """A route with a `{run_id}`: an id that cannot name a run is a 400 before any lookup, not echoed."""

    @functools.wraps(endpoint)
    async def checked(request: Request) -> Response:
        if not valid_run_id(request.path_params["run_id"]):
            return _json({"error": "invalid run id"}, 400)
        return await endpoint(request)

    return checked


async def _blocking(work: Callable[[], Any]) -> Response:
    try:
        return _json(await run_in_threadpool(work))
    except (ValidationError, UnknownRun, BackendError, ConnectionError, OSError) as exc:
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
        act, run_id = ACTIONS.get(request.path_params["action"]), request.path_params["run_id"]
        if act is None:
            return _json({"error": f"unknown action (one of: {', '.join(ACTIONS)})"}, 404)
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
            Route("/api/runs/{run_id}", _takes_run_id(run)),
            Route("/api/runs/{run_id}/events", _takes_run_id(run_events)),
            Route("/api/runs/{run_id}/failed", _takes_run_id(failed_items)),
            Route("/api/runs/{run_id}/{action:str}", _takes_run_id(action), methods=["POST"]),
        ]
    )
    return FrameGuard(app if users is None else BasicAuth(app, users))


async def _events(build: Callable[[], Any], refresh: float) -> AsyncIterator[str]:
    """`data: <json>` every `refresh` seconds; a failed read is sent as `{"error"}`. Starlette ends the
    generator when the page goes away."""
    yield f"retry: {int(refresh * 2000)}\n\n"
    while True:
        try:
            data = await run_in_threadpool(build)
        except (ValidationError, UnknownRun, BackendError, ConnectionError, OSError) as exc:
            data = {"error": _public(exc)[1], "at": time.time()}
        yield f"data: {json.dumps(data, default=str)}\n\n"
        await asyncio.sleep(refresh)


def serve(users: dict[str, str] | None, address: str, port: int) -> None:
    """Serve the dashboard until interrupted (open event streams are closed within 2 s on shutdown)."""
    import uvicorn

    uvicorn.run(create_app(users), host=address, port=port, log_level="info", timeout_graceful_shutdown=2)
