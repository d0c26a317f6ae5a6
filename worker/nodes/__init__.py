"""Node types: the registry and the built-in types. `register` is the public decorator.

The registry and params import only `ir`; a node type may import `worker.engine` too (a sub-workflow runs
a flow), never `worker.cluster`."""

from worker.nodes.registry import all_types, get, load_plugins, names, register

# Importing the built-in modules registers their types.
from worker.nodes import echo, files, http, llm, plan, python_call, shell, subworkflow, wait  # noqa: F401  isort: skip

__all__ = ["all_types", "get", "load_plugins", "names", "register"]
