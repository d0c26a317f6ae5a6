"""Who may use the dashboard: basic auth on every request, and the header every POST must carry.

Basic auth (USERS_VARIABLE, as `chordflow flower` needs FLOWER_BASIC_AUTH) is required unless the server
was started `--unauthenticated`; the action header keeps a page of another site from pressing the buttons
(cancel, resume, redrive), since it cannot set the header without CORS, which the app never grants; and
FrameGuard keeps another site from framing the page to have a user click them (clickjacking).
"""

from __future__ import annotations

import base64
import binascii
import hmac

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ir.errors import UsersError

#: Where `chordflow dashboard` reads its users: `user:password[,user2:password2]`.
USERS_VARIABLE = "CHORDFLOW_DASHBOARD_BASIC_AUTH"
#: The header every POST must carry (a form or an image of another site cannot set it).
ACTION_HEADER = "x-chordflow-action"
#: On every answer: no page may frame the dashboard. The CSP says only that, so the page's inline script and
#: style still run (scheduler/ops/dashboard/page.py).
FRAME_HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))


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


class FrameGuard:
    """ASGI middleware, outermost: FRAME_HEADERS on every response (pages, JSON, event streams, errors, 401s)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in FRAME_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": [*kept, *FRAME_HEADERS]}
            await send(message)

        await self.app(scope, receive, guarded)


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
