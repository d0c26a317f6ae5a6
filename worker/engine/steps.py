"""The stepper's vocabulary: where a run stands (Cursor), what one step did (Step), where steps are
recorded (Journal). Shared by the stepper, parallel sections and the run stores."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class Suspended(BaseException):  # a control-flow signal, not an error: nodes must not catch it
    """The run hands over and this stretch of driving it ends: a batch or a section's branches went out (their
    merge or join sends the next advance), or it waits (a worker's timer thread sends it: worker/cluster/waits.py)."""


@dataclass
class Cursor:
    """Where a run stands: the next node to execute (None: the flow ended) and how many steps ran."""

    node: str | None
    step: int = 0
    last_action: Any = None


@dataclass
class Step:
    """What one node execution did: its action, the next node, and the top-level keys it changed; with
    `config` and `reads`, the hashes of the node's configuration and of the values it read
    (worker/engine/config_hash.py; "" when unknown), so a resume with an edited workflow knows what still holds."""

    node: str
    action: Any
    next_node: str | None
    changed: dict[str, Any] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    config: str = ""
    reads: str = ""
    created: list[str] = field(default_factory=list)  # changed keys that did not exist before (nothing to undo)


class Journal(Protocol):
    """Where checkpoints go (the embedded store for local runs, Redis for cluster runs)."""

    def checkpoint(self, step: int, result: Step) -> None: ...
