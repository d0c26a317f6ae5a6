"""ItemOutcome: what one batch item produced, in a compact form that travels from workers."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from worker import redact
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
    def raised(cls, index: int, item: Any, exc: BaseException, secrets: Collection[str] = ()) -> ItemOutcome:
        """An item that raised. Its message, its exception and its copy of the item are masked: `secrets`
        (the node's secret param values), URL credentials and secret-named values (worker/redact.py)."""
        redact.remember(secrets)
        kind = type(exc)
        shown = redact.scrub_exception(exc, secrets)
        error = redact.mask(str(exc), secrets) or kind.__name__
        return cls(index, None, error, kind.__name__, redact.mask_value(item, secrets), None, kind.__module__, shown)

    @classmethod
    def failed(
        cls,
        index: int,
        namespace: Any,
        error: str,
        item: Any,
        appended: dict[str, list] | None,
        secrets: Collection[str] = (),
    ) -> ItemOutcome:
        """An item that failed without raising (`failure_of`), masked like `raised`: the error, the item,
        and the error strings its namespace keeps (`error`, values starting with "Error:")."""
        redact.remember(secrets)
        shown = redact.mask_value(item, secrets)
        return cls(index, _masked_errors(namespace, secrets), redact.mask(error, secrets), None, shown, appended)


def _masked_errors(namespace: Any, secrets: Collection[str]) -> Any:
    if not isinstance(namespace, dict):
        return namespace
    for key, value in namespace.items():
        if key == "error" and isinstance(value, dict):
            namespace[key] = type(value)({k: redact.mask_value(v, secrets) for k, v in value.items()})
        elif isinstance(value, str) and (key == "error" or value.startswith("Error:")):
            namespace[key] = redact.mask(value, secrets)
    return namespace


def failure_of(action: Any, namespace: Any) -> str | None:
    """Why an item that did not raise still failed, or None (docs/ARCHITECTURE.md, the batch contract)."""
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
