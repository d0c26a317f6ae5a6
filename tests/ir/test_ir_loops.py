"""Loops in the edge graph (ir/loops.py): a loop nothing leaves is an error, one left only by actions a warning."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

import ir
from tests.scheduler.cli.test_cli import run_cli
from tests.support import workflow


def _nodes(*ids: str) -> list[dict]:
    return [{"id": node_id, "type": "echo"} for node_id in ids]


def _edge(a: str, b: str, action: str = "default") -> dict:
    return {"from": a, "to": b, "action": action}


def _errors(wf: dict) -> list[str]:
    with pytest.raises(ir.ValidationError) as info:
        ir.load(wf)
    return info.value.problems


def test_two_nodes_pointing_at_each_other_is_an_error() -> None:
    wf = workflow(*_nodes("a", "b"), edges=[_edge("a", "b"), _edge("b", "a")])
    assert _errors(wf) == ["edges: the nodes a -> b -> a form a loop that nothing leaves"]


def test_loop_is_named_in_cycle_order_from_the_first_declared_node() -> None:
    wf = workflow(
        *_nodes("start", "z", "y", "x"), edges=[_edge("start", "x"), _edge("x", "y"), _edge("y", "z"), _edge("z", "x")]
    )
    assert _errors(wf) == ["edges: the nodes z -> x -> y -> z form a loop that nothing leaves"]


def test_self_loop_is_an_error() -> None:
    assert _errors(workflow(*_nodes("a"), edges=[_edge("a", "a")])) == [
        "edges: the node a -> a forms a loop that nothing leaves"
    ]


def test_loop_left_only_by_a_non_default_action_is_a_warning() -> None:
    wf = ir.load(workflow(*_nodes("a", "b", "c"), edges=[_edge("a", "b"), _edge("b", "a"), _edge("b", "c", "done")]))
    assert wf.warnings == [
        "edges: the nodes a -> b -> a form a loop that only the action 'done' (b -> c) leaves; "
        "a run repeats it until a node returns that action"
    ]


def test_loop_with_a_default_exit_is_fine() -> None:
    """fetch -> check -"retry"-> fetch, check -> done: following "default" leaves the loop."""
    wf = ir.load(
        workflow(
            *_nodes("fetch", "check", "done"),
            edges=[_edge("fetch", "check"), _edge("check", "fetch", "retry"), _edge("check", "done")],
        )
    )
    assert wf.warnings == []


def test_loop_that_needs_an_action_to_go_round_ends_on_default() -> None:
    """No edge leaves {b, loop}, but `loop` has no default edge: returning "default" ends the run."""
    wf = ir.load(
        workflow(
            *_nodes("start", "b", "loop"),
            edges=[_edge("start", "b", "done"), _edge("b", "loop"), _edge("loop", "b", "again")],
        )
    )
    assert wf.warnings == []


def test_two_edges_for_one_action_are_an_error_not_a_loop() -> None:
    """PocketFlow keeps one successor per action: a second edge for the same action is refused, not silently kept."""
    problems = _errors(workflow(*_nodes("a", "b", "c"), edges=[_edge("a", "b"), _edge("b", "a"), _edge("b", "c")]))
    assert problems == [
        "edges[2]: node 'b' already has an edge for action 'default' (edges[1] to 'a'); this one goes to 'c': "
        "an action leads to one node"
    ]


def test_loop_is_reported_with_other_problems_and_not_for_chained_nodes() -> None:
    assert ir.load(workflow(*_nodes("a", "b", "c"))).warnings == []
    problems = _errors(workflow(*_nodes("a", "b", "c"), edges=[_edge("a", "b"), _edge("b", "a"), _edge("c", "zz")]))
    assert problems == [
        "edges[2].to: unknown node 'zz'",
        "edges: the nodes a -> b -> a form a loop that nothing leaves",
    ]


def test_duplicate_ids_do_not_also_report_a_loop() -> None:
    assert _errors(workflow(*_nodes("a", "b", "a"))) == [
        "nodes[2] (id 'a'): duplicate node id (first used by nodes[0])"
    ]


def test_long_loop_of_many_nodes_needs_no_recursion() -> None:
    ids = [f"n{i}" for i in range(1200)]
    edges = [_edge(a, b) for a, b in itertools.pairwise(ids)] + [_edge(ids[-1], ids[0])]
    (problem,) = _errors(workflow(*_nodes(*ids), edges=edges))
    assert problem.startswith("edges: the nodes n0 -> n1 -> ") and "(1200 nodes) -> n0 form a loop" in problem


def test_warnings_are_not_serialized() -> None:
    wf = ir.load(workflow(*_nodes("a", "b", "c"), edges=[_edge("a", "b"), _edge("b", "a"), _edge("b", "c", "x")]))
    assert wf.warnings
    assert "warnings" not in wf.wire() and "warnings" not in json.loads(wf.model_dump_json())
    assert "warnings" not in json.dumps(ir.json_schema())


def test_max_steps_is_an_optional_positive_field() -> None:
    assert ir.load(workflow(*_nodes("a"))).max_steps is None
    assert ir.load(workflow(*_nodes("a"), max_steps=50)).max_steps == 50
    assert any(p.startswith("max_steps:") for p in _errors(workflow(*_nodes("a"), max_steps=0)))
    assert "CHORDFLOW_MAX_STEPS" in ir.json_schema()["properties"]["max_steps"]["description"]


@pytest.mark.processes
def test_cli_validate_prints_warnings_on_stderr_and_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "wf.json"
    path.write_text(
        json.dumps(workflow(*_nodes("a", "b", "c"), edges=[_edge("a", "b"), _edge("b", "a"), _edge("b", "c", "done")]))
    )
    proc = run_cli("validate", path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok: 3 nodes"
    assert proc.stderr.splitlines() == [
        "warning: edges: the nodes a -> b -> a form a loop that only the action 'done' (b -> c) leaves; "
        "a run repeats it until a node returns that action"
    ]
