"""The repair flow: a supervisor flow of PocketFlow nodes, and `repair`, which runs it.

    ErrorAnalyzer -> RepairGenerator -generated-> StaticValidator -valid-> RuntimeExecutor -success-> ResultPreparation
                     |  ^  unrepairable               |  invalid                 |  failed (-> ErrorAnalyzer)
                     |  +-----------------------------+                          |  max_attempts
                     +-- unrepairable (also from ErrorAnalyzer), max_attempts ---+--> ResultPreparation

At most `max_attempts` proposals; a failure that is not a workflow mistake ends it at once, with none;
the same error twice ends it.
"""

from __future__ import annotations

from typing import Any

from pocketflow import Flow

from scheduler.repair.failure import Failure
from scheduler.repair.generators import Generator, generator_named
from scheduler.repair.nodes import (
    ErrorAnalyzer,
    Notify,
    RepairGenerator,
    ResultPreparation,
    RuntimeExecutor,
    StaticValidator,
    quiet,
)
from scheduler.repair.outcome import RepairOutcome
from scheduler.repair.runner import Runner

#: Proposals a repair makes at most.
MAX_ATTEMPTS = 3


def create_repair_flow(
    generator: Generator, runner: Runner, max_attempts: int = MAX_ATTEMPTS, notify: Notify = quiet
) -> Flow:
    error_analyzer = ErrorAnalyzer(notify)
    repair_generator = RepairGenerator(generator, runner, notify)
    static_validator = StaticValidator(max_attempts, notify)
    runtime_executor = RuntimeExecutor(runner, max_attempts, notify)
    result_preparation = ResultPreparation()

    error_analyzer >> repair_generator
    error_analyzer - "unrepairable" >> result_preparation

    repair_generator - "generated" >> static_validator
    repair_generator - "unrepairable" >> result_preparation

    static_validator - "valid" >> runtime_executor
    static_validator - "invalid" >> repair_generator
    static_validator - "max_attempts" >> result_preparation

    runtime_executor - "success" >> result_preparation
    runtime_executor - "failed" >> error_analyzer
    runtime_executor - "max_attempts" >> result_preparation
    return Flow(start=error_analyzer)


def repair(
    workflow: dict[str, Any],
    failure: Failure,
    *,
    runner: Runner | None = None,
    generator: Generator | str | None = None,
    max_attempts: int = MAX_ATTEMPTS,
    notify: Notify = quiet,
) -> RepairOutcome:
    """Repair `workflow` (IR, wire JSON) after `failure` and run it (resuming the failed run when there is
    one); the outcome says whether it worked. `generator`: an object or a registered name."""
    chosen = generator if generator is not None and not isinstance(generator, str) else generator_named(generator)
    shared: dict[str, Any] = {"original": workflow, "workflow": workflow, "failure": failure, "first_failure": failure}
    create_repair_flow(chosen, runner or Runner(), max_attempts, notify).run(shared)
    return shared["outcome"]
