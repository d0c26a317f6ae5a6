"""Builders for the event dicts (docs/ARCHITECTURE.md, events), so every producer spells them the same way."""

from __future__ import annotations

from typing import Any

from worker import redact


def batch_progress(node: str, index: int, done: int, total: int, ok: bool) -> dict[str, Any]:
    return {"type": "batch_progress", "node": node, "index": index, "done": done, "total": total, "ok": ok}


def state(node: str, store: dict[str, Any]) -> dict[str, Any]:
    return {"type": "state", "node": node, "state": dict(store)}


def error(node: str | None, message: str) -> dict[str, Any]:
    """An `error` event; its message masked (worker/redact.py): events reach terminals and logs."""
    return {"type": "error", "node": node, "error": redact.mask(message)}
