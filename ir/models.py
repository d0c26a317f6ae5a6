"""The workflow IR as pydantic models: the single source of truth for shape, defaults and JSON Schema."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from ir import durations
from ir.errors import shown
from ir.names import is_identifier, name_problem
from ir.templates import is_single_template

ITEMS_TEMPLATE_RE = re.compile(r"^\$\{.+\}$")
ERROR_MODES = ("fail_fast", "continue")
#: The IR versions this code reads; the first is written by default (a missing `ir_version` means it).
IR_VERSIONS = ("0.1.0",)
#: Validation context key: names already reported as invalid, so templates using them are not reported again.
BAD_NAMES = "bad_names"


def _refers_to(text: str, names: Any) -> bool:
    """Whether template text `${...}` starts with one of `names` (a reference to a bad name)."""
    inner = text.strip().removeprefix("${").lstrip()
    return any(inner.startswith(name) and inner[len(name) : len(name) + 1] in (".", "[", "}") for name in names)


def _check_names(value: Any, what: str) -> Any:
    """Keys of `inputs` / `outputs` follow the naming rule; all bad keys are reported in one problem."""
    if isinstance(value, dict):
        problems = [p for key in value if (p := name_problem(what, key))]
        if problems:
            raise ValueError("; ".join(problems))
    return value


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=False, defer_build=True)


class ProviderBatchSpec(_Model):
    """`batch.provider_batch` on an `llm` node: the items' requests go to the provider's batch API (half price,
    answered within hours), and whatever it has not answered by `deadline` runs synchronously."""

    deadline: str | float = Field(
        description=f"How long the provider may take, from when the batch starts: a duration {durations.EXAMPLES}, "
        "or seconds; what it has not answered by then is cancelled and asked synchronously"
    )

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not ((number and value > 0) or (isinstance(value, str) and durations.seconds(value))):
            raise ValueError(
                f"batch.provider_batch.deadline must be a duration {durations.EXAMPLES}, or seconds > 0, "
                f"got {shown(value)}"
            )
        return value

    @property
    def seconds(self) -> float:
        return float(self.deadline) if not isinstance(self.deadline, str) else float(durations.seconds(self.deadline))


class BatchSpec(_Model):
    """`batch` on a node: run the node once per item of `items` (docs/ARCHITECTURE.md, the batch contract)."""

    items: str | None = Field(None, validate_default=True, description="Template reference to an array")
    as_: str = Field("item", alias="as", validate_default=True, description="Item alias (identifier)")
    error_handling: str = Field("fail_fast", validate_default=True, description="fail_fast or continue")
    parallel: bool = False
    max_concurrent: int | None = Field(None, ge=1, description="Items in flight at once (cluster-wide)")
    max_retries: int = Field(1, ge=1, description="Total attempts per item")
    retry_wait: float = Field(0, ge=0, description="Seconds between attempts")
    chunk_size: int | None = Field(None, ge=1, description="Items per distributed chunk (default: auto)")
    tolerated_failure_percent: float | None = Field(
        None, ge=0, le=100, description="continue only: the batch fails once more than this % of its items failed"
    )
    tolerated_failure_count: int | None = Field(
        None, ge=0, description="continue only: the batch fails once more than this many items failed"
    )
    provider_batch: ProviderBatchSpec | None = Field(
        None, description="`llm` nodes only: send the items' requests through the provider's batch API"
    )

    @field_validator("items", mode="before")
    @classmethod
    def _items(cls, value: Any, info: ValidationInfo) -> str:
        if value is None:
            raise ValueError("batch.items is required")
        if not isinstance(value, str) or not ITEMS_TEMPLATE_RE.match(value) or not is_single_template(value):
            if isinstance(value, str) and _refers_to(value, (info.context or {}).get(BAD_NAMES, ())):
                return value  # the bad name is the problem, reported where it is defined
            raise ValueError(f"batch.items must be a template reference, like '${{node.key}}', got {shown(value)}")
        return value

    @field_validator("as_", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> str:
        if not is_identifier(value):
            raise ValueError(f"batch.as must be a valid identifier, got {shown(value)}")
        return value

    @field_validator("error_handling", mode="before")
    @classmethod
    def _mode(cls, value: Any) -> str:
        if value not in ERROR_MODES:
            raise ValueError(f"batch.error_handling must be 'fail_fast' or 'continue', got {shown(value)}")
        return value

    @field_validator("tolerated_failure_percent", mode="before")
    @classmethod
    def _percent(cls, value: Any) -> Any:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (number and 0 <= value <= 100):
            raise ValueError(f"batch.tolerated_failure_percent must be a number from 0 to 100, got {shown(value)}")
        return value

    @field_validator("tolerated_failure_count", mode="before")
    @classmethod
    def _count(cls, value: Any) -> Any:
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise ValueError(f"batch.tolerated_failure_count must be an integer >= 0, got {shown(value)}")
        return value

    @model_validator(mode="after")
    def _thresholds_need_continue(self) -> BatchSpec:
        if self.error_handling != "continue":
            given = [
                f"batch.{name}"
                for name in ("tolerated_failure_percent", "tolerated_failure_count")
                if getattr(self, name) is not None
            ]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} requires error_handling 'continue' "
                    f"(a fail_fast batch tolerates no failure), got {shown(self.error_handling)}"
                )
        return self

    @property
    def alias(self) -> str:
        return self.as_

    @property
    def fail_fast(self) -> bool:
        return self.error_handling == "fail_fast"


class RateLimitSpec(_Model):
    """`rate_limit` on a node: every call of every node naming the same `key` — in any run, on any worker —
    draws from one bucket (docs/ARCHITECTURE.md, rate limits). Two runs declaring different rates for one key
    share the lowest."""

    key: str = Field(min_length=1, max_length=200, description="The bucket's name, shared cluster-wide")
    requests_per_second: float | None = Field(None, gt=0, description="Calls allowed per second")
    requests_per_minute: float | None = Field(None, gt=0, description="Calls allowed per minute")
    burst: int = Field(1, ge=1, description="Calls that may go at once after a quiet spell")
    tokens_per_minute: float | None = Field(
        None, gt=0, description="Tokens per minute, charged with the usage a call reports (llm)"
    )

    @model_validator(mode="after")
    def _one_rate(self) -> RateLimitSpec:
        if self.requests_per_second is not None and self.requests_per_minute is not None:
            raise ValueError("give requests_per_second or requests_per_minute, not both")
        if self.requests_per_second is None and self.requests_per_minute is None and self.tokens_per_minute is None:
            raise ValueError("give requests_per_second, requests_per_minute or tokens_per_minute")
        return self

    @property
    def per_second(self) -> float | None:
        """Calls per second, whichever way the rate was given (None: tokens only)."""
        if self.requests_per_second is not None:
            return self.requests_per_second
        return None if self.requests_per_minute is None else self.requests_per_minute / 60


class NodeSpec(_Model):
    """One node: a registered type, its params (may hold templates), optional batch and retries."""

    id: str = Field(description="Letters (any script), digits, '_' and '-'; not a digit or '-' first")
    type: str
    params: dict[str, Any] = Field(default_factory=dict)
    batch: BatchSpec | None = None
    max_retries: int = Field(1, ge=1, description="Total attempts of exec() (PocketFlow max_retries)")
    wait: float = Field(0, ge=0, description="Seconds between attempts (PocketFlow wait)")
    rate_limit: RateLimitSpec | None = None
    purpose: str | None = None

    @field_validator("id", mode="before")
    @classmethod
    def _id(cls, value: Any) -> str:
        problem = name_problem("node id", value)
        if problem:
            raise ValueError(problem)
        return value

    def wire(self) -> dict[str, Any]:
        """The plain-dict form that travels to workers."""
        return self.model_dump(by_alias=True, exclude_none=True)


class EdgeSpec(_Model):
    """An edge: after `from` returns `action`, run `to`. A parallel edge starts a branch (ir/branches.py):
    every parallel edge of a node and action starts one, and they all meet at the node `fan_in`."""

    from_: str = Field(alias="from")
    to: str
    action: str = "default"
    parallel: bool = False
    fan_in: str | None = Field(None, description="Parallel edges: the node where the branches meet")
    fan_in_error_handling: str | None = Field(
        None, description="Parallel edges: 'continue' (default: the fan-in runs with partial results) or 'fail_fast'"
    )

    @field_validator("fan_in_error_handling", mode="before")
    @classmethod
    def _fan_in_mode(cls, value: Any) -> str | None:
        if value is not None and value not in ERROR_MODES:
            raise ValueError(f"fan_in_error_handling must be 'fail_fast' or 'continue', got {shown(value)}")
        return value


class InputSpec(_Model):
    description: str | None = None
    type: str | None = None
    required: bool = True
    default: Any = None
    given: bool | None = Field(
        None,
        description="set by chordflow in the workflow a run records: an input the run was given that the workflow "
        "did not declare",
    )


class OutputSpec(_Model):
    source: str
    description: str | None = None


#: ir/priorities.py PRIORITIES, as a type.
Priority = Literal["high", "normal", "low"]


class Budget(_Model):
    """`budget` on a workflow: caps on what the run's model calls may bill, on every worker together."""

    tokens: int | None = Field(None, ge=1, description="most tokens (input + output) the run's model calls may bill")
    usd: float | None = Field(None, gt=0, description="most USD they may cost (priced by CHORDFLOW_LLM_PRICES)")

    @model_validator(mode="after")
    def _some(self) -> Budget:
        if self.tokens is None and self.usd is None:
            raise ValueError("give tokens, usd or both")
        return self


class Workflow(_Model):
    """A whole workflow. Build it with `ir.load`, which also runs the static checks."""

    ir_version: str = Field(
        IR_VERSIONS[0],
        validate_default=True,
        description=f"IR version of this document ({', '.join(IR_VERSIONS)}); omitted means {IR_VERSIONS[0]}",
    )
    name: str | None = None
    description: str | None = None
    nodes: list[NodeSpec] = Field(min_length=1)
    edges: list[EdgeSpec] = Field(default_factory=list)
    inputs: dict[str, InputSpec] | None = None
    outputs: dict[str, OutputSpec] | None = None
    start_node: str | None = None
    metadata: dict[str, Any] | None = None
    max_steps: int | None = Field(
        None, ge=1, description="most node executions in one run; default 10,000 or CHORDFLOW_MAX_STEPS"
    )
    priority: Priority | None = Field(
        None, description="on a cluster: high runs' chunks go before normal ones, normal before low; omitted: normal"
    )
    budget: Budget | None = Field(None, description="caps on the tokens and USD the run's model calls may bill")
    cache: str | None = Field(
        None,
        description=f"`cache` of every node that takes one and sets none (llm): reuse an identical request's answer "
        f"from any run within this long ({durations.EXAMPLES})",
    )

    #: What `ir.load` found suspicious but valid (e.g. a loop left only by a non-default action).
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @field_validator("ir_version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> str:
        known = ", ".join(IR_VERSIONS)
        if not isinstance(value, str):
            raise ValueError(f"must be a version string like '{IR_VERSIONS[0]}', got {type(value).__name__}")
        if value not in IR_VERSIONS:
            raise ValueError(f"unknown version {shown(value, 40)} (this chordflow reads {known})")
        return value

    @field_validator("cache")
    @classmethod
    def _cache(cls, value: str | None) -> str | None:
        if value is not None and durations.seconds(value) is None:
            raise ValueError(f"must be a duration {durations.EXAMPLES}, got {shown(value, 40)}")
        return value

    @field_validator("inputs", mode="before")
    @classmethod
    def _input_names(cls, value: Any) -> Any:
        return _check_names(value, "input name")

    @field_validator("outputs", mode="before")
    @classmethod
    def _output_names(cls, value: Any) -> Any:
        return _check_names(value, "output name")

    @property
    def declares_inputs(self) -> bool:
        """Whether the workflow's author declared its inputs (then a name it does not declare is unknown). Inputs a
        run was given, declared by `ir.load` in a workflow that declared none (`given`), do not count."""
        inputs = self.inputs
        return inputs is not None and not (inputs and all(spec.given for spec in inputs.values()))

    @property
    def warnings(self) -> list[str]:
        """Warnings from `ir.load` (never serialized): print them, the workflow still runs."""
        return self._warnings

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
