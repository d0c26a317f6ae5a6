"""OpenTelemetry traces of runs: on when the standard variables ask for an exporter, off and free otherwise.

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) or `OTEL_TRACES_EXPORTER` (`otlp`, `console`) is
set and `OTEL_SDK_DISABLED` is not; the rest of the SDK's own variables apply (`OTEL_SERVICE_NAME`,
`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_EXPORTER_OTLP_HEADERS`...). Off, every call here is one test of `ON` and the
SDK is never imported. chordflow exports through a provider of its own, never the process's global one, so a
user's own tracing setup is left as it was; a span the user's code has open when it submits becomes the run's
parent.

A run's span, and a batch's on the cluster, begin in one process and end in another (`submit` and the advance
that finishes the run; the advance that dispatches and the merge). Such a span is a `Later`: its ids are drawn
when it begins and stored with what goes on (the run record's `trace`, the batch's messages); its children are
parented to those ids at once, and the process that ends it emits it whole with the stored ids and start time.
A retried or redelivered task looks up the same ids, so its spans join the same trace.

A `submit` client never loads the SDK (nor the OTLP exporter, protobuf and requests: 0.1 s of a short command):
its own span, `chordflow submit`, is handed over in the run's `Later` (`handing`) and emitted, under the client's
service name and pid, by the process that ends the run. A sampled item's span (`item`) is made here and handed
to the exporter whole as it ends: a tenth of what the SDK's tracer costs a span.

Imports only `worker.settings`: every package may use it.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import json
import os
import secrets
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from worker import settings

#: Attributes every span of a run carries.
RUN_ID = "chordflow.run_id"


def _wanted() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _installed() -> bool:
    """Whether the SDK and the OTLP exporter are here (the `otel` extra); a line on stderr when they are asked for
    and missing, once per process: the run goes on untraced."""
    import importlib.util

    if importlib.util.find_spec("opentelemetry.sdk") and importlib.util.find_spec("opentelemetry.exporter.otlp"):
        return True
    print("chordflow: tracing is asked for (OTEL_*) but the OpenTelemetry SDK is not installed: "
          "pip install 'chordflow[otel]'; running untraced", file=sys.stderr)  # fmt: skip
    return False


#: Whether this process traces: read once at import, as the SDK reads its own variables.
ON = _wanted() and _installed()

#: The run the current code works for: every span started under it carries its id.
_RUN: contextvars.ContextVar[str | None] = contextvars.ContextVar("chordflow_traced_run", default=None)
_provider: Any = None
_tracer: Any = None
_processor: Any = None  # the provider's span processor: where `_emit` hands a span made whole
_scope: Any = None  # the tracer's instrumentation scope, for the spans `_emit` makes
_provider_pid = 0


def tracer() -> Any:
    """This process's tracer, its provider made on first use (again in a forked child: the parent's exporting
    thread did not survive the fork)."""
    global _provider, _tracer, _processor, _scope, _provider_pid
    if _tracer is None or _provider_pid != os.getpid():
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
            exporter: Any = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        resource = Resource.create({"service.name": _service(), "process.pid": os.getpid()})
        _provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        _processor = BatchSpanProcessor(exporter)
        _provider.add_span_processor(_processor)
        _tracer, _scope = _provider.get_tracer("chordflow"), InstrumentationScope("chordflow")
        _provider_pid = os.getpid()
        atexit.register(_bounded, _provider.shutdown)
    return _tracer


def _service() -> str:
    return os.environ.get("OTEL_SERVICE_NAME") or "chordflow"


#: Seconds a process gives its last export at exit: a collector out of reach must not hold a command (the SDK's
#: own exit hook would retry for the exporter's whole timeout); what is not exported by then is dropped.
EXIT_SECONDS = 2.0


def _bounded(export: Any) -> None:
    """Run `export` (a flush, a shutdown) for at most EXIT_SECONDS, on a daemon thread the exit does not wait for."""
    done = threading.Thread(target=export, name="chordflow-trace-export", daemon=True)
    done.start()
    done.join(EXIT_SECONDS)


def flush() -> None:
    """Export what this process has ended: a pool child about to exit, a client about to return."""
    if _provider is not None and _provider_pid == os.getpid():
        _bounded(_provider.force_flush)


# -- spans that live in this process ---------------------------------------------------------------------------


@contextlib.contextmanager
def span(name: str, attributes: Mapping[str, Any] | None = None, *, kind: str = "internal",
         quiet: tuple[type[BaseException], ...] = ()) -> Iterator[Any]:  # fmt: skip
    """A span around the block, under the current one and current inside it (its children's parent); None when
    tracing is off. An Exception leaving the block marks it an error, but for those in `quiet` (a task's control
    flow), named in `chordflow.ended_by` instead; a BaseException (a suspended step, a stopped item) neither."""
    if not ON:
        yield None
        return
    from opentelemetry import trace

    attrs = {RUN_ID: _RUN.get() or "", **(attributes or {})}
    with tracer().start_as_current_span(
        name, kind=getattr(trace.SpanKind, kind.upper()), attributes=attrs,
        record_exception=False, set_status_on_exception=False,
    ) as current:  # fmt: skip
        try:
            yield current
        except quiet as exc:
            current.set_attribute("chordflow.ended_by", type(exc).__name__)
            raise
        except Exception as exc:
            current.record_exception(exc)
            failed(current, f"{type(exc).__name__}: {exc}")
            raise


@contextlib.contextmanager
def within(run_id: str, parent: Any = None) -> Iterator[None]:
    """Inside the block, spans belong to run `run_id`, under `parent` (a context) when given."""
    if not ON:
        yield
        return
    from opentelemetry import context

    run = _RUN.set(run_id)
    token = context.attach(parent) if parent is not None else None
    try:
        yield
    finally:
        if token is not None:
            context.detach(token)
        _RUN.reset(run)


def failed(current: Any, error: str) -> None:
    """Mark a span (from `span` or `item`) an error with `error`'s text."""
    if current is not None:
        from opentelemetry.trace import Status, StatusCode

        current.set_status(Status(StatusCode.ERROR, error))


def headers() -> dict[str, str]:
    """The W3C `traceparent` of the current span, for an outgoing request; empty when tracing is off."""
    if not ON:
        return {}
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


def trace_id() -> str | None:
    """The current trace's id (32 hex digits), for a log line; None when none is current or tracing is off."""
    current = _current() if ON else None
    return f"{current.trace_id:032x}" if current is not None else None


# -- spans that begin in one process and end in another --------------------------------------------------------


@dataclass(frozen=True)
class Handed:
    """A span run by a process that does not export (the `submit` client), handed over inside its parent `Later`
    and emitted with it, under the resource of the process that ran it (its service name and pid)."""

    name: str
    span: int
    start: int
    end: int
    pid: int
    service: str


@dataclass(frozen=True)
class Later:
    """A span begun here and ended by another process: its ids, its parent's, its start (ns since the epoch), and a
    child span handed over with it (`handing`)."""

    trace: int
    span: int
    parent: int
    start: int
    handed: Handed | None = None

    @classmethod
    def begin(cls, start: int | None = None) -> Later | None:
        """A new span under the current one (a root when none is current), begun at `start` (ns since the epoch;
        default now); None when tracing is off. Loads no SDK."""
        if not ON:
            return None
        own = secrets.randbits(64) or 1
        start = start or time.time_ns()
        current = _current()
        if current is not None:
            return cls(current.trace_id, own, current.span_id, start)
        return cls(secrets.randbits(128) or 1, own, 0, start)

    def handing(self, name: str) -> Later:
        """This span with a child `name`, from this span's start to now, ran by this process: whoever ends this
        span emits the child too, so this process needs no exporter (the `submit` client)."""
        child = Handed(name, secrets.randbits(64) or 1, self.start, time.time_ns(), os.getpid(), _service())
        return Later(self.trace, self.span, self.parent, self.start, child)

    def wire(self) -> str:
        text = f"{self.trace:032x}-{self.span:016x}-{self.parent:016x}-{self.start}"
        if self.handed is None:
            return text
        h = self.handed
        return f"{text} {json.dumps([h.name, f'{h.span:016x}', h.start, h.end, h.pid, h.service])}"

    @classmethod
    def parse(cls, text: str | bytes | None) -> Later | None:
        """From `wire`; None for nothing, for text this release cannot read, or when tracing is off here."""
        if not ON or not text:
            return None
        try:
            ids, _, handed = (text.decode() if isinstance(text, bytes) else text).partition(" ")
            trace, own, parent, start = ids.split("-")
            child = None
            if handed:
                name, span, begun, ended, pid, service = json.loads(handed)
                child = Handed(str(name), int(span, 16), int(begun), int(ended), int(pid), str(service))
            return cls(int(trace, 16), int(own, 16), int(parent, 16), int(start), child)
        except (ValueError, TypeError):
            return None

    def context(self) -> Any:
        """A context whose current span is this one: what its children are started under."""
        from opentelemetry import trace

        return trace.set_span_in_context(trace.NonRecordingSpan(_ids(self.trace, self.span)))

    def end(self, name: str, attributes: Mapping[str, Any], error: str | None = None) -> None:
        """Emit the span, from its start to now, with the ids drawn when it began; and the child handed with it."""
        from opentelemetry import trace

        tracer()  # the provider, made on first use
        run = {RUN_ID: _RUN.get() or ""}
        parent = _ids(self.trace, self.parent) if self.parent else None
        asked = trace.set_span_in_context(trace.NonRecordingSpan(parent)) if parent is not None else None
        if not _provider.sampler.should_sample(asked, self.trace, name).decision.is_sampled():
            return  # the configured sampler (OTEL_TRACES_SAMPLER) leaves this trace out, as for any span
        ended = time.time_ns()
        _emit(name, _ids(self.trace, self.span), parent, self.start, ended, {**run, **attributes}, error or None)
        if (h := self.handed) is not None:
            from opentelemetry.sdk.resources import Resource

            resource = _provider.resource.merge(Resource({"service.name": h.service, "process.pid": h.pid}))
            _emit(h.name, _ids(self.trace, h.span), _ids(self.trace, self.span), h.start, h.end, run, None, resource)


def parent_of(wire: str | bytes | None) -> Any:
    """The context to start children of a stored `Later` (its `wire`) under; None when there is none."""
    later = Later.parse(wire)
    return later.context() if later is not None else None


def _current() -> Any:
    """The current span's SpanContext, None when none is: without the API imported (a client whose caller does
    not trace), none can be."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from opentelemetry import trace

    current = trace.get_current_span().get_span_context()
    return current if current.is_valid else None


def _ids(trace_id: int, span_id: int) -> Any:
    from opentelemetry import trace

    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(1))


def _emit(name: str, ids: Any, parent: Any, start: int, end: int, attributes: Mapping[str, Any],
          error: str | None = None, resource: Any = None, events: tuple[Any, ...] = ()) -> None:  # fmt: skip
    """Hand the exporter a span made whole here, with ids of our own: a `Later`, a handed one, an item's."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import Status, StatusCode

    status = Status(StatusCode.ERROR, error) if error is not None else Status(StatusCode.UNSET)
    _processor.on_end(ReadableSpan(
        name, ids, parent, resource or _provider.resource, attributes, events, status=status, start_time=start,
        end_time=end, instrumentation_scope=_scope,
    ))  # fmt: skip


# -- items ----------------------------------------------------------------------------------------------------


def item_threshold() -> int | None:
    """Which items get a span of their own, as `picked` reads it: from CHORDFLOW_TRACE_ITEMS (the share of a batch's
    items traced; every failed one is, whatever it says); None when tracing is off."""
    return int(settings.get("trace_items") * SPAN) if ON else None


@contextlib.contextmanager
def item(node: str, index: int) -> Iterator[Any]:
    """A sampled item's span, `item <node>`: current inside the block and recording what is set on it, as `span`'s,
    but handed to the exporter whole as it ends rather than made by the SDK's tracer (3 us an item, not 25); None
    when tracing is off or its parent is not sampled. An Exception leaving the block marks it an error."""
    parent = _current() if ON else None
    if not ON or (parent is not None and not parent.trace_flags.sampled):
        yield None
        return
    from opentelemetry import context, trace

    tracer()  # the provider, made on first use
    ids = trace.SpanContext(parent.trace_id if parent is not None else secrets.randbits(128) or 1,
                            secrets.randbits(64) or 1, is_remote=False, trace_flags=trace.TraceFlags(1))  # fmt: skip
    attributes = {RUN_ID: _RUN.get() or "", "chordflow.node": node, "chordflow.index": index}
    current = _item_type()(f"item {node}", ids, attributes)
    token = context.attach(trace.set_span_in_context(current))
    try:
        yield current
    except Exception as exc:
        current.record_exception(exc)
        current.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        context.detach(token)
        attributes = current.attributes
        if current.told:  # what the item's code set is cleaned as the SDK would (an invalid value dropped)
            from opentelemetry.attributes import BoundedAttributes

            attributes = BoundedAttributes(attributes=attributes)
        _emit(current.name, ids, parent, current.start, time.time_ns(), attributes, current.error,
              events=tuple(current.events))  # fmt: skip


@functools.cache
def _item_type() -> type:
    """The class of an item's span, made once tracing is used (it derives from the API's)."""
    from opentelemetry import trace
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import Event
    from opentelemetry.trace import StatusCode

    class ItemSpan(trace.NonRecordingSpan):
        """What code inside an item sets on its span (attributes, status, events, its name), kept for `item`."""

        def __init__(self, name: str, ids: Any, attributes: dict[str, Any]) -> None:
            super().__init__(ids)
            self.name, self.attributes, self.start = name, attributes, time.time_ns()
            self.error: str | None = None
            self.events: list[Any] = []
            self.told = False  # whether code other than `item` set attributes

        def is_recording(self) -> bool:
            return True

        def set_attribute(self, key: str, value: Any) -> None:
            self.attributes[key], self.told = value, True

        def set_attributes(self, attributes: Mapping[str, Any]) -> None:
            self.attributes.update(attributes)
            self.told = True

        def set_status(self, status: Any, description: str | None = None) -> None:
            if getattr(status, "status_code", status) is StatusCode.ERROR:
                self.error = getattr(status, "description", None) or description or ""

        def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
            self.events.append(Event(name, BoundedAttributes(attributes=attributes), timestamp or time.time_ns()))

        def record_exception(self, exception: BaseException, attributes: Any = None, timestamp: int | None = None,
                             escaped: bool = False) -> None:  # fmt: skip
            kind = type(exception)
            told = {
                "exception.type": kind.__qualname__ if kind.__module__ == "builtins" else
                f"{kind.__module__}.{kind.__qualname__}",
                "exception.message": str(exception),
                "exception.stacktrace": "".join(traceback.format_exception(exception)),
                "exception.escaped": str(escaped),
            }  # fmt: skip
            self.add_event("exception", {**told, **(attributes or {})}, timestamp)

        def update_name(self, name: str) -> None:
            self.name = name

    return ItemSpan


def picked(index: int, threshold: int) -> bool:
    """Whether item `index` gets a span: the same answer for every delivery of its chunk. Inlined in the item loop
    as `(index * SPREAD) & MASK < threshold`."""
    return (index * SPREAD) & MASK < threshold


#: Fibonacci hashing: consecutive indexes land far apart, so a share of them is spread over the whole batch.
SPREAD, MASK, SPAN = 0x9E3779B97F4A7C15, (1 << 64) - 1, 1 << 64
