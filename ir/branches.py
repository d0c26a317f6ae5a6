"""Parallel sections: a node's parallel edges start branches that meet at one fan-in node.

`{"from": "start", "to": "a", "parallel": true, "fan_in": "merge"}`, one edge per branch: after `start`
returns the edges' action, every branch runs — the chain of nodes from its first node, following ordinary
edges, up to the fan-in — and then the fan-in runs with what they wrote. A section is known by its id
`<fork>:parallel` (a node id cannot hold ':'), which is where a run's cursor stands while its branches run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ir.errors import shown

if TYPE_CHECKING:  # a hint only: `wait` and `status` import this module and need no pydantic
    from ir.models import Workflow

SUFFIX = ":parallel"


@dataclass(frozen=True)
class Section:
    fork: str
    action: str
    fan_in: str
    branches: tuple[str, ...]  # each branch's first node, in declaration order
    members: dict[str, frozenset[str]]  # branch -> the nodes it may run
    fail_fast: bool = False

    @property
    def node_id(self) -> str:
        """Where a run's cursor stands while the branches run (also what `get_next_node` hands the stepper)."""
        return self.fork + SUFFIX

    def branch_of(self, node_id: str) -> str | None:
        return next((b for b, nodes in self.members.items() if node_id in nodes), None)


def is_section(node_id: str | None) -> bool:
    return node_id is not None and node_id.endswith(SUFFIX)


def _ordinary(wf: Workflow) -> dict[str, set[str]]:
    succ: dict[str, set[str]] = {n.id: set() for n in wf.nodes}
    for edge in wf.effective_edges():
        if not edge.parallel and edge.from_ in succ and edge.to in succ:
            succ[edge.from_].add(edge.to)
    return succ


def _members(first: str, fan_in: str, succ: dict[str, set[str]]) -> tuple[frozenset[str], bool]:
    """The nodes reachable from `first` by ordinary edges without passing the fan-in; whether it is reached."""
    seen, stack, reached = set(), [first], False
    while stack:
        node = stack.pop()
        if node == fan_in:
            reached = True
            continue
        if node in seen or node not in succ:
            continue
        seen.add(node)
        stack.extend(succ[node])
    return frozenset(seen), reached


def sections(wf: Workflow) -> list[Section]:
    """The workflow's parallel sections (assumes `parallel_problems` found nothing)."""
    grouped: dict[tuple[str, str], list] = {}
    for edge in wf.effective_edges():
        if edge.parallel:
            grouped.setdefault((edge.from_, edge.action), []).append(edge)
    succ = _ordinary(wf)
    found = []
    for (fork, action), edges in grouped.items():
        fan_in = edges[0].fan_in or ""
        branches = tuple(e.to for e in edges)
        members = {b: _members(b, fan_in, succ)[0] for b in branches}
        fail_fast = any(e.fan_in_error_handling == "fail_fast" for e in edges)
        found.append(Section(fork, action, fan_in, branches, members, fail_fast))
    return found


def parallel_problems(wf: Workflow) -> Iterator[str]:
    """Static checks of parallel edges, reported with the other validation problems."""
    ids = {n.id for n in wf.nodes}
    grouped: dict[tuple[str, str], list[tuple[int, object]]] = {}
    for i, edge in enumerate(wf.edges):
        if not edge.parallel:
            if edge.fan_in is not None or edge.fan_in_error_handling is not None:
                yield f'edges[{i}]: fan_in and fan_in_error_handling belong on parallel edges ("parallel": true)'
            continue
        if edge.fan_in is None:
            yield f'edges[{i}]: a parallel edge needs "fan_in", the node where its branches meet'
        elif edge.fan_in not in ids:
            yield f"edges[{i}].fan_in: unknown node {shown(edge.fan_in)}"
        grouped.setdefault((edge.from_, edge.action), []).append((i, edge))
    ordinary = {(e.from_, e.action): i for i, e in enumerate(wf.edges) if not e.parallel}
    succ = _ordinary(wf)
    claimed: dict[str, str] = {}  # node -> the branch (first node) it belongs to
    for (fork, action), edges in grouped.items():
        first_i, first = edges[0]
        fan_ins = sorted({e.fan_in for _, e in edges if e.fan_in})
        if len(fan_ins) > 1:
            yield f"edges[{first_i}]: parallel edges from {shown(fork)} name different fan-ins ({', '.join(fan_ins)})"
            continue
        modes = {e.fan_in_error_handling or "continue" for _, e in edges}
        if len(modes) > 1:
            yield f"edges[{first_i}]: parallel edges from {shown(fork)} disagree on fan_in_error_handling"
        if (fork, action) in ordinary:
            yield (
                f"edges[{ordinary[(fork, action)]}]: node {shown(fork)} has parallel edges for action "
                f"{shown(action)}; an ordinary edge for the same action is ambiguous"
            )
        fan_in = first.fan_in
        if not fan_ins or fan_in not in ids:
            continue
        for i, edge in edges:
            if edge.to not in ids:
                continue
            nodes, reached = _members(edge.to, fan_in, succ)
            if not reached:
                yield f"edges[{i}]: branch {shown(edge.to)} never reaches its fan-in {shown(fan_in)}"
            if fork in nodes:
                yield f"edges[{i}]: branch {shown(edge.to)} leads back to {shown(fork)}, where it started"
            for node in sorted(nodes):
                other = claimed.setdefault(node, edge.to)
                if other != edge.to:
                    yield f"edges[{i}]: branch {shown(edge.to)} reaches node {shown(node)} of branch {shown(other)}"
                    break
            nested = sorted(n for n in nodes if any(key[0] == n for key in grouped))
            if nested:
                yield (
                    f"edges[{i}]: branch {shown(edge.to)} holds parallel edges of its own (from {shown(nested[0])}): "
                    "nested parallel sections are not supported"
                )
