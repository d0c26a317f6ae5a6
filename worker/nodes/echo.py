"""`echo` and `noop`: the smallest node types, for wiring, examples and benchmarks."""

from __future__ import annotations

from typing import Any

from pocketflow import Node

from worker.nodes.params import ANY, Param
from worker.nodes.registry import register


@register("echo")
class EchoNode(Node):
    """Writes each of its params into its namespace unchanged (`${...}` already resolved)."""

    PARAMS = {ANY: Param("any params; each is written to the namespace under the same key")}

    def prep(self, shared: Any) -> dict[str, Any]:
        return dict(self.params)

    def exec(self, prep_res: dict[str, Any]) -> dict[str, Any]:
        return prep_res

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        for key, value in exec_res.items():
            shared[key] = value
        return "default"


@register("noop")
class NoopNode(Node):
    """Does nothing and writes nothing: measures the engine's own per-item cost."""

    PARAMS: dict[str, Param] = {}
