"""ItemOutcome: what one batch item produced, in a compact form that travels from workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.node_error import NodeError


@dataclass(slots=True)
class ItemOutcome:
    index: int
    result: Any = None
    error: str | None = None
    exception_type: str | None = None
    item: Any = None  # kept only for failed items (it goes into `errors`)
    appended: dict[str, list] | None = None  # items' appends to accumulator lists, merged in index order
    exception_module: str | None = None  # lets the scheduler re-create a worker's exception type
    exception: BaseException | None = None  # in-process only; never serialized

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_wire(self) -> list[Any]:
        return [
            self.index,
            self.result,
            self.error,
            self.exception_type,
            self.item,
            self.appended,
            self.exception_module,
        ]

    @classmethod
    def from_wire(cls, data: list[Any]) -> ItemOutcome:
        return cls(*data)

    @classmethod
    def raised(cls, index: int, item: Any, exc: BaseException) -> ItemOutcome:
        kind = type(exc)
        return cls(index, None, str(exc) or kind.__name__, kind.__name__, item, None, kind.__module__, exc)


def failure_of(action: Any, namespace: Any) -> str | None:
    """Why an item that did not raise still failed, or None (DESIGN section 3)."""
    if not isinstance(namespace, dict):
        return "node returned action 'error'" if action == "error" else None
    error = namespace.get("error")
    if error:
        return error.get("message", str(error)) if isinstance(error, NodeError) else str(error)
    for value in namespace.values():
        if isinstance(value, str) and value.startswith("Error:"):
            return value
    if action == "error":
        return "node returned action 'error'"
    return None
