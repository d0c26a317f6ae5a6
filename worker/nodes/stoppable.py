"""The http node's network layer: a request the batch's stop comes to is never sent, and a response waited for is
given up within READ_SLICE of it (worker/stopping.py), its connection closed.

A socket read blocks for the whole timeout, and nothing another thread does wakes it short of closing a socket
it cannot reach through httpx. So every read waits in slices of READ_SLICE seconds (a read that times out
consumes nothing: the next slice goes on where it left off), looking at the stop between slices, up to the
call's own timeout. Stopped raised inside httpcore closes the connection (a response half read is never reused).
Imported with httpx, by the http node's first call (worker/nodes/http.py client).
"""

from __future__ import annotations

import ssl
import time
import typing

import httpcore
import httpx

from worker import stopping

#: Seconds a socket read waits before looking at the stop again.
READ_SLICE = 0.25


class StoppableStream(httpcore.NetworkStream):
    """A connection's stream whose reads and writes end with the current stop."""

    def __init__(self, stream: httpcore.NetworkStream):
        self.stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        signal = stopping.current()
        if signal is None:
            return self.stream.read(max_bytes, timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if signal.is_set():
                raise stopping.Stopped
            step = READ_SLICE if deadline is None else min(READ_SLICE, deadline - time.monotonic())
            if step <= 0:
                raise httpcore.ReadTimeout("timed out")
            try:
                return self.stream.read(max_bytes, step)
            except httpcore.ReadTimeout:
                continue

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        stopping.check()  # a request not yet sent is not sent once stopped
        self.stream.write(buffer, timeout)

    def close(self) -> None:
        self.stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return StoppableStream(self.stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self.stream.get_extra_info(info)


class StoppableBackend(httpcore.NetworkBackend):
    """Makes StoppableStreams; no connection is opened once stopped."""

    def __init__(self, backend: httpcore.NetworkBackend):
        self.backend = backend

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        stopping.check()
        return StoppableStream(self.backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: typing.Iterable[typing.Any] | None = None
    ) -> httpcore.NetworkStream:
        stopping.check()
        return StoppableStream(self.backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        stopping.sleep(seconds)


def transport(limits: httpx.Limits) -> httpx.HTTPTransport:
    """httpx's transport over a StoppableBackend (httpcore's pool takes a network backend; httpx passes none in)."""
    made = httpx.HTTPTransport(limits=limits)
    pool = made._pool
    pool._network_backend = StoppableBackend(pool._network_backend)
    return made
