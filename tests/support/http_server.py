"""A real HTTP server on a loopback port, and a port nobody listens on, for the http node's tests."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LoopbackServer(ThreadingHTTPServer):
    """Counts the connections it accepted (keep-alive reuse shows as fewer connections than requests) and,
    at shutdown, closes those still open, so a keep-alive handler thread does not outlive its test."""

    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        super().__init__(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.accepted = 0
        self.open: set[socket.socket] = set()
        self.lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.lock:
            self.accepted += 1
            self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.lock:
            self.open.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self.lock:
            still_open = list(self.open)
        for sock in still_open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the handler's next read ends: its thread returns


@contextlib.contextmanager
def running(handler: type[BaseHTTPRequestHandler]) -> Iterator[LoopbackServer]:
    """Serve `handler` on a free port until the block ends; yields the server (`.url`, `.accepted`)."""
    server = LoopbackServer(handler)
    # A short poll: shutdown() waits for the loop to look, and every test starting a server pays it.
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.close_connections()
        server.server_close()
        thread.join()


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free port until the block ends; yields the base URL (`http://127.0.0.1:PORT`)."""
    with running(handler) as server:
        yield server.url


@contextlib.contextmanager
def refused_url() -> Iterator[str]:
    """A URL on a bound port with no listener: connecting is refused, and no one else can take the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/x"
    finally:
        sock.close()
