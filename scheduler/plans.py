"""Plans: many independent states, one list of tool calls, compiled to ONE IR workflow.

A plan is `{"context": [{"_uid", "type": "state", "state": {...}}...], "calls": [{"_tool", "_uid",
"_outputPath", <params>}...]}`. `_tool` is a node type, the other keys not starting with `_` are its params;
a param `"†state.a.b"` reads path `a.b` of the call's own state, and the tool's output (its namespace, or
the single value of a one-key namespace) is written at `_outputPath` of that state. A call without `_uid`
is a template: it applies to every state.

Per state, a call depends on the calls that write what it reads (or overwrite what it reads, or write the
same path earlier); the calls are levelled (a call runs one level after the last call it depends on) and
the calls of one level and one tool, across all states, become ONE batch node (one batch of chunk tasks on the cluster)
between a `plan-gather` and a `plan-scatter` node (worker/nodes/plan.py). The states travel in the store
under `__states__`; the workflow's output `states` is the final states by `_uid`.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import Any

from ir import limits
from ir.errors import RunCancelled, ValidationError, shown
from ir.models import IR_VERSIONS
from ir.names import is_name
from ir.templates import compile_value
from worker.nodes import plan as paths
from worker.nodes import registry
from worker.nodes.plan import STATES_KEY, Path

#: The workflow input holding the plan's calls as given (gather and scatter nodes read them by index).
PLAN_INPUT = "plan"
#: The batch alias of a call's item (`${call.text}`).
ALIAS = "call"
#: The meta-parameters of a call; any other key starting with `_` is a mistake.
META = ("_tool", "_uid", "_outputPath")
#: The node types the compiler puts around the tools: not tools themselves.
PLAN_NODE_TYPES = ("plan-gather", "plan-scatter")
#: The most _uids named in one message.
MAX_NAMED = 3


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call on one state: a call of the plan, or a template call applied to one `_uid`."""

    index: int  # the call's position in the plan's `calls`
    uid: str
    tool: str
    output: Path
    params: dict[str, Any]  # the inline params, meta-parameters left out
    reads: tuple[tuple[str, Path], ...]  # (where in the params, state path)

    @property
    def short(self) -> str:
        return f"calls[{self.index}]"


@dataclass
class Batch:
    """The calls of one level and one tool (and one set of param names): one batch node."""

    level: int
    tool: str
    calls: list[Call] = field(default_factory=list)


@dataclass
class Plan:
    """A checked plan, ready to compile."""

    states: dict[str, Any]  # by _uid, in context order
    calls: list[dict[str, Any]]  # as given
    batches: list[Batch]  # in run order


# -- reading -------------------------------------------------------------------------------------------------


def _read(source: Any) -> tuple[Any, str | None]:
    """(raw plan, a label naming the file it came from). Every failure is one ValidationError."""
    if isinstance(source, Mapping):
        return dict(source), None
    if isinstance(source, str) and source.lstrip().startswith(("{", "[")):
        return _parse(source, "plan JSON"), None
    if not isinstance(source, str | os.PathLike):
        raise ValidationError(f"cannot read a plan from {type(source).__name__}; pass a dict, JSON text or a path")
    label = os.fspath(source)
    path = FilePath(label)
    try:
        text = path.read_bytes().removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{label}: file not found") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValidationError(f"cannot read {label}: {reason}") from None
    return _parse(text, label), label


def _parse(text: str, label: str) -> Any:
    if limits.json_too_deep_at(text) is not None:
        raise limits.too_deep(label)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"{label}: invalid JSON: {exc}") from None


# -- static checks: each a generator of problems, all reported together ---------------------------------------


def _uid_of(value: Any) -> str | None:
    """A `_uid` as a string (numbers are accepted as their text), None when it cannot be one."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def _state_entries(raw: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(index, entry) of the context messages that are states (other message types are not ours)."""
    for i, entry in enumerate(raw["context"]):
        if not isinstance(entry, Mapping) or entry.get("type", "state") == "state":
            yield i, entry


def shape_problems(raw: Any) -> Iterator[str]:
    if not isinstance(raw, Mapping):
        yield f"a plan must be a JSON object with 'context' and 'calls', got {type(raw).__name__}"
        return
    for key in ("context", "calls"):
        if not isinstance(raw.get(key), list):
            yield f"{key}: is required (a list)" if key not in raw else f"{key}: must be a list"
        elif not raw[key]:
            yield f"{key}: is empty"
    for key in raw:
        if key not in ("context", "calls"):
            yield f"{shown(key)}: unknown field (a plan has 'context' and 'calls')"


def context_problems(raw: dict[str, Any]) -> Iterator[str]:
    seen: dict[str, int] = {}
    entries = 0
    for i, entry in _state_entries(raw):
        entries += 1
        where = f"context[{i}]"
        if not isinstance(entry, Mapping):
            yield f"{where}: must be an object like {{'_uid': '①', 'type': 'state', 'state': {{...}}}}"
            continue
        uid = _uid_of(entry.get("_uid"))
        if uid is None:
            yield f"{where}._uid: is required (a non-empty string)"
        elif uid in seen:
            yield f"{where}._uid: duplicate _uid {shown(uid)} (first used by context[{seen[uid]}])"
        else:
            seen[uid] = i
        if not isinstance(entry.get("state"), Mapping):
            yield f"{where}.state: must be an object, got {type(entry.get('state')).__name__}"
    if not entries:
        yield "context: holds no state (an entry like {'_uid': '①', 'type': 'state', 'state': {...}})"


def _did_you_mean(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1) if len(name) < 200 else []
    return f" (did you mean {shown(close[0])}?)" if close else ""


def call_problems(raw: dict[str, Any], uids: list[str], tools: list[str]) -> Iterator[str]:
    for i, call in enumerate(raw["calls"]):
        where = f"calls[{i}]"
        if not isinstance(call, Mapping):
            yield f"{where}: must be an object like {{'_tool': ..., '_uid': ..., '_outputPath': ..., <params>}}"
            continue
        tool = call.get("_tool")
        if not isinstance(tool, str) or not tool:
            yield f"{where}._tool: is required (a node type)"
        elif tool not in tools:
            hint = _did_you_mean(tool, tools) or " (`chordflow nodes` lists the node types)"
            yield f"{where}._tool: unknown tool {shown(tool)}{hint}"
        if "_uid" in call:
            uid = _uid_of(call["_uid"])
            if uid is None:
                yield f"{where}._uid: must be a non-empty string, got {shown(call['_uid'])}"
            elif uid not in uids:
                known = ", ".join(map(shown, uids[:MAX_NAMED])) + (", ..." if len(uids) > MAX_NAMED else "")
                yield f"{where}._uid: unknown _uid {shown(uid)} (the context has {known})"
        output = call.get("_outputPath")
        if not isinstance(output, str):
            yield f"{where}._outputPath: is required (a path in the state, like 'sentiment' or 'a.b')"
        else:
            try:
                paths.parse_path(output)
            except ValueError as exc:
                yield f"{where}._outputPath: {exc}"
        for key, value in call.items():
            if not isinstance(key, str):
                yield f"{where}: param names must be strings, got {shown(key)}"
            elif key.startswith("_") and key not in META:
                yield f"{where}.{key}: unknown meta-parameter (a call has {', '.join(META)})"
            elif not key.startswith("_"):
                try:
                    list(paths.references(value, key))
                except ValueError as exc:
                    yield f"{where}.{key}: {exc}"


# -- the calls of each state, their dependencies, their levels ------------------------------------------------


def calls_by_uid(raw: dict[str, Any], uids: list[str]) -> dict[str, list[Call]]:
    """The calls that apply to each `_uid` (its own and the template calls), in plan order."""
    found: dict[str, list[Call]] = {uid: [] for uid in uids}
    for i, call in enumerate(raw["calls"]):
        params = {k: v for k, v in call.items() if not k.startswith("_")}
        reads = tuple(r for key, value in params.items() for r in paths.references(value, key))
        output = paths.parse_path(call["_outputPath"])
        for uid in [str(_uid_of(call["_uid"]))] if "_uid" in call else uids:
            found[uid].append(Call(i, uid, call["_tool"], output, params, reads))
    return found


def _overlap(a: Path, b: Path) -> bool:
    """Whether writing one path changes what the other holds (equal, or one inside the other)."""
    n = min(len(a), len(b))
    return all(str(x) == str(y) for x, y in zip(a[:n], b[:n], strict=True))


@dataclass
class _Missing:
    """A read that nothing provides: `where` of call `index` reads `path`, for these _uids."""

    index: int
    where: str
    path: Path
    uids: list[str] = field(default_factory=list)


def dependencies(calls: list[Call], state: Any) -> tuple[list[dict[int, str]], list[tuple[int, str, Path]]]:
    """For each call (by position), the positions it must run after, each with the reason; and the reads
    that nothing provides, as (position, where, path).

    - A read of p runs after every earlier call writing p (or a path inside or around p); with none, it
      reads the initial state when p is there, else the first LATER call writing p (plans may list a
      call before the one it needs). Nothing at all: the read is reported.
    - Writes to overlapping paths keep plan order, and a write runs after the earlier reads it would change.
    """
    deps: list[dict[int, str]] = [{} for _ in calls]
    missing: list[tuple[int, str, Path]] = []
    for j, call in enumerate(calls):
        for where, path in call.reads:
            sources = [k for k in range(j) if _overlap(calls[k].output, path)]
            if not sources and not paths.has(state, path):
                sources = [k for k in range(j + 1, len(calls)) if _overlap(calls[k].output, path)][:1]
                if not sources:
                    missing.append((j, where, path))
            for k in sources:
                deps[j].setdefault(k, f"{call.short} reads {paths.shown_path(path)} written by {calls[k].short}")
    for j, call in enumerate(calls):
        for k in range(j):
            if _overlap(calls[k].output, call.output):
                deps[j].setdefault(k, f"{call.short} writes {paths.shown_path(call.output)} after {calls[k].short}")
            elif j not in deps[k] and any(_overlap(p, call.output) for _, p in calls[k].reads):
                deps[j].setdefault(k, f"{call.short} overwrites what {calls[k].short} reads")
    return deps, missing


def levels(deps: list[dict[int, str]]) -> tuple[list[int], list[int] | None]:
    """(the level of each call, None), a call's level being one more than the highest of its deps; or
    ([], a cycle) when some calls wait on each other."""
    level: dict[int, int] = {}
    waiting = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in deps]
    for j, d in enumerate(deps):
        for k in d:
            users[k].append(j)
    ready = [j for j, n in enumerate(waiting) if n == 0]
    while ready:
        j = ready.pop()
        level[j] = max((level[k] + 1 for k in deps[j]), default=0)
        for user in users[j]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if len(level) == len(deps):
        return [level[j] for j in range(len(deps))], None
    return [], _cycle(deps, [j for j in range(len(deps)) if j not in level])


def _cycle(deps: list[dict[int, str]], stuck: list[int]) -> list[int]:
    """A cycle among the calls that never became ready (each waits on another stuck call)."""
    stuck_set = set(stuck)
    order: list[int] = []
    j = stuck[0]
    while j not in order:
        order.append(j)
        j = min(k for k in deps[j] if k in stuck_set)
    return [*order[order.index(j) :], j]


def schedule(raw: dict[str, Any], states: dict[str, Any]) -> tuple[list[Batch], list[str]]:
    """The batches in run order, or the problems found (reads nothing provides, cycles)."""
    missing: dict[tuple[int, str, Path], _Missing] = {}
    cycles: dict[tuple[int, ...], tuple[str, str, int]] = {}
    batches: dict[tuple[int, str, tuple[str, ...]], Batch] = {}
    for uid, calls in calls_by_uid(raw, list(states)).items():
        deps, unread = dependencies(calls, states[uid])
        for j, where, path in unread:
            key = (calls[j].index, where, path)
            missing.setdefault(key, _Missing(*key)).uids.append(uid)
        found, cycle = levels(deps)
        if cycle is not None:
            reasons = "; ".join(deps[b][a] for a, b in zip(cycle[1:], cycle, strict=False))
            signature = tuple(calls[j].index for j in cycle)
            first_uid, message, count = cycles.get(signature, (uid, reasons, 0))
            cycles[signature] = (first_uid, message, count + 1)
            continue
        for call, level in zip(calls, found, strict=True):
            key = (level, call.tool, tuple(sorted(call.params)))
            batches.setdefault(key, Batch(level, call.tool)).calls.append(call)
    problems = [_missing_problem(m) for m in missing.values()]
    for uid, reasons, count in cycles.values():
        more = f" (and {count - 1} more)" if count > 1 else ""
        problems.append(f"_uid {shown(uid)}{more}: the calls form a cycle: {reasons}")
    ordered = sorted(batches.values(), key=lambda b: (b.level, min(c.index for c in b.calls), b.tool))
    uid_order = {uid: i for i, uid in enumerate(states)}
    for batch in ordered:
        batch.calls.sort(key=lambda c: (c.index, uid_order[c.uid]))
    return ordered, problems


def _missing_problem(m: _Missing) -> str:
    named = ", ".join(map(shown, m.uids[:MAX_NAMED]))
    named += f" and {len(m.uids) - MAX_NAMED} more" if len(m.uids) > MAX_NAMED else ""
    whose = f"the state of _uid {named} does not" if len(m.uids) == 1 else f"the states of _uid {named} do not"
    reference = paths.REF_PREFIX + ("." + paths.path_text(m.path) if m.path else "")
    path = paths.shown_path(m.path)
    return f"calls[{m.index}].{m.where}: {reference}: no call writes {path} and {whose} have it"


# -- loading and compiling ----------------------------------------------------------------------------------


def load_plan(source: Any) -> Plan:
    """Read and check a plan (a dict, JSON text or a path): every problem in one ValidationError."""
    raw, label = _read(source)
    problems = list(shape_problems(raw)) or list(context_problems(raw))
    if problems:
        raise ValidationError(problems, source=label)
    states = {str(_uid_of(entry["_uid"])): entry["state"] for _, entry in _state_entries(raw)}
    tools = [name for name in registry.names() if name not in PLAN_NODE_TYPES]
    problems = list(call_problems(raw, list(states), tools))
    if not problems:
        batches, problems = schedule(raw, states)
    if problems:
        raise ValidationError(problems, source=label)
    return Plan(states, list(raw["calls"]), batches)


def _node_name(tool: str) -> str:
    """A tool name as the start of a node id (letters, digits, '_' and '-')."""
    name = "".join(c if c.isalnum() or c in "_-" else "-" for c in tool)
    return name if is_name(name) else "tool"


def _same(values: list[Any]) -> bool:
    first = json.dumps(values[0], sort_keys=True, default=repr)
    return all(json.dumps(v, sort_keys=True, default=repr) == first for v in values[1:])


def _count(n: int, noun: str, plural: str | None = None) -> str:
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def _batch_nodes(batch: Batch, number: int) -> list[dict[str, Any]]:
    """gather -> the tool as a batch node -> scatter, for one batch of calls.

    A param with the same literal value in every call is written in the batch node's params (so the tool's
    own static checks see it); the others travel in the items and are read as `${call.<key>}`. A literal
    that looks like a `${...}` template always travels in the items: the batch node would resolve it.
    """
    node = f"{_node_name(batch.tool)}-{number}"
    gather, scatter = f"{node}-gather", f"{node}-scatter"
    pairs = [[call.index, call.uid] for call in batch.calls]
    constants: dict[str, Any] = {}
    keys: dict[str, str] = {}
    for position, name in enumerate(batch.calls[0].params):
        values = [call.params[name] for call in batch.calls]
        constant = _same(values) and not list(paths.references(values[0], name))
        if constant and compile_value(values[0]).kind == "const":
            constants[name] = values[0]
        else:
            keys[name] = name if is_name(name) else f"_{position}"
    params = {
        name: constants[name] if name in constants else f"${{{ALIAS}.{keys[name]}}}" for name in batch.calls[0].params
    }
    uids = len({call.uid for call in batch.calls})
    what = f"{_count(len(batch.calls), 'call')} of {batch.tool} on {_count(uids, 'state')}"
    states = f"${{{STATES_KEY}}}"
    return [
        {
            "id": gather,
            "type": "plan-gather",
            "purpose": f"items of {what} (level {batch.level + 1})",
            "params": {"plan": f"${{{PLAN_INPUT}}}", "states": states, "calls": pairs, "keys": keys},
        },
        {
            "id": node,
            "type": batch.tool,
            "purpose": what,
            "batch": {"items": f"${{{gather}.items}}", "as": ALIAS, "parallel": True},
            "params": params,
        },
        {
            "id": scatter,
            "type": "plan-scatter",
            "purpose": f"write the outputs of {node} into the states",
            "params": {
                "plan": f"${{{PLAN_INPUT}}}",
                "states": states,
                "calls": pairs,
                "results": f"${{{node}.results}}",
            },
        },
    ]


def compile_plan(plan: Any) -> dict[str, Any]:
    """The IR workflow (a dict `ir.load` accepts) that runs a plan: a dict, JSON text, a path or a Plan.

    The initial states and the plan's calls are the defaults of its inputs `__states__` and `plan`, so the
    workflow runs as it is (`chordflow run`); its output `states` is the final states by `_uid`.
    """
    loaded = plan if isinstance(plan, Plan) else load_plan(plan)
    nodes = [node for number, batch in enumerate(loaded.batches, 1) for node in _batch_nodes(batch, number)]
    calls = sum(len(b.calls) for b in loaded.batches)
    return {
        "ir_version": IR_VERSIONS[0],
        "name": "plan",
        "description": (
            f"A plan of {_count(calls, 'tool call')} on {_count(len(loaded.states), 'state')} in "
            f"{_count(len(loaded.batches), 'batch', 'batches')} (compiled by chordflow plan-to-ir)"
        ),
        "inputs": {
            STATES_KEY: {"description": "The states by _uid", "required": False, "default": loaded.states},
            PLAN_INPUT: {"description": "The plan's calls", "required": False, "default": {"calls": loaded.calls}},
        },
        "nodes": nodes,
        "outputs": {"states": {"source": f"${{{STATES_KEY}}}", "description": "The final states by _uid"}},
        "max_steps": len(nodes),
    }


def run_plan(plan: Any, backend: str = "local", **options: Any) -> dict[str, Any]:
    """Run a plan (a dict, JSON text or a path) and return the final states by `_uid`.

    `options` go to `scheduler.run` (`run_id`, `on_event`, `cancelled`, ...). A tool call that fails
    fails the run with its own exception, as a fail_fast batch does.
    """
    from scheduler.api import run

    result = run(compile_plan(plan), backend=backend, **options)
    if result.status == "cancelled":
        raise RunCancelled(result.error or "run cancelled")
    if result.status != "success":
        raise RuntimeError(f"plan failed: {result.error or result.status}")
    return result.outputs["states"]
