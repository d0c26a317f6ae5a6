"""A loopback OTLP/HTTP trace receiver: what an OpenTelemetry collector is to a traced process, on a free port.

It speaks OTLP's protobuf over HTTP (`POST /v1/traces`, an ExportTraceServiceRequest) as the SDK's exporter sends
it, and keeps every span it was sent, flattened (`Span`), with the process that sent it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.http_server import running


@dataclass(frozen=True)
class Span:
    trace: str
    span: str
    parent: str  # "" for a root
    name: str
    attributes: dict[str, Any]
    error: bool
    pid: int  # the process.pid of the resource that sent it
    start: int
    end: int


@dataclass
class Receiver:
    url: str = ""
    spans: list[Span] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def until(self, what: Callable[[list[Span]], bool], timeout: float = 60) -> list[Span]:
        """The spans once `what(spans)` holds (woken by every export); AssertionError after `timeout`."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not what(self.spans):
                left = deadline - time.monotonic()
                assert left > 0, f"timed out; received {len(self.spans)} spans: {sorted({s.name for s in self.spans})}"
                self.changed.wait(left)
            return list(self.spans)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _spans(body: bytes) -> list[Span]:
    request = ExportTraceServiceRequest.FromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                found.append(Span(
                    s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.name,
                    {a.key: _value(a.value) for a in s.attributes}, s.status.code == 2,
                    int(resource.get("process.pid") or 0), s.start_time_unix_nano, s.end_time_unix_nano,
                ))  # fmt: skip
    return found


@contextlib.contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver on a loopback port until the block ends; its `url` is the OTLP endpoint to export to."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # the answer's two writes must not wait for a delayed ACK

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            spans = _spans(body) if self.path == "/v1/traces" else []
            with receiver.changed:
                receiver.spans.extend(spans)
                receiver.changed.notify_all()
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200 if self.path == "/v1/traces" else 404)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    with running(Handler) as server:
        receiver.url = server.url
        yield receiver


def environment(receiver: Receiver, items: float = 0.01) -> dict[str, str]:
    """What a traced process needs: the endpoint, a short export delay, the share of items traced."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
            "CHORDFLOW_TRACE_ITEMS": str(items)}  # fmt: skip
