"""The repair flow: a failed run is diagnosed, its workflow repaired, validated and resumed
from its checkpoint. `repair(workflow, failure, runner=...)` runs it; generators are pluggable.

May import `scheduler`'s api and top-level modules, `worker` and `ir`; never `scheduler.cli` or `scheduler.ops`.
"""

from scheduler.repair import auto, deterministic, llm_generator  # noqa: F401  (the built-in generators register)
from scheduler.repair.failure import Failure, diagnose
from scheduler.repair.flow import MAX_ATTEMPTS, create_repair_flow, repair
from scheduler.repair.generators import Generator, RepairRequest, generator_named, register_generator
from scheduler.repair.outcome import RepairOutcome
from scheduler.repair.runner import Runner

__all__ = [
    "MAX_ATTEMPTS",
    "Failure",
    "Generator",
    "RepairOutcome",
    "RepairRequest",
    "Runner",
    "create_repair_flow",
    "diagnose",
    "generator_named",
    "register_generator",
    "repair",
]
