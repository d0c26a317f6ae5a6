"""What a repair ends with: repaired or not, why, the workflow it ran, and what to report."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any

from scheduler.repair.failure import Failure
from worker.runs.record import RunResult


@dataclass
class RepairOutcome:
    """`status`: `repaired` (the repaired run succeeded), `unrepairable` (not a workflow mistake, no
    repair found, or the same error twice) or `max_attempts`. `failure` is what to report when not
    repaired: the original error after `max_attempts`, else the last run's."""

    status: str
    reason: str | None
    original: dict[str, Any]
    workflow: dict[str, Any]  # the IR the last run used (the original when no proposal ran)
    attempts: int = 0
    failure: Failure | None = None
    result: RunResult | None = None  # the repaired run's result
    cached: list[str] = field(default_factory=list)  # nodes the last run took from the checkpoint

    @property
    def repaired(self) -> bool:
        return self.status == "repaired"

    @property
    def changed(self) -> bool:
        return self.workflow != self.original

    def diff(self, name: str = "workflow") -> str:
        """A unified diff of the IR, original to repaired (empty when nothing changed)."""
        before, after = (_lines(self.original), _lines(self.workflow))
        lines = difflib.unified_diff(before, after, f"{name} (original)", f"{name} (repaired)", lineterm="")
        return "\n".join(lines)


def _lines(workflow: dict[str, Any]) -> list[str]:
    return json.dumps(workflow, indent=2, ensure_ascii=False).splitlines()
