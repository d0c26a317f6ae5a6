"""The repair flow's nodes: each does one thing; their actions route the flow (flow.py).

The flow's shared store: `original` (the IR that failed), `workflow` (the IR the last run used),
`failure` / `first_failure`, `attempts` (proposals made), `seen` (the errors already given to the
generator), `candidate` (the proposal in hand), `rejected` / `problems` (a proposal static validation
refused), `stop` / `status` (why and how it ended), `result` / `cached` (the last run), `outcome`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pocketflow import Node

from ir.errors import NodeTypeError, ValidationError
from scheduler.repair.failure import diagnose
from scheduler.repair.generators import Generator, RepairRequest
from scheduler.repair.outcome import RepairOutcome
from scheduler.repair.runner import Runner
from worker.engine.loader import load

#: Where the flow reports its progress, a line at a time (the CLI prints them).
Notify = Callable[[str], None]


def quiet(line: str) -> None:
    """The default `notify`: repair progress goes nowhere."""


class ErrorAnalyzer(Node):
    """Is the failure a mistake in the workflow? Anything else fails at once, with no attempt."""

    def __init__(self, notify: Notify = quiet):
        super().__init__()
        self.notify = notify

    def prep(self, shared: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return shared["failure"], shared["workflow"]

    def exec(self, prep_res: tuple[Any, dict[str, Any]]) -> str | None:
        failure, workflow = prep_res
        return diagnose(failure, workflow)

    def post(self, shared: dict[str, Any], prep_res: Any, exec_res: str | None) -> str:
        if exec_res is not None:
            shared["stop"], shared["status"] = f"not repairable: {exec_res}", "unrepairable"
            return "unrepairable"
        return "default"


class RepairGenerator(Node):
    """Asks the generator for a repaired workflow. The same error twice, or no proposal, ends the loop."""

    def __init__(self, generator: Generator, runner: Runner, notify: Notify = quiet, max_retries: int = 2):
        super().__init__(max_retries=max_retries)
        self.generator, self.runner, self.notify = generator, runner, notify

    def prep(self, shared: dict[str, Any]) -> dict[str, Any]:
        failure = shared["failure"]
        problems = list(shared.get("problems") or [])
        asked = (failure.signature, tuple(problems))
        request = RepairRequest(
            shared["workflow"], failure, self.runner.store(failure.run_id), shared.get("rejected"), problems,
            shared.get("attempts", 0) + 1,
        )  # fmt: skip
        return {"request": request, "asked": asked, "repeated": asked in shared.setdefault("seen", [])}

    def exec(self, prep_res: dict[str, Any]) -> dict[str, Any] | None:
        if prep_res["repeated"]:
            return None
        return self.generator.generate(prep_res["request"])

    def exec_fallback(self, prep_res: dict[str, Any], exc: Exception) -> Any:
        self.notify(f"repair: the generator failed: {type(exc).__name__}: {exc}")
        return None

    def post(self, shared: dict[str, Any], prep_res: dict[str, Any], exec_res: dict[str, Any] | None) -> str:
        failure = prep_res["request"].failure
        if prep_res["repeated"]:
            shared["stop"], shared["status"] = f"the same error twice: {failure.error}", "unrepairable"
            return "unrepairable"
        if exec_res is None or exec_res == shared["workflow"]:
            shared["stop"], shared["status"] = f"no repair found for: {failure.error}", "unrepairable"
            return "unrepairable"
        shared["seen"].append(prep_res["asked"])
        shared["candidate"] = exec_res
        shared["attempts"] = shared.get("attempts", 0) + 1
        self.notify(f"repair: attempt {shared['attempts']}: {failure.error}")
        return "generated"


class StaticValidator(Node):
    """Validates the proposal as `chordflow validate` would; a refused one goes back to the generator."""

    def __init__(self, max_attempts: int, notify: Notify = quiet):
        super().__init__()
        self.max_attempts, self.notify = max_attempts, notify

    def prep(self, shared: dict[str, Any]) -> dict[str, Any]:
        return shared["candidate"]

    def exec(self, prep_res: dict[str, Any]) -> list[str]:
        try:
            load(prep_res)
        except ValidationError as exc:
            return list(exc.problems)
        except NodeTypeError as exc:
            return [str(exc)]
        return []

    def post(self, shared: dict[str, Any], prep_res: dict[str, Any], exec_res: list[str]) -> str:
        if not exec_res:
            return "valid"
        self.notify(f"repair: proposal {shared['attempts']} does not validate: {exec_res[0]}")
        shared["rejected"], shared["problems"] = prep_res, exec_res
        if shared["attempts"] >= self.max_attempts:
            shared["stop"], shared["status"] = f"{self.max_attempts} attempts, none repaired it", "max_attempts"
            return "max_attempts"
        return "invalid"


class RuntimeExecutor(Node):
    """Runs the proposal: the failed run resumed from its checkpoint under it (no completed node it leaves
    unchanged runs again), or a new run when the failed one never started."""

    def __init__(self, runner: Runner, max_attempts: int, notify: Notify = quiet):
        super().__init__()
        self.runner, self.max_attempts, self.notify = runner, max_attempts, notify

    def prep(self, shared: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        return shared["candidate"], shared["failure"]

    def exec(self, prep_res: tuple[dict[str, Any], Any]) -> Any:
        workflow, failure = prep_res
        return self.runner.run(workflow, failure)

    def post(self, shared: dict[str, Any], prep_res: Any, exec_res: Any) -> str:
        shared["workflow"], shared["cached"] = prep_res[0], exec_res.cached
        shared.pop("rejected", None)
        shared.pop("problems", None)
        if exec_res.failure is None:
            shared["result"], shared["status"] = exec_res.result, "repaired"
            return "success"
        shared["failure"] = exec_res.failure
        self.notify(f"repair: the repaired run failed: {exec_res.failure.error}")
        if shared["attempts"] >= self.max_attempts:
            shared["stop"], shared["status"] = f"{self.max_attempts} attempts, none repaired it", "max_attempts"
            return "max_attempts"
        return "failed"


class ResultPreparation(Node):
    """What the caller gets: the outcome (repaired or not, why, the workflow, the run, the error to report)."""

    def prep(self, shared: dict[str, Any]) -> dict[str, Any]:
        return shared

    def post(self, shared: dict[str, Any], prep_res: Any, exec_res: Any) -> None:
        status = shared.get("status", "unrepairable")
        ran = "cached" in shared  # a proposal ran
        report = shared["first_failure"] if status == "max_attempts" or not ran else shared["failure"]
        shared["outcome"] = RepairOutcome(
            status=status,
            reason=shared.get("stop"),
            original=shared["original"],
            workflow=shared["workflow"],
            attempts=shared.get("attempts", 0),
            failure=None if status == "repaired" else report,
            result=shared.get("result"),
            cached=list(shared.get("cached") or []),
        )
