"""`python -m bench.io_server --port P --rate 200 --latency 0.05`: a loopback API with a rate limit, for bench/io.py.

One asyncio process speaking HTTP/1.1 with keep-alive (hundreds of concurrent connections are fine):

- `GET <any other path>`: a counted request. Over the rate it is answered at once with `429 Too Many Requests`
  and `Retry-After` (seconds, `--retry-after`); else, after `--latency` seconds, `200` with a small JSON body.
  The limit is a token bucket over the whole server: `--rate` tokens a second, at most `--burst` banked.
- `GET /stats`: the counters as JSON (not counted): requests, ok (200s), throttled (429s), connections (TCP
  connections that sent a counted request since the last reset, each counted once), accepted (every TCP
  connection accepted since the last reset, the bench's own control connections included), the peer port of
  each counted connection (`ports`, to attribute them to processes), peak requests in flight, peak open
  connections, the seconds since the reset of the first and last counted request and the longest time between
  two counted requests.
- `POST /reset`: zero the counters, fill the bucket.

It prints `io_server ready on 127.0.0.1:P` once listening, and ends on SIGTERM/SIGINT, after `--lifetime`
seconds, or when its parent process goes away (checked every second): it never outlives the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

MAX_HEAD = 64 * 1024  # bytes of request line + headers
MAX_BODY = 1024 * 1024
MAX_PORTS = 200_000  # peer ports kept per reset (a bound, far above a run's connections)
IDLE_SECONDS = 120.0  # a keep-alive connection idle this long is closed
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 429: "Too Many Requests"}


@dataclass
class Counters:
    started: float = field(default_factory=time.monotonic)
    generation: int = 0
    requests: int = 0
    ok: int = 0
    throttled: int = 0
    connections: int = 0
    accepted: int = 0
    ports: list[int] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    open: int = 0
    peak_open: int = 0
    first: float | None = None
    last: float | None = None
    max_gap: float = 0.0  # the longest time between two counted requests

    def as_dict(self) -> dict[str, Any]:
        def since(t: float | None) -> float | None:
            return None if t is None else round(t - self.started, 6)

        return {
            "requests": self.requests,
            "ok": self.ok,
            "throttled": self.throttled,
            "connections": self.connections,
            "accepted": self.accepted,
            "ports": self.ports,
            "peak_in_flight": self.peak_in_flight,
            "peak_open": self.peak_open,
            "first": since(self.first),
            "last": since(self.last),
            "max_gap": round(self.max_gap, 6),
            "seconds": round(time.monotonic() - self.started, 6),
        }


class Bucket:
    """A token bucket: `rate` tokens a second, at most `burst` banked; starts full."""

    def __init__(self, rate: float, burst: float):
        self.rate, self.burst = rate, burst
        self.tokens, self.at = burst, time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def fill(self) -> None:
        self.tokens, self.at = self.burst, time.monotonic()


class Api:
    def __init__(self, rate: float, burst: float, latency: float, retry_after: str):
        self.bucket = Bucket(rate, burst)
        self.latency, self.retry_after = latency, retry_after
        self.counters = Counters()
        self.open = 0  # open connections that sent a counted request (in any generation), across resets

    def reset(self) -> None:
        generation = self.counters.generation + 1
        self.counters = Counters(generation=generation, open=self.open, peak_open=self.open)
        self.bucket.fill()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        port = int(peer[1]) if peer else 0
        self.counters.accepted += 1
        counted_in = -1  # the generation (reset) this connection was last counted in; -1: never (not open yet)
        try:
            while True:
                request = await self.read_request(reader)
                if request is None:
                    break
                method, target, keep_alive = request
                path = target.split("?", 1)[0]
                if path == "/stats":
                    status, body, extra = (200, self.counters.as_dict(), {}) if method == "GET" else (405, {}, {})
                elif path == "/reset":
                    status, body, extra = (200, {"reset": True}, {}) if method == "POST" else (405, {}, {})
                    if method == "POST":
                        self.reset()
                else:
                    c = self.counters
                    if counted_in != c.generation:
                        if counted_in == -1:  # the bench's /stats and /reset connections are never open ones
                            self.open += 1
                            c.open, c.peak_open = self.open, max(c.peak_open, self.open)
                        counted_in = c.generation
                        c.connections += 1
                        if len(c.ports) < MAX_PORTS:
                            c.ports.append(port)
                    status, body, extra = await self.answer(c, method, path)
                self.write(writer, status, body, extra, keep_alive)
                await writer.drain()
                if not keep_alive:
                    break
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, TimeoutError, ValueError):
            pass
        finally:
            if counted_in != -1:
                self.open -= 1
                self.counters.open = self.open
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def answer(self, c: Counters, method: str, path: str) -> tuple[int, dict[str, Any], dict[str, str]]:
        """A counted request: 429 at once when the bucket is empty, else 200 after the latency."""
        now = time.monotonic()
        c.requests += 1
        c.first = now if c.first is None else c.first
        c.max_gap = max(c.max_gap, now - (c.last or now))
        c.last = now
        if method != "GET":
            return 405, {"error": "GET only"}, {}
        if not self.bucket.take():
            c.throttled += 1
            return 429, {"error": "rate limited"}, {"Retry-After": self.retry_after}
        c.in_flight += 1
        c.peak_in_flight = max(c.peak_in_flight, c.in_flight)
        try:
            await asyncio.sleep(self.latency)
        finally:
            c.in_flight -= 1
        c.ok += 1
        return 200, {"path": path}, {}

    @staticmethod
    async def read_request(reader: asyncio.StreamReader) -> tuple[str, str, bool] | None:
        """(method, target, keep-alive) of the next request, its body read and dropped; None at a clean EOF."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_SECONDS)
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise
            return None
        if len(head) > MAX_HEAD:
            raise ValueError("request head too large")
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if length < 0 or length > MAX_BODY or "chunked" in headers.get("transfer-encoding", "").lower():
            raise ValueError("unsupported request body")
        if length:
            await reader.readexactly(length)
        connection = headers.get("connection", "").lower()
        keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
        return method, target, keep_alive

    @staticmethod
    def write(
        writer: asyncio.StreamWriter, status: int, body: dict[str, Any], extra: dict[str, str], keep: bool
    ) -> None:
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}", "Content-Type: application/json"]
        head += [f"Content-Length: {len(payload)}", f"Connection: {'keep-alive' if keep else 'close'}"]
        head += [f"{name}: {value}" for name, value in extra.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)


async def serve(args: argparse.Namespace) -> None:
    api = Api(args.rate, args.burst, args.latency, args.retry_after)
    server = await asyncio.start_server(api.connection, "127.0.0.1", args.port, backlog=1024, limit=MAX_HEAD)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    print(f"io_server ready on 127.0.0.1:{args.port} (rate {args.rate:g}/s, burst {args.burst:g}, "
          f"latency {args.latency:g} s, Retry-After {args.retry_after})", flush=True)  # fmt: skip
    deadline = time.monotonic() + args.lifetime
    async with server:
        while not stop.is_set() and time.monotonic() < deadline and os.getppid() == parent:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    print("io_server stopped", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.io_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, default=200.0, help="requests a second over the whole server")
    parser.add_argument("--burst", type=float, default=10.0, help="requests the bucket banks (default 10)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds before a 200 is answered")
    parser.add_argument("--retry-after", default="1", help="the Retry-After value of a 429 (default 1)")
    parser.add_argument("--lifetime", type=float, default=3600.0, help="seconds before it ends on its own")
    args = parser.parse_args(argv)
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
