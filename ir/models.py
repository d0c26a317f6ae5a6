"""The workflow IR as pydantic models: the single source of truth for shape, defaults and JSON Schema."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ir.templates import is_single_template

IDENTIFIER_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
ITEMS_TEMPLATE_RE = re.compile(r"^\$\{.+\}$")
NODE_ID_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
ERROR_MODES = ("fail_fast", "continue")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=False)


class BatchSpec(_Model):
    """`batch` on a node: run the node once per item of `items` (DESIGN section 3)."""

    items: str | None = Field(None, validate_default=True, description="Template reference to an array")
    as_: str = Field("item", alias="as", validate_default=True, description="Item alias (identifier)")
    error_handling: str = Field("fail_fast", validate_default=True, description="fail_fast or continue")
    parallel: bool = False
    max_concurrent: int | None = Field(None, ge=1, description="Items in flight at once (cluster-wide)")
    max_retries: int = Field(1, ge=1, description="Total attempts per item")
    retry_wait: float = Field(0, ge=0, description="Seconds between attempts")
    chunk_size: int | None = Field(None, ge=1, description="Items per distributed chunk (default: auto)")

    @field_validator("items", mode="before")
    @classmethod
    def _items(cls, value: Any) -> str:
        if value is None:
            raise ValueError("batch.items is required")
        if not isinstance(value, str) or not ITEMS_TEMPLATE_RE.match(value) or not is_single_template(value):
            raise ValueError(f"batch.items must be a template reference, like '${{node.key}}', got {value!r}")
        return value

    @field_validator("as_", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> str:
        if not isinstance(value, str) or not IDENTIFIER_RE.match(value):
            raise ValueError(f"batch.as must be a valid identifier, got {value!r}")
        return value

    @field_validator("error_handling", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> str:
        if value not in ERROR_MODES:
            raise ValueError(f"batch.error_handling must be 'fail_fast' or 'continue', got {value!r}")
        return value

    @property
    def alias(self) -> str:
        return self.as_


class NodeSpec(_Model):
    """One node: a registered type, its params (may hold templates), optional batch and retries."""

    id: str = Field(pattern=NODE_ID_RE.pattern)
    type: str
    params: dict[str, Any] = Field(default_factory=dict)
    batch: BatchSpec | None = None
    max_retries: int = Field(1, ge=1, description="Total attempts of exec() (PocketFlow max_retries)")
    wait: float = Field(0, ge=0, description="Seconds between attempts (PocketFlow wait)")
    purpose: str | None = None

    def wire(self) -> dict[str, Any]:
        """The plain-dict form that travels to workers."""
        return self.model_dump(by_alias=True, exclude_none=True)


class EdgeSpec(_Model):
    from_: str = Field(alias="from")
    to: str
    action: str = "default"


class InputSpec(_Model):
    description: str | None = None
    type: str | None = None
    required: bool = True
    default: Any = None


class OutputSpec(_Model):
    source: str
    description: str | None = None


class Workflow(_Model):
    """A whole workflow. Build it with `ir.load`, which also runs the static checks."""

    ir_version: str = "0.1.0"
    name: str | None = None
    description: str | None = None
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)
    inputs: dict[str, InputSpec] | None = None
    outputs: dict[str, OutputSpec] | None = None
    start_node: str | None = None
    metadata: dict[str, Any] | None = None

    def node(self, node_id: str) -> NodeSpec:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def effective_edges(self) -> list[EdgeSpec]:
        """The edges, or — when none are given — the nodes chained in the order listed."""
        if self.edges or len(self.nodes) < 2:
            return list(self.edges)
        return [EdgeSpec(**{"from": a.id, "to": b.id}) for a, b in zip(self.nodes, self.nodes[1:], strict=False)]

    def start_id(self) -> str:
        if self.start_node:
            return self.start_node
        targets = {e.to for e in self.effective_edges()}
        for node in self.nodes:
            if node.id not in targets:
                return node.id
        return self.nodes[0].id

    def wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


def json_schema() -> dict[str, Any]:
    """JSON Schema of the IR (`chordflow schema`)."""
    return Workflow.model_json_schema(by_alias=True)
