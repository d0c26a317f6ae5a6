"""What went wrong with a run, as the repair flow sees it, and whether a repair of the workflow can help.

A repair changes the workflow, so only a mistake in the workflow is repairable: a workflow that does not
validate, a template pointing at a key that is not there (misspelt key or node id), an unknown node type,
a param name the node type does not declare. Everything else fails at once, with no attempt: an unhandled
`error` action (a failing shell command, an HTTP 500: the world said no), a node that raised from its own
logic, a step limit, a lost backend.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any

from worker.nodes import registry

#: Exception types that say the workflow itself is wrong.
WORKFLOW_MISTAKES = ("ValidationError", "TemplateError", "NodeTypeError")
#: The kind of a run that ended on an unhandled `error` action.
ERROR_ACTION = "error action"
_AVAILABLE = re.compile(r"\(available keys: ([^)]*)\)")
_MISSING_PATH = re.compile(r"cannot resolve (\$\{[^}]*\}): '([^']*)' not found")
_NODE = re.compile(r"^node '([^']+)'")
_KIND = re.compile(r"^([A-Za-z_][\w.]*): ")


@dataclass
class Failure:
    """One failure of a run: its error line, its kind (the exception type, or `error action`), the node,
    and the run whose checkpoint a repair resumes (None when the run never started: a validation error)."""

    error: str
    kind: str
    node: str | None = None
    run_id: str | None = None
    problems: list[str] = field(default_factory=list)  # a ValidationError's problems
    exception: BaseException | None = field(default=None, compare=False, repr=False)  # re-raised if unrepaired
    result: Any = field(default=None, compare=False, repr=False)  # the failed RunResult (an `error` action)

    @classmethod
    def from_exception(cls, exc: BaseException, run_id: str | None = None, node: str | None = None) -> Failure:
        kind = type(exc).__name__
        message = str(exc)
        if kind == "RemoteError" and (found := _KIND.match(message)):  # a worker's exception of another type
            kind, message = found.group(1).rsplit(".", 1)[-1], message[found.end() :]
        problems = list(getattr(exc, "problems", None) or [])
        node = node or _node_in(message)
        return cls(f"{kind}: {message}", kind, node, run_id, problems, exc)

    @classmethod
    def from_error_line(cls, error: str, run_id: str | None, node: str | None) -> Failure:
        """From a run record's error line (`TemplateError: ...`, or `node 'x' returned 'error': ...`)."""
        if " returned 'error'" in error and error.startswith("node '"):
            return cls(error, ERROR_ACTION, node or _node_in(error), run_id)
        found = _KIND.match(error)
        kind = found.group(1).rsplit(".", 1)[-1] if found else "Error"
        return cls(error, kind, node or _node_in(error[found.end() :] if found else error), run_id)

    @property
    def signature(self) -> tuple[str, str | None, str]:
        """What makes two failures the same error (the loop stops on the second)."""
        return (self.kind, self.node, self.error)

    @property
    def available_keys(self) -> list[str]:
        """The keys the error lists as available where a template failed."""
        found = _AVAILABLE.search(self.error)
        return [k.strip() for k in found.group(1).split(",") if k.strip() and k.strip() != "none"] if found else []

    @property
    def missing(self) -> tuple[str, str] | None:
        """(template text, path) of the reference that did not resolve, when that is the error."""
        found = _MISSING_PATH.search(self.error)
        return (found.group(1), found.group(2)) if found else None


def _node_in(message: str) -> str | None:
    found = _NODE.match(message.strip())
    return found.group(1) if found else None


def diagnose(failure: Failure, workflow: dict[str, Any]) -> str | None:
    """None when a repair of `workflow` can help with `failure`, else why not (one line)."""
    if failure.kind in WORKFLOW_MISTAKES:
        return None
    if failure.kind == ERROR_ACTION:
        return f"{failure.error}: the node ran and reported an error (not a mistake in the workflow)"
    node = next((n for n in workflow.get("nodes", []) if n.get("id") == failure.node), None)
    misspelt = undeclared_params(node) if node is not None else {}
    if any(f"'{declared}'" in failure.error for declared in misspelt.values()):  # "param 'command' is required"
        return None
    where = f"node '{failure.node}'" if failure.node else "the run"
    return f"{failure.error}: {where} raised from its own logic (not a mistake in the workflow)"


#: Names longer than this are not matched (difflib is quadratic in the length).
MAX_MATCHED = 200


def closest(name: Any, candidates: Any) -> str | None:
    """The candidate `name` is most likely a misspelling of ("did you mean"), or None."""
    if not isinstance(name, str) or len(name) > MAX_MATCHED:
        return None
    found = difflib.get_close_matches(name, [c for c in candidates if isinstance(c, str)], n=1, cutoff=0.6)
    return found[0] if found else None


def declared_params(node_type: str) -> list[str] | None:
    """The params a node type declares (`PARAMS`), or None when it declares none or takes any (`*`)."""
    try:
        declared = getattr(registry.get(node_type), "PARAMS", None)
    except Exception:
        return None
    return None if not declared or "*" in declared else list(declared)


def undeclared_params(node: dict[str, Any]) -> dict[str, str]:
    """The node's param names its type does not declare, each with the declared name it is closest to."""
    declared = declared_params(str(node.get("type")))
    if declared is None:
        return {}
    params = node.get("params") or {}
    free = [name for name in declared if name not in params]
    found = {}
    for name in params:
        if name not in declared and (close := closest(name, free)):
            found[name] = close
            free.remove(close)
    return found
