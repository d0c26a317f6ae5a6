"""Loops in the edge graph: a loop nothing leaves is an error; one that only non-default actions leave, a warning.

PocketFlow follows the edge named by the action a node returns, and an action without an edge ends the
flow. Most nodes return "default", so a loop matters when following "default" keeps a run inside it:
- a loop that no edge leaves, in which every node's "default" edge stays inside, never ends (an error);
- a loop of "default" edges that only non-default actions leave ends only when a node returns one of
  them (a warning: a run may instead go round until its step limit).
A loop that needs a non-default action to go round (`check -"retry"-> fetch`) ends on "default": fine.
"""

from __future__ import annotations

from collections.abc import Iterator

from ir.models import Workflow

#: Longer loops are shown by their first nodes only, so a message stays one readable line.
MAX_SHOWN = 12


def successors(wf: Workflow) -> dict[str, dict[str, str]]:
    """node id -> {action: target} as compiled (`checks.duplicate_actions` rejects two edges for one action)."""
    succ: dict[str, dict[str, str]] = {node.id: {} for node in wf.nodes}
    for edge in wf.effective_edges():
        if edge.from_ in succ:  # a parallel edge's action leads, past the branches, to the fan-in
            succ[edge.from_][edge.action] = edge.fan_in or edge.to if edge.parallel else edge.to
    return succ


def _components(succ: dict[str, dict[str, str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan's algorithm, iterative: long chains need no recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def targets(node: str) -> Iterator[str]:
        return (t for t in succ[node].values() if t in succ)

    for root in succ:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, targets(root))]
        while work:
            node, pending = work[-1]
            for target in pending:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, targets(target)))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    found.append(component)
    return found


def _walk(first: str, members: set[str], succ: dict[str, dict[str, str]]) -> list[str]:
    """The members in the order a run meets them from `first`: "default" edges first, then the others."""
    order: list[str] = []
    seen: set[str] = set()
    stack = [first]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        order.append(node)
        nexts = [t for a, t in succ[node].items() if a != "default" and t in members]
        if succ[node].get("default") in members:
            nexts.insert(0, succ[node]["default"])
        stack.extend(reversed(nexts))
    return order


def _shown(order: list[str]) -> str:
    names = order if len(order) <= MAX_SHOWN else [*order[: MAX_SHOWN - 2], f"... ({len(order)} nodes)"]
    return " -> ".join([*names, order[0]])


def _loops(wf: Workflow) -> Iterator[tuple[list[str], list[tuple[str, str, str]]]]:
    """Each loop that "default" keeps a run in: (its nodes in run order, the edges leaving it)."""
    succ = successors(wf)
    position = {node.id: i for i, node in reversed(list(enumerate(wf.nodes)))}
    if len(position) < len(wf.nodes):
        return  # duplicate ids make the graph ambiguous; they are reported, loops would only follow from them
    for component in _components(succ):
        members = set(component)
        if all(succ[n].get("default") in members for n in members) and not any(
            t not in members for n in members for t in succ[n].values()
        ):
            first = min(members, key=position.__getitem__)
            yield _walk(first, members, succ), []
    # Loops of "default" edges (each node has at most one, so each loop is a simple cycle) with exits.
    done: set[str] = set()
    for start in position:
        path: list[str] = []
        node: str | None = start
        while node in succ and node not in done and node not in path:
            path.append(node)
            node = succ[node].get("default")
        if node in path:
            cycle = path[path.index(node) :]
            members = set(cycle)
            exits = [(n, a, t) for n in cycle for a, t in succ[n].items() if t not in members]
            if exits:
                first = min(cycle, key=position.__getitem__)
                yield _walk(first, members, succ), exits
        done.update(path)


def endless_loops(wf: Workflow) -> Iterator[str]:
    """A loop that no edge leaves and that "default" goes round never ends: an error."""
    for order, exits in _loops(wf):
        if not exits:
            subject = "the node" if len(order) == 1 else "the nodes"
            verb = "forms" if len(order) == 1 else "form"
            yield f"edges: {subject} {_shown(order)} {verb} a loop that nothing leaves"


def loops_left_only_by_actions(wf: Workflow) -> Iterator[str]:
    """A loop of "default" edges that only other actions leave: a warning (it may run until the step limit)."""
    for order, exits in _loops(wf):
        if exits:
            subject = "the node" if len(order) == 1 else "the nodes"
            verb = "forms" if len(order) == 1 else "form"
            ways = ", ".join(f"'{a}' ({n} -> {t})" for n, a, t in exits)
            if len(exits) == 1:
                tail = f"only the action {ways} leaves; a run repeats it until a node returns that action"
            else:
                tail = f"only the actions {ways} leave; a run repeats it until a node returns one of them"
            yield f"edges: {subject} {_shown(order)} {verb} a loop that {tail}"
