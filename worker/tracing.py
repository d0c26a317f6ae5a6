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

Imports only `worker.settings`: every package may use it.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import secrets
import sys
import threading
import time
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
_FORCED: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("chordflow_span_ids", default=None)
_provider: Any = None
_tracer: Any = None
_provider_pid = 0


def tracer() -> Any:
    """This process's tracer, its provider made on first use (again in a forked child: the parent's exporting
    thread did not survive the fork)."""
    global _provider, _tracer, _provider_pid
    if _tracer is None or _provider_pid != os.getpid():
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        class Ids(RandomIdGenerator):
            """Random ids, but those of a `Later` span while it is emitted."""

            def generate_trace_id(self) -> int:
                forced = _FORCED.get()
                return forced[0] if forced else super().generate_trace_id()

            def generate_span_id(self) -> int:
                forced = _FORCED.get()
                return forced[1] if forced else super().generate_span_id()

        if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
            exporter: Any = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        name = os.environ.get("OTEL_SERVICE_NAME") or "chordflow"
        resource = Resource.create({"service.name": name, "process.pid": os.getpid()})
        _provider = TracerProvider(resource=resource, id_generator=Ids(), shutdown_on_exit=False)
        _provider.add_span_processor(BatchSpanProcessor(exporter))
        _tracer, _provider_pid = _provider.get_tracer("chordflow"), os.getpid()
        atexit.register(_bounded, _provider.shutdown)
    return _tracer


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
    """Mark a span (from `span`) an error with `error`'s text."""
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
    if not ON:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


# -- spans that begin in one process and end in another --------------------------------------------------------


@dataclass(frozen=True)
class Later:
    """A span begun here and ended by another process: its ids, its parent's, its start (ns since the epoch)."""

    trace: int
    span: int
    parent: int
    start: int

    @classmethod
    def begin(cls, start: int | None = None) -> Later | None:
        """A new span under the current one (a root when none is current), begun at `start` (ns since the epoch;
        default now); None when tracing is off."""
        if not ON:
            return None
        from opentelemetry import trace

        current = trace.get_current_span().get_span_context()
        own = secrets.randbits(64) or 1
        start = start or time.time_ns()
        if current.is_valid:
            return cls(current.trace_id, own, current.span_id, start)
        return cls(secrets.randbits(128) or 1, own, 0, start)

    def wire(self) -> str:
        return f"{self.trace:032x}-{self.span:016x}-{self.parent:016x}-{self.start}"

    @classmethod
    def parse(cls, text: str | bytes | None) -> Later | None:
        """From `wire`; None for nothing, for text this release cannot read, or when tracing is off here."""
        if not ON or not text:
            return None
        try:
            trace, own, parent, start = (text.decode() if isinstance(text, bytes) else text).split("-")
            return cls(int(trace, 16), int(own, 16), int(parent, 16), int(start))
        except ValueError:
            return None

    def context(self) -> Any:
        """A context whose current span is this one: what its children are started under."""
        from opentelemetry import trace

        return trace.set_span_in_context(trace.NonRecordingSpan(self._span_context(self.span)))

    def _span_context(self, span_id: int) -> Any:
        from opentelemetry import trace

        return trace.SpanContext(self.trace, span_id, is_remote=True, trace_flags=trace.TraceFlags(1))

    def end(self, name: str, attributes: Mapping[str, Any], error: str | None = None) -> None:
        """Emit the span, from its start to now, with the ids drawn when it began."""
        from opentelemetry import trace

        parent = (
            trace.set_span_in_context(trace.NonRecordingSpan(self._span_context(self.parent))) if self.parent else None
        )
        token = _FORCED.set((self.trace, self.span))
        try:
            emitted = tracer().start_span(name, context=parent or _root(), attributes={RUN_ID: _RUN.get() or "",
                                          **attributes}, start_time=self.start)  # fmt: skip
        finally:
            _FORCED.reset(token)
        if error:
            failed(emitted, error)
        emitted.end()


def parent_of(wire: str | bytes | None) -> Any:
    """The context to start children of a stored `Later` (its `wire`) under; None when there is none."""
    later = Later.parse(wire)
    return later.context() if later is not None else None


def _root() -> Any:
    """A context with no current span: a root, whatever this process has open."""
    from opentelemetry import context

    return context.Context()


# -- items ----------------------------------------------------------------------------------------------------


def item_threshold() -> int | None:
    """Which items get a span of their own, as `picked` reads it: from CHORDFLOW_TRACE_ITEMS (the share of a batch's
    items traced; every failed one is, whatever it says); None when tracing is off."""
    return int(settings.get("trace_items") * SPAN) if ON else None


def picked(index: int, threshold: int) -> bool:
    """Whether item `index` gets a span: the same answer for every delivery of its chunk. Inlined in the item loop
    as `(index * SPREAD) & MASK < threshold`."""
    return (index * SPREAD) & MASK < threshold


#: Fibonacci hashing: consecutive indexes land far apart, so a share of them is spread over the whole batch.
SPREAD, MASK, SPAN = 0x9E3779B97F4A7C15, (1 << 64) - 1, 1 << 64
