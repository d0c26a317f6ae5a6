"""Repair generators' vocabulary: the request, the protocol, and the registry they are looked up in.

A generator is an object with `generate(request) -> dict | None`: the whole repaired IR, or None when it
has nothing to propose. Built in: `deterministic` (what needs no model), `llm` (a model through the `llm`
package) and `auto` (deterministic first, then the model when one is configured). A plugin module named in
CHORDFLOW_PLUGINS registers another:

    from scheduler.repair import register_generator

    @register_generator("mine")
    class Mine:
        def generate(self, request): ...

`CHORDFLOW_REPAIR_GENERATOR` (or `--repair-generator`) picks one; the default is `auto`. Generators
import this module and never the reverse: the package's __init__ imports the built-in ones, which registers them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ir.errors import ValidationError
from scheduler.repair.failure import Failure
from worker import settings
from worker.nodes import registry

#: The generator used when neither `--repair-generator` nor CHORDFLOW_REPAIR_GENERATOR names one.
DEFAULT = "auto"

_GENERATORS: dict[str, Callable[[], Generator]] = {}


@dataclass
class RepairRequest:
    """What a generator is asked to repair: the workflow, the failure, and what was there when it failed."""

    workflow: dict[str, Any]  # the IR that failed (wire JSON)
    failure: Failure
    store: dict[str, Any] | None = None  # the run's store at its checkpoint (None: it never started)
    rejected: dict[str, Any] | None = None  # the previous proposal, when static validation refused it
    problems: list[str] = field(default_factory=list)  # why it was refused
    attempt: int = 1

    @property
    def available_keys(self) -> list[str]:
        """The keys available where the failure happened: those the error lists, or the store's top level
        (dunder keys aside), and one level down the path that did not resolve (`n2.label`)."""
        keys = list(self.failure.available_keys) or sorted(k for k in self.store or {} if not k.startswith("__"))
        missing = self.failure.missing
        if missing is not None and self.store is not None:
            parts = missing[1].split(".")
            value: Any = self.store
            for depth, part in enumerate(parts[:-1]):
                value = value.get(part) if isinstance(value, dict) else None
                if isinstance(value, dict):
                    prefix = ".".join(parts[: depth + 1])
                    keys += [f"{prefix}.{k}" for k in value if isinstance(k, str) and f"{prefix}.{k}" not in keys]
        return keys


class Generator(Protocol):
    def generate(self, request: RepairRequest) -> dict[str, Any] | None: ...


def register_generator(name: str) -> Callable[[Callable[[], Generator]], Callable[[], Generator]]:
    """Decorator: make a generator class (or factory taking no arguments) available under `name`."""

    def decorate(factory: Callable[[], Generator]) -> Callable[[], Generator]:
        _GENERATORS[name] = factory
        return factory

    return decorate


def names() -> list[str]:
    registry.load_plugins()
    return sorted(_GENERATORS)


def generator_named(name: str | None = None) -> Generator:
    """The generator `name`, else CHORDFLOW_REPAIR_GENERATOR's, else the default (`auto`)."""
    chosen = name or settings.get("repair_generator") or DEFAULT
    known = names()
    if chosen not in _GENERATORS:
        raise ValidationError(f"repair generator: unknown generator '{chosen}' (choose from {', '.join(known)})")
    return _GENERATORS[chosen]()
