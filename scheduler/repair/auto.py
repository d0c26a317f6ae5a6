"""The `auto` generator, the default: what needs no model first, then the model when one is configured."""

from __future__ import annotations

from typing import Any

from scheduler.repair.deterministic import DeterministicGenerator
from scheduler.repair.generators import RepairRequest, register_generator
from scheduler.repair.llm_generator import LlmGenerator, configured_model


@register_generator("auto")
class AutoGenerator:
    """The deterministic generator; when it has nothing and a model is configured, the model."""

    def generate(self, request: RepairRequest) -> dict[str, Any] | None:
        found = DeterministicGenerator().generate(request)
        if found is None and configured_model():
            return LlmGenerator().generate(request)
        return found
