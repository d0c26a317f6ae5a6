"""Log lines an operator can use: one per chunk and one per run transition, with their fields.

Workers write, at INFO:

- per chunk (`chordflow.run_chunk`, `chordflow.dataset_chunk`): `chunk run=<id> node=<node> batch=<key>
  items[<i>:<j>] items=<n> failed=<k> seconds=<s>`;
- per run transition (`advance`, the merge task, a dataset job's chunks): `run <id>: <from> -> <to>
  node=<node> steps=<n> items=<n> failed=<k>` (and `error=` when it failed).

With `CHORDFLOW_LOG_FORMAT=json` every log line of a worker is one JSON object (`JsonFormatter`): `time`,
`level`, `logger`, `message`, the line's fields (`event`, `run`, `node`, ...) and, inside a task, `task` and
`task_id`. Both formats pass through the secret filter (worker/redact.py) first; JSON field values are
masked too. With tracing on (worker/tracing.py), a line written inside a traced run carries its trace's id
(` trace=<id>`, JSON `trace_id`). `configure` is hooked to Celery's logger signals in worker/cluster/app.py.

`listeners` are told of every chunk (`chordflow worker --metrics-port` counts items and times chunks from
the same events, scheduler/ops/metrics.py), so the metrics and the log lines cannot disagree.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from worker import redact, settings, tracing

log = logging.getLogger("chordflow")
# Not Python's last-resort handler in a client (a dataset job's reader ends it): only a worker, whose logging
# Celery sets up, prints these lines (`run X: running -> failed ...`).
log.addHandler(logging.NullHandler())

#: The environment variable that selects the format of a worker's log lines: `text` (default) or `json`.
FORMAT_VARIABLE = "CHORDFLOW_LOG_FORMAT"
#: The attribute of a LogRecord that holds a line's structured fields.
FIELDS = "chordflow_fields"

#: Callables given (event name, fields) for every chunk a worker finishes: `chunk` events.
listeners: list[Callable[[str, dict[str, Any]], None]] = []


def json_format() -> bool:
    """Whether FORMAT_VARIABLE says json; ValueError (one line) for a value other than text or json."""
    return settings.get("log_format") == "json"


# -- the lines ------------------------------------------------------------------------------------------------


def chunk(run: str, node: str, batch: str, start: int, items: int, failed: int, seconds: float) -> None:
    """A chunk of a batch (or of a dataset job's records) finished on this worker."""
    fields = {"event": "chunk", "run": run, "node": node, "batch": batch, "start": start, "items": items,
              "failed": failed, "seconds": round(seconds, 3)}  # fmt: skip
    trace = _traced(fields)
    log.info(
        "chunk run=%s node=%s batch=%s items[%d:%d] items=%d failed=%d seconds=%.3f%s",
        run, node, batch, start, start + items, items, failed, seconds, trace, extra={FIELDS: fields},
    )  # fmt: skip
    for listener in listeners:
        listener("chunk", fields)


def transition(
    run: str,
    before: str | None,
    after: str,
    *,
    node: str | None = None,
    steps: int | None = None,
    items: int | None = None,
    failed: int | None = None,
    error: str | None = None,
) -> None:
    """A run's status changed (`queued -> running`, `running -> succeeded`...); counts when known."""
    error = redact.mask(error) if error else None
    counts = {"node": node, "steps": steps, "items": items, "failed": failed, "error": error}
    counts = {k: v for k, v in counts.items() if v is not None}
    fields: dict[str, Any] = {"event": "run", "run": run, "from": before, "to": after, **counts}
    detail = "".join(f" {k}={v}" for k, v in counts.items()) + _traced(fields)
    level = logging.WARNING if after == "failed" else logging.INFO
    log.log(level, "run %s: %s -> %s%s", run, before or "-", after, detail, extra={FIELDS: fields})


def _traced(fields: dict[str, Any]) -> str:
    """With tracing on, the current trace's id in a line's fields (`trace_id`) and its text (` trace=<id>`)."""
    trace = tracing.trace_id()
    if trace is None:
        return ""
    fields["trace_id"] = trace
    return f" trace={trace}"


def batch_items(batches: dict[str, dict[str, int]] | None) -> tuple[int | None, int | None]:
    """(items, failed) over a run record's finished batches; (None, None) when it has none."""
    if not batches:
        return None, None
    return sum(c.get("done", 0) for c in batches.values()), sum(c.get("failed", 0) for c in batches.values())


# -- formatting ----------------------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: time (UTC, ISO 8601), level, logger, message, the record's
    fields, the task it ran in, and `exception` (the traceback text) when it has one. Values are masked."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _utc(record.created, int(record.msecs)),
            "level": record.levelname,
            "logger": record.name,
            "message": redact.mask(record.getMessage()),
        }
        for name, value in (getattr(record, FIELDS, None) or {}).items():
            line.setdefault(name, redact.mask(value) if isinstance(value, str) else value)
        if (trace := tracing.trace_id()) is not None:
            line.setdefault("trace_id", trace)
        task = _current_task()
        if task is not None:
            line.setdefault("task", task[0])
            line.setdefault("task_id", task[1])
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = redact.mask(record.exc_text)
        if record.stack_info:
            line["stack"] = redact.mask(self.formatStack(record.stack_info))
        return json.dumps(line, default=str, ensure_ascii=False)


def _utc(seconds: float, millis: int) -> str:
    """A JSON line's `time`: UTC, ISO 8601, to the millisecond."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


def _current_task() -> tuple[str, str] | None:
    try:
        from celery import current_task
    except ImportError:  # pragma: no cover - celery is a dependency
        return None
    request = getattr(current_task, "request", None) if current_task else None
    task_id = getattr(request, "id", None)
    return (current_task.name, task_id) if task_id else None


_early: logging.Handler | None = None


def json_lines_only() -> None:
    """What a worker writes outside its log handlers becomes JSON lines too (called at `celeryd_init` with
    CHORDFLOW_LOG_FORMAT=json; the banner is turned off there):

    - warnings emitted before Celery sets up logging (e.g. its own about running as root) go to stderr as JSON
      lines instead of Python's plain text, until `configure` hands them to the worker's handlers;
    - the notices Celery writes from its signal handlers (`worker: Warm shutdown (MainProcess)`) with
      `celery.apps.worker.safe_say` are written as JSON lines (`say_json`), the same way: one write, no logging.
    """
    global _early
    import celery.apps.worker

    celery.apps.worker.safe_say = say_json
    logging.captureWarnings(True)
    warnings_log = logging.getLogger("py.warnings")
    if _early is None:
        _early = logging.StreamHandler(sys.__stderr__)
        _early.setFormatter(JsonFormatter())
        _early.addFilter(redact.LogFilter())
        warnings_log.addHandler(_early)
        warnings_log.propagate = False


def say_json(msg: str, f: Any = sys.__stderr__) -> None:
    """Celery's `safe_say` as a JSON line. It runs in signal handlers: no logging and no lock (so of the masks,
    only URL credentials: a restart notice shows the command line), one os.write."""
    now = time.time()
    message = redact.URL_RE.sub(lambda url: redact.mask_url(url.group()), msg.strip())
    stamp = _utc(now, int(now % 1 * 1000))
    line = {"time": stamp, "level": "WARNING", "logger": "celery.apps.worker", "message": message}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.write(f.fileno(), (json.dumps(line, ensure_ascii=False) + "\n").encode())


#: Libraries whose INFO lines are per request: a worker shows only their warnings.
QUIET_LIBRARIES = ("httpx", "httpcore")


def configure(logger: logging.Logger | None = None, **_: Any) -> None:
    """Every handler of `logger`, of the root logger and of Celery's task and multiprocessing loggers masks
    secrets (worker/redact.py) and, with CHORDFLOW_LOG_FORMAT=json, writes JSON lines.

    A receiver for Celery's `after_setup_logger` and `after_setup_task_logger` signals (worker/cluster/app.py), sent
    once the worker's loggers have their handlers (forked pool processes inherit them)."""
    global _early
    redact.install_log_filter(logger)
    # httpx logs every request at INFO: thousands of lines per chunk of `http` items, none an operator needs.
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, logging.getLogger(chatty).level))
    if _early is not None:  # the worker's handlers exist now: warnings go to them, as every other line
        warnings_log = logging.getLogger("py.warnings")
        warnings_log.removeHandler(_early)
        warnings_log.propagate = True
        _early = None
    if not json_format():
        return
    from billiard.util import get_logger as multiprocessing_logger

    for each in {logger or logging.getLogger(), logging.getLogger(), logging.getLogger("celery.task")}:
        for handler in each.handlers:
            handler.setFormatter(JsonFormatter())
    mp = multiprocessing_logger()
    for handler in mp.handlers if mp is not None else ():
        handler.setFormatter(JsonFormatter())
