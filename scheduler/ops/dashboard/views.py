"""The JSON a dashboard page shows: the runs list, one run with its nodes and batches, failed items.

Built from the same reads as the CLI: `lookup.recent` lists runs from both stores, `lookup.find_run`
opens one. A run record's `batches` hold a batch's counts once it ended; a running cluster batch's come
from its progress stream (live.py); a dataset job's `records` counts come from its chunk store. A run's `llm` (its
model calls: calls, cached calls, tokens, USD when priced) is `usage_totals` of its `__llm_calls__`, as `status`
shows it, read again only when the run changed (its record's `updated`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from scheduler import lookup
from scheduler.ops import usage
from scheduler.ops.dashboard.live import LiveProgress
from worker.runs.record import FINAL, RunRecord
from worker.runs.store import RunStore

#: Seconds between two messages of an event stream.
REFRESH_SECONDS = 1.0
#: Runs in the list, and failed items per page (at most MAX_PAGE).
RUNS_LIMIT, FAILED_PAGE, MAX_FAILED_PAGE = 50, 50, 500
#: Runs whose model-call totals are remembered (a few pages of lists).
USAGE_KEPT = 1024
#: Longest error text sent for one failed item.
ERROR_CHARS = 2000


class Views:
    """The JSON the page shows, built from the run stores (blocking reads: called in a worker thread)."""

    def __init__(self, live: LiveProgress | None = None, cache_seconds: float = REFRESH_SECONDS / 2):
        self.live = live or LiveProgress()
        self.cache_seconds = cache_seconds
        self._cache: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()
        self._usage: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()
        self._cluster: RunStore | None = None  # the cluster's store, opened once a listed run needs it

    def _cached(self, key: Any, build: Callable[[], Any]) -> Any:
        """One build per moment, however many pages follow the same stream."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.cache_seconds:
            return hit[1]
        value = build()
        with self._lock:
            self._cache[key] = (now, value)
            for stale in [k for k, (t, _) in self._cache.items() if now - t > 60]:
                del self._cache[stale]
        return value

    def runs(self, status: str | None = None, limit: int = RUNS_LIMIT) -> dict[str, Any]:
        return self._cached(("runs", status, limit), lambda: self._runs(status, limit))

    def _runs(self, status: str | None, limit: int) -> dict[str, Any]:
        return {"runs": [self._summary(record)[0] for record in lookup.recent(status, limit)], "at": time.time()}

    def run(self, run_id: str) -> dict[str, Any]:
        return self._cached(("run", run_id), lambda: self._run(run_id))

    def _run(self, run_id: str) -> dict[str, Any]:
        record, runs = lookup.find_run(run_id)
        summary, batches = self._summary(record, follow=True, runs=runs)
        trail = set(runs.trail(run_id))
        nodes = []
        for spec in record.workflow.get("nodes", []):
            node = spec["id"]
            if node == record.node and record.status not in ("queued", "succeeded"):
                state = record.status
            else:
                state = "done" if node in trail else "pending"
            nodes.append(
                {"id": node, "type": spec.get("type"), "batch": bool(spec.get("batch")), "state": state,
                 "progress": batches.get(node)}
            )  # fmt: skip
        return {"run": summary, "nodes": nodes, "at": time.time()}

    def _llm(self, record: RunRecord, runs: RunStore | None) -> dict[str, Any] | None:
        """The run's model-call totals: its `__llm_calls__` read once per change of the run (not per refresh)."""
        with self._lock:
            hit = self._usage.get(record.run_id)
        if hit is not None and hit[0] == record.updated:
            return hit[1]
        if runs is None:  # a row of the list: the run is in the local store, else it was listed from Redis
            runs = lookup.local_runs()
            if runs.get(record.run_id) is None:
                runs = self._cluster = self._cluster or lookup.cluster_runs()
        totals = usage.totals(usage.calls_of(record, runs))
        with self._lock:
            self._usage[record.run_id] = (record.updated, totals)
            self._usage.move_to_end(record.run_id)
            while len(self._usage) > USAGE_KEPT:
                self._usage.popitem(last=False)
        return totals

    def _summary(
        self, record: RunRecord, follow: bool = False, runs: RunStore | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the run's row: status, progress, rate, ETA, model calls, ...; its batches by node)."""
        from scheduler.datasets import reading

        running = record.status not in FINAL
        ended = record.updated if not running else time.time()
        row: dict[str, Any] = {
            "run_id": record.run_id, "workflow": record.name, "backend": record.backend, "status": record.status,
            "node": record.node, "steps": record.step, "error": record.error, "created": record.created,
            "duration": max(0.0, ended - record.created), "dataset": record.dataset is not None,
            "rate": None, "eta_s": None, "priority": record.priority, "waiting": record.waits,
            "llm": None if record.dataset is not None else self._llm(record, runs),
        }  # fmt: skip
        batches: dict[str, Any] = dict(record.batches)
        if record.dataset is not None:
            records = reading.progress(record)
            row.update(done=records["done"], total=records["total"], read=records["read"], failed=records["failed"])
            row.update(rate=records["rate"], eta_s=records["eta_s"] if running else None)
            batches = {"records": {k: records[k] for k in ("total", "done", "failed")}}
            return row, batches
        rate = None
        if record.backend == "celery" and (running or follow):
            live, rate = self.live.read(record.run_id)
            for node, counts in live.items():
                if node not in batches or (running and node == record.node):
                    batches[node] = counts
        done = sum(c["done"] for c in batches.values())
        total = sum(c["total"] for c in batches.values())
        failed = sum(c["failed"] for c in batches.values())
        if not running:
            rate = done / row["duration"] if done and row["duration"] > 0 else None
        row.update(done=done, total=total, read=total, failed=failed, rate=rate)
        if running and rate:
            row["eta_s"] = max(0, total - done) / rate
        return row, batches

    def failed_items(self, run_id: str, node: str | None, skip: int, limit: int) -> dict[str, Any]:
        """A page of failed items in index order: skip `skip` failures, then up to `limit`; `more` says
        whether another follows. Rows are streamed (a chunk at a time) and the stream is left after the page."""
        from scheduler.datasets import reading

        record, runs = lookup.find_run(run_id)
        page: dict[str, Any] = {"node": node, "skip": skip, "limit": limit, "items": [], "more": False, "note": None}
        if record.dataset is not None:
            page["node"] = "records"
            rows = reading.rows(record, done_only=True, is_final=lambda: True)
        else:
            if not node:
                page["note"] = "choose a batch node"
                return page
            try:
                rows = runs.batch_rows(run_id, node)
            except LookupError:
                still = record.status not in FINAL and node == record.node
                page["note"] = "its failed items are listed once the batch ends" if still else "no batch results"
                return page
        failures = (row for row in rows if row["error"])
        found = list(itertools.islice(failures, skip, skip + limit + 1))
        failures.close()
        with contextlib.suppress(AttributeError):
            rows.close()  # type: ignore[union-attr]  # let go of the store at once, not at garbage collection
        page["more"] = len(found) > limit
        page["items"] = [{"index": r["index"], "error": str(r["error"])[:ERROR_CHARS]} for r in found[:limit]]
        return page
