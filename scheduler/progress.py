"""Batch progress as events: an ItemMiddleware for in-process batches."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from worker.executor import ItemMiddleware
from worker.outcome import ItemOutcome


class ProgressEvents(ItemMiddleware):
    """Emits one `batch_progress` event per finished item (thread-safe: parallel batches share it)."""

    def __init__(self, emit: Callable[[dict[str, Any]], None], node_id: str, total: int):
        self.emit, self.node_id, self.total = emit, node_id, total
        self.done = 0
        self.lock = threading.Lock()

    def after_item(self, outcome: ItemOutcome) -> None:
        with self.lock:
            self.done += 1
            done = self.done
        self.emit(
            {
                "type": "batch_progress",
                "node": self.node_id,
                "index": outcome.index,
                "done": done,
                "total": self.total,
                "ok": outcome.error is None,
            }
        )
