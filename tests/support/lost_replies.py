"""A relay in front of redis-server that can lose one reply: the command reaches Redis and is applied, and the
connection closes before its reply gets back, as when Redis is stopped between running a command and writing its
reply (SIGTERM does exactly that: it flushes its AOF, not its clients' replies).

Why a relay and not a restart: the moment is exact. Every chordflow client retries a lost connection within the
outage budget (worker/cluster/outage.py), so a command whose reply was lost runs twice; a relay that drops the reply
of the first command carrying `pattern` (a Lua script's SHA, an argument) makes that happen on purpose, once, and
sets `dropped` when it has.

`Relay(port)` listens on a free loopback port (`url`) and forwards to the redis-server at `port`; `arm(pattern)`
picks the command whose reply to lose.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from scheduler.localcluster import free_port


class Relay:
    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.pattern: tuple[bytes, ...] = ()
        self.dropped = threading.Event()
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="relay-accept").start()

    def arm(self, *pattern: bytes) -> None:
        """Lose the reply to the next command whose bytes contain every part of `pattern` (once)."""
        with self.lock:
            self.pattern, self.dropped = pattern, threading.Event()

    def _take(self, data: bytes) -> bool:
        """Whether this chunk of a client's commands is the one whose reply is lost (and disarm)."""
        with self.lock:
            if self.pattern and all(part in data for part in self.pattern):
                self.pattern = ()
                return True
            return False

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server, losing = socket.create_connection(self.target), threading.Event()
            threading.Thread(target=self._upstream, args=(client, server, losing), daemon=True).start()
            threading.Thread(target=self._downstream, args=(server, client, losing), daemon=True).start()

    def _upstream(self, client: socket.socket, server: socket.socket, losing: threading.Event) -> None:
        """Client to Redis; the chosen command goes through (Redis runs it) and `losing` marks its reply."""
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if self._take(data):
                    losing.set()
                server.sendall(data)
        _close(client, server)

    def _downstream(self, server: socket.socket, client: socket.socket, losing: threading.Event) -> None:
        """Redis to client, until the reply to lose comes: then both ends close with it unsent."""
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if losing.is_set():
                    self.dropped.set()
                    break
                client.sendall(data)
        _close(client, server)

    def close(self) -> None:
        self.closed = True
        _close(self.listener)


def _close(*sockets: socket.socket) -> None:
    """Shut down, then close: a shutdown wakes the other thread's `recv` on the socket and sends the FIN now."""
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()


@contextlib.contextmanager
def relay(target_port: int) -> Iterator[Relay]:
    made = Relay(target_port)
    try:
        yield made
    finally:
        made.close()
