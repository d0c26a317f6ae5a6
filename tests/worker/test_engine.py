"""scheduler.run / scheduler.stream: events, status, inputs, outputs, and plain (non-batch) PocketFlow semantics."""

from __future__ import annotations

import pytest

import ir
import scheduler
from tests.support import batch_node, workflow
from tests.support import nodes as tn


def _pipeline() -> dict:
    return workflow(
        {"id": "first", "type": "echo", "params": {"files": ["a", "b", "c", "d"]}},
        batch_node(
            "b",
            node_type="test-fail",
            items="${first.files}",
            params={"value": "${item}", "fail_on": "c"},
            error_handling="continue",
        ),
        {"id": "last", "type": "echo", "params": {"n": "${b.success_count}"}},
    )


# --- stream ---------------------------------------------------------------------------------------------


def test_stream_events(backend):
    events = list(scheduler.stream(_pipeline(), backend=backend))
    assert events[-1]["type"] == "final"
    assert [e["type"] for e in events].count("final") == 1

    states = [e for e in events if e["type"] == "state"]
    assert [e["node"] for e in states] == ["first", "b", "last"]
    # Each state is the store right after that node.
    assert states[0]["state"] == {"first": {"files": ["a", "b", "c", "d"]}}
    assert "b" not in states[0]["state"]
    assert states[1]["state"]["b"]["error_count"] == 1
    assert "last" not in states[1]["state"]
    assert states[2]["state"]["last"] == {"n": 3}

    progress = [e for e in events if e["type"] == "batch_progress"]
    assert {e["node"] for e in progress} == {"b"}
    assert all(e["total"] == 4 for e in progress)
    assert sorted(e["done"] for e in progress) == [1, 2, 3, 4]
    assert {e["index"]: e["ok"] for e in progress} == {0: True, 1: True, 2: False, 3: True}
    # Progress for the batch comes after the state of the node before it and before the batch's own state.
    position = {id(e): i for i, e in enumerate(events)}
    assert all(position[id(states[0])] < position[id(e)] < position[id(states[1])] for e in progress)


def test_stream_final_state_equals_run(backend):
    events = list(scheduler.stream(_pipeline(), backend=backend))
    final = events[-1]
    result = scheduler.run(_pipeline(), backend=backend)
    assert final["type"] == "final"
    assert final["status"] == result.status == "success"
    assert final["state"] == result.shared
    assert final["state"]["last"] == {"n": 3}


def test_stream_failure_reports_error_then_final(backend):
    wf = workflow(batch_node(node_type="test-fail", params={"value": "${item}", "fail_on": "b"}))
    shared = {"x": ["a", "b"]}
    events = list(scheduler.stream(wf, shared=shared, backend=backend))
    assert events[-1]["type"] == "final"
    assert events[-1]["status"] == "failed"
    assert "boom b" in events[-1]["error"]
    errors = [e for e in events if e["type"] == "error"]
    assert any(e["node"] == "b" and e["error"] == "ValueError: boom b" for e in errors)
    assert "b" not in events[-1]["state"]


def test_stream_uses_given_shared():
    shared = {"name": "ada"}
    events = list(
        scheduler.stream(workflow({"id": "u", "type": "test-upper", "params": {"text": "${name}"}}), shared=shared)
    )
    assert events[-1]["state"] is shared
    assert shared["u"] == {"value": "ADA"}


def test_run_on_event_callback():
    seen: list = []
    scheduler.run(workflow({"id": "u", "type": "test-upper", "params": {"text": "q"}}), on_event=seen.append)
    assert [(e["type"], e["node"]) for e in seen] == [("state", "u")]


# --- status ---------------------------------------------------------------------------------------------


def test_error_action_without_error_edge_fails_run():
    wf = workflow(
        {"id": "check", "type": "test-error-action", "params": {"value": "v"}},
        {"id": "after", "type": "echo", "params": {"v": 1}},
    )
    result = scheduler.run(wf)
    assert result.status == "failed"
    assert "check" in result.error
    assert result.shared["check"] == {"value": "v"}
    assert "after" not in result.shared


def test_error_action_failed_run_with_outputs_returns_failed_result():
    """An unhandled `error` action ends the run with status "failed" (`scheduler.run`), even when the workflow
    declares outputs that the failed run never produced: the caller gets the RunResult, not a TemplateError."""
    wf = workflow(
        {"id": "check", "type": "test-error-action", "params": {"value": "v"}},
        {"id": "after", "type": "echo", "params": {"v": 1}},
        outputs={"v": {"source": "${after.v}"}},
    )
    result = scheduler.run(wf)
    assert result.status == "failed"
    assert "check" in result.error
    assert "v" not in result.outputs


def test_error_action_stream_final_failed():
    wf = workflow({"id": "check", "type": "test-error-action", "params": {"value": "v"}})
    final = list(scheduler.stream(wf))[-1]
    assert final["type"] == "final"
    assert final["status"] == "failed"


def test_success_status():
    result = scheduler.run(workflow({"id": "u", "type": "test-upper", "params": {"text": "q"}}))
    assert result.status == "success"
    assert result.error is None


def test_run_mutates_given_shared_in_place():
    shared = {"name": "ada"}
    result = scheduler.run(workflow({"id": "u", "type": "test-upper", "params": {"text": "${name}"}}), shared=shared)
    assert result.shared is shared
    assert shared == {"name": "ada", "u": {"value": "ADA"}}


def test_unknown_backend_rejected():
    with pytest.raises(ValueError, match="unknown backend 'nope'"):
        scheduler.run(workflow({"id": "u", "type": "test-upper", "params": {"text": "q"}}), backend="nope")


# --- inputs and outputs ---------------------------------------------------------------------------------


def _inputs_wf() -> dict:
    return workflow(
        {"id": "u", "type": "echo", "params": {"who": "${name}", "greeting": "${greeting}"}},
        inputs={
            "name": {"type": "string", "required": True},
            "greeting": {"type": "string", "required": False, "default": "hello"},
        },
        outputs={"who": {"source": "${u.who}"}, "line": {"source": "${u.greeting}, ${u.who}"}},
    )


def test_inputs_default_applied_and_outputs_resolved():
    result = scheduler.run(_inputs_wf(), {"name": "ada"})
    assert result.shared["u"] == {"who": "ada", "greeting": "hello"}
    assert result.outputs == {"who": "ada", "line": "hello, ada"}


def test_inputs_given_override_default():
    result = scheduler.run(_inputs_wf(), {"name": "ada", "greeting": "hi"})
    assert result.outputs["line"] == "hi, ada"


def test_required_input_missing():
    shared: dict = {}
    with pytest.raises(ir.ValidationError, match="required input 'name' was not given"):
        scheduler.run(_inputs_wf(), shared=shared)
    assert shared == {}


def test_required_input_from_shared():
    result = scheduler.run(_inputs_wf(), shared={"name": "grace"})
    assert result.outputs["who"] == "grace"


def test_outputs_keep_type(backend):
    wf = workflow(
        batch_node(params={"text": "${item}"}),
        outputs={"count": {"source": "${b.count}"}, "results": {"source": "${b.results}"}},
    )
    result = scheduler.run(wf, {"x": ["a", "b"]}, backend=backend)
    assert result.outputs == {"count": 2, "results": [{"value": "A"}, {"value": "B"}]}


# --- plain PocketFlow semantics -------------------------------------------------------------------------


def test_nodes_without_edges_run_in_listed_order():
    wf = workflow(
        {"id": "one", "type": "test-record", "params": {"item": 1}},
        {"id": "two", "type": "test-record", "params": {"item": 2}},
        {"id": "three", "type": "test-record", "params": {"item": "${two.value}"}},
    )
    shared = scheduler.run(wf).shared
    assert tn.recorded() == [(None, 1), (None, 2), (None, 2)]
    assert shared == {"one": {"value": 1}, "two": {"value": 2}, "three": {"value": 2}}


def test_actions_select_successor():
    def wf(action: str) -> dict:
        return workflow(
            {"id": "start", "type": "test-branch", "params": {"value": "s", "action": action}},
            {"id": "left", "type": "test-upper", "params": {"text": "l"}},
            {"id": "right", "type": "test-upper", "params": {"text": "r"}},
            edges=[{"from": "start", "to": "left", "action": "go_left"}, {"from": "start", "to": "right"}],
        )

    left = scheduler.run(wf("go_left")).shared
    assert left == {"start": {"value": "s"}, "left": {"value": "L"}}
    right = scheduler.run(wf("default")).shared
    assert right == {"start": {"value": "s"}, "right": {"value": "R"}}
    # An action with no edge ends the flow quietly.
    ended = scheduler.run(wf("nowhere"))
    assert ended.status == "success"
    assert ended.shared == {"start": {"value": "s"}}


def test_start_node_explicit():
    wf = workflow(
        {"id": "a", "type": "test-upper", "params": {"text": "a"}},
        {"id": "b", "type": "test-upper", "params": {"text": "b"}},
        edges=[{"from": "b", "to": "a"}],
        start_node="b",
    )
    assert list(scheduler.run(wf).shared) == ["b", "a"]


def test_writes_are_namespaced_and_dunders_go_to_root():
    calls: list = []
    wf = workflow({"id": "n", "type": "test-llm-calls", "params": {"item": "z"}})
    shared = scheduler.run(wf, shared={"__llm_calls__": calls, "value": "root"}).shared
    assert shared["n"] == {"value": "z"}
    assert shared["value"] == "root"
    assert calls == [{"index": None, "item": "z"}]


def test_compiled_flow_is_plain_pocketflow():
    """A workflow without batch runs as a plain pocketflow Flow: flow.run(shared) gives the same store."""
    wf = workflow(
        {"id": "a", "type": "test-upper", "params": {"text": "${name}"}},
        {"id": "b", "type": "echo", "params": {"got": "${a.value}"}},
    )
    shared = {"name": "x"}
    flow = scheduler.compile(wf)
    flow.run(shared)
    assert (
        shared
        == scheduler.run(wf, shared={"name": "x"}).shared
        == {
            "name": "x",
            "a": {"value": "X"},
            "b": {"got": "X"},
        }
    )


def test_node_exception_propagates_unchanged():
    wf = workflow({"id": "f", "type": "test-fail", "params": {"value": "v", "fail": True}})
    with pytest.raises(ValueError, match=r"^boom v$"):
        scheduler.run(wf)


def test_batch_node_in_a_loop_runs_afresh_each_pass(backend: str) -> None:
    """A node that runs twice in one run dispatches two independent batches (results of the last pass)."""
    workflow = {
        "nodes": [
            {"id": "start", "type": "test-rounds", "params": {"rounds": 0}},
            {"id": "b", "type": "echo", "params": {"v": "${item}-${__rounds__}"}, "batch": {"items": "${items}"}},
            {"id": "loop", "type": "test-rounds", "params": {"rounds": 3}},
        ],
        "edges": [
            {"from": "start", "to": "b", "action": "done"},
            {"from": "b", "to": "loop"},
            {"from": "loop", "to": "b", "action": "again"},
        ],
    }
    result = scheduler.run(workflow, {"items": ["x", "y"]}, backend=backend)
    assert result.status == "success"
    assert result.shared["__rounds__"] == 3
    assert [r["v"] for r in result.shared["b"]["results"]] == ["x-2", "y-2"]
