"""The dashboard's web app: a small Starlette app (served by uvicorn) with the page, its JSON routes and
their server-sent event streams, each sending the whole JSON every `refresh` seconds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp

from ir.errors import BackendError, ValidationError
from scheduler.ops.dashboard.actions import ACTIONS
from scheduler.ops.dashboard.auth import ACTION_HEADER, BasicAuth
from scheduler.ops.dashboard.page import HTML
from scheduler.ops.dashboard.views import FAILED_PAGE, MAX_FAILED_PAGE, REFRESH_SECONDS, Views


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
