"""Sub-workflows: a `workflow` node runs another workflow (a file or inline) on a fresh store of its own.

Loading includes them (validated, recursion refused, paths relative to the including file) so a loaded
workflow is self-contained; runs go through `scheduler.run` on both backends (real redis-server and real
workers for "celery"), the CLI as a subprocess, and one durable cluster run.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pocketflow import Node

import ir
import scheduler
from ir.errors import SubworkflowFailed, ValidationError
from scheduler.localcluster import Cluster
from tests.scheduler.cli.test_cli import ROOT, err_lines, run_cli
from tests.support import nodes as tn
from worker.nodes import register
from worker.runs.sqlite import LocalRuns

#: The barrier `test-params-after-wait` waits at (set by the test using it).
GATE: dict[str, threading.Barrier | None] = {"barrier": None}


@register("test-params-after-wait")
class ParamsAfterWaitNode(Node):
    """Waits until every concurrent item is inside exec, then writes its `text` param as it reads it then.

    Items sharing one node instance would all read the params the last of them set."""

    def exec(self, prep_res: Any) -> None:
        barrier = GATE["barrier"]
        if barrier is not None:
            barrier.wait(timeout=tn.WAIT_TIMEOUT_S)

    def post(self, shared: Any, prep_res: Any, exec_res: Any) -> str:
        shared["text"] = self.params["text"]
        return "default"


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def call(workflow: Any, inputs: Any = None, node_id: str = "call", **extra: Any) -> dict[str, Any]:
    """A `workflow` node."""
    params: dict[str, Any] = {"workflow": workflow}
    if inputs is not None:
        params["inputs"] = inputs
    return {"id": node_id, "type": "workflow", "params": params, **extra}


#: A sub-workflow: its input `text` upper-cased, as the declared output `loud`.
SHOUT = {
    "inputs": {"text": {}},
    "nodes": [{"id": "up", "type": "test-upper", "params": {"text": "${text}"}}],
    "outputs": {"loud": {"source": "${up.value}"}},
}

#: A sub-workflow without declared outputs whose path depends on its input `kind` ("a" or "b").
ROUTED = {
    "inputs": {"kind": {}},
    "nodes": [
        {"id": "route", "type": "test-branch", "params": {"value": "${kind}", "action": "${kind}"}},
        {"id": "on_a", "type": "echo", "params": {"saw": "${route.value}"}},
        {"id": "on_b", "type": "echo", "params": {"saw": "${route.value}"}},
    ],
    "edges": [{"from": "route", "to": "on_a", "action": "a"}, {"from": "route", "to": "on_b", "action": "b"}],
}

#: A sub-workflow whose `check` node returns the unhandled action "error" when its input `value` is "bad".
CHECKED = {
    "inputs": {"value": {}},
    "nodes": [{"id": "check", "type": "test-error-action", "params": {"value": "${value}", "error_on": "bad"}}],
    "outputs": {"value": {"source": "${check.value}"}},
}


def over(items: str, node: dict[str, Any], **batch: Any) -> dict[str, Any]:
    return {**node, "batch": {"items": items, **batch}}


# -- loading: the sub-workflow is included, validated and self-contained ---------------------------------------


def test_load_replaces_a_path_by_the_validated_sub_workflow(tmp_path: Path) -> None:
    sub = write(tmp_path / "sub.json", SHOUT)
    parent = write(tmp_path / "wf.json", {"nodes": [call("sub.json", {"text": "hi"})]})

    params = ir.load(parent).nodes[0].params

    assert params["workflow"] == ir.load(sub).wire()
    assert params["source"] == str(sub)
    assert params["inputs"] == {"text": "hi"}


def test_a_loaded_workflow_runs_without_its_sub_workflow_files(tmp_path: Path) -> None:
    write(tmp_path / "sub.json", SHOUT)
    wire = ir.load(write(tmp_path / "wf.json", {"nodes": [call("sub.json", {"text": "hi"})]})).wire()
    (tmp_path / "sub.json").unlink()
    (tmp_path / "wf.json").unlink()

    result = scheduler.run(wire)

    assert result.shared["call"] == {"loud": "HI"}


def test_relative_paths_start_at_the_including_file_not_the_cwd(tmp_path: Path, monkeypatch: Any) -> None:
    leaf = {"nodes": [{"id": "leaf", "type": "echo", "params": {"from": "shared/leaf.json"}}]}
    write(tmp_path / "flows" / "shared" / "leaf.json", leaf)
    write(tmp_path / "flows" / "lib" / "mid.json", {"nodes": [call("../shared/leaf.json", node_id="inner")]})
    parent = write(tmp_path / "flows" / "wf.json", {"nodes": [call("lib/mid.json")]})
    decoy = {"nodes": [{"id": "decoy", "type": "echo", "params": {"from": "the cwd"}}]}
    write(tmp_path / "elsewhere" / "lib" / "mid.json", decoy)
    monkeypatch.chdir(tmp_path / "elsewhere")

    result = scheduler.run(parent)

    assert result.shared["call"] == {"inner": {"leaf": {"from": "shared/leaf.json"}}}


def test_a_parent_not_read_from_a_file_resolves_paths_from_the_cwd(tmp_path: Path, monkeypatch: Any) -> None:
    write(tmp_path / "lib" / "sub.json", SHOUT)
    monkeypatch.chdir(tmp_path)

    result = scheduler.run({"nodes": [call("lib/sub.json", {"text": "cwd"})]})

    assert result.shared["call"] == {"loud": "CWD"}


# -- runs, on both backends -------------------------------------------------------------------------------------


def test_a_sub_workflow_file_writes_its_declared_outputs(tmp_path: Path, backend: str) -> None:
    write(tmp_path / "shout.json", SHOUT)
    parent = write(
        tmp_path / "wf.json",
        {
            "nodes": [
                {"id": "src", "type": "echo", "params": {"word": "hello"}},
                call("shout.json", {"text": "${src.word}"}),
                {"id": "after", "type": "echo", "params": {"got": "${call.loud}"}},
            ]
        },
    )

    result = scheduler.run(parent, backend=backend)

    assert result.status == "success"
    assert result.shared["call"] == {"loud": "HELLO"}  # the declared outputs only: not `up`, not `text`
    assert result.shared["after"] == {"got": "HELLO"}
    assert "up" not in result.shared and "text" not in result.shared  # the sub-workflow's store stays its own


def test_an_inline_sub_workflow_without_outputs_writes_its_nodes_namespaces(backend: str) -> None:
    inline = {
        "inputs": {"kind": {}, "config": {}},
        "nodes": [*ROUTED["nodes"], {"id": "unused", "type": "echo", "params": {"never": "runs"}}],
        "edges": ROUTED["edges"],
    }
    wf = {"nodes": [call(inline, {"kind": "b", "config": {"a": 1}})]}

    result = scheduler.run(wf, backend=backend)

    # Namespaces of the nodes that ran; not the inputs (`config` is a dict, but no node's), not unrun nodes.
    assert result.shared["call"] == {"route": {"value": "b"}, "on_b": {"saw": "b"}}


def test_inputs_given_as_one_template_resolving_to_an_object(backend: str) -> None:
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"records": [{"text": "x"}, {"text": "y"}]}},
            over("${src.records}", call(SHOUT, "${record}"), **{"as": "record"}),
        ]
    }

    result = scheduler.run(wf, backend=backend)

    assert result.shared["call"]["results"] == [{"loud": "X"}, {"loud": "Y"}]


def test_a_batch_over_a_workflow_node_runs_one_isolated_instance_per_item(backend: str) -> None:
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"kinds": ["a", "b", "a", "b"]}},
            over("${src.kinds}", call(ROUTED, {"kind": "${item}"}), chunk_size=1),
        ]
    }

    result = scheduler.run(wf, backend=backend)

    # Each item's store holds its own path only: an item that saw another's writes would show both branches.
    on_a = {"route": {"value": "a"}, "on_a": {"saw": "a"}}
    on_b = {"route": {"value": "b"}, "on_b": {"saw": "b"}}
    aggregate = result.shared["call"]
    assert aggregate["results"] == [on_a, on_b, on_a, on_b]
    assert (aggregate["count"], aggregate["success_count"], aggregate["errors"]) == (4, 4, None)


def test_batch_nodes_inside_a_sub_workflow_run_within_it(backend: str) -> None:
    inner = {
        "inputs": {"words": {}},
        "nodes": [over("${words}", {"id": "each", "type": "test-upper", "params": {"text": "${item}"}})],
        "outputs": {"upper": {"source": "${each.results}"}},
    }
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"groups": [["a", "b"], ["c"]]}},
            over("${src.groups}", call(inner, {"words": "${group}"}), **{"as": "group"}),
        ]
    }

    result = scheduler.run(wf, backend=backend)

    assert result.shared["call"]["results"] == [
        {"upper": [{"value": "A"}, {"value": "B"}]},
        {"upper": [{"value": "C"}]},
    ]


def test_parallel_items_each_run_their_own_sub_workflow_node_instances() -> None:
    items = [f"item-{i}" for i in range(4)]
    inner = {
        "inputs": {"text": {}},
        "nodes": [{"id": "late", "type": "test-params-after-wait", "params": {"text": "${text}"}}],
        "outputs": {"text": {"source": "${late.text}"}},
    }
    wf = {"nodes": [over("${items}", call(inner, {"text": "${item}"}), parallel=True, max_concurrent=len(items))]}
    GATE["barrier"] = threading.Barrier(len(items))

    result = scheduler.run(wf, {"items": items})

    assert result.shared["call"]["results"] == [{"text": item} for item in items]


def test_appends_to_the_parents_accumulators_reach_them_from_inside(backend: str) -> None:
    inner = {"inputs": {"w": {}}, "nodes": [{"id": "llm", "type": "test-llm-calls", "params": {"item": "${w}"}}]}
    wf = {"nodes": [over("${items}", call(inner, {"w": "${item}"}))]}

    result = scheduler.run(wf, {"items": ["a", "b"]}, shared={"__llm_calls__": []}, backend=backend)

    # The sub-run's store is fresh (no `__index__`), yet its calls are counted in the parent's list, in item order.
    assert result.shared["__llm_calls__"] == [{"index": None, "item": "a"}, {"index": None, "item": "b"}]
    assert result.shared["call"]["results"] == [{"llm": {"value": "a"}}, {"llm": {"value": "b"}}]


def test_templates_inside_the_sub_workflow_are_its_own(backend: str) -> None:
    inner = {
        "inputs": {"text": {}, "only_here": {}},
        "nodes": [{"id": "show", "type": "echo", "params": {"text": "${text}", "other": "${only_here}"}}],
    }
    wf = {
        "inputs": {
            "text": {},
            "items": {},
        },  # declared inputs: a template naming anything else is a problem of the parent
        "nodes": [over("${items}", call(inner, {"text": "sub-${item}", "only_here": "${text}"}))],
    }

    result = scheduler.run(wf, {"text": "parent", "items": ["1", "2"]}, backend=backend)

    # `${text}` inside the sub-workflow is its input, not the parent's input of the same name.
    assert result.shared["call"]["results"] == [
        {"show": {"text": "sub-1", "other": "parent"}},
        {"show": {"text": "sub-2", "other": "parent"}},
    ]


# -- failures ---------------------------------------------------------------------------------------------------


def test_a_failed_sub_workflow_fails_the_node_naming_it_and_the_cause(backend: str) -> None:
    wf = {"nodes": [over("${items}", call(CHECKED, {"value": "${item}"}))]}

    with pytest.raises(SubworkflowFailed) as raised:
        scheduler.run(wf, {"items": ["bad"]}, backend=backend)

    assert str(raised.value) == "workflow node 'call' failed: node 'check' returned 'error'"


def test_a_failed_sub_workflow_fails_only_its_item_with_continue(tmp_path: Path, backend: str) -> None:
    write(tmp_path / "checked.json", CHECKED)
    parent = {"nodes": [over("${items}", call("checked.json", {"value": "${item}"}), error_handling="continue")]}
    write(tmp_path / "wf.json", parent)

    result = scheduler.run(tmp_path / "wf.json", {"items": ["ok", "bad", "fine"]}, backend=backend)

    aggregate = result.shared["call"]
    assert result.status == "success"
    assert aggregate["results"] == [{"value": "ok"}, None, {"value": "fine"}]
    assert (aggregate["success_count"], aggregate["error_count"]) == (2, 1)
    assert aggregate["errors"] == [
        {
            "index": 1,
            "item": "bad",
            "error": f"workflow node 'call' (sub-workflow {tmp_path / 'checked.json'}) failed: "
            "node 'check' returned 'error'",
            "exception_type": "SubworkflowFailed",
        }
    ]


def test_an_exception_inside_the_sub_workflow_propagates_unchanged(backend: str) -> None:
    inner = {
        "inputs": {"value": {}},
        "nodes": [{"id": "f", "type": "test-fail", "params": {"value": "${value}", "fail_on": "x"}}],
    }
    node = call(inner, {"value": "${item}"})

    continued = scheduler.run(
        {"nodes": [over("${items}", node, error_handling="continue")]}, {"items": ["x", "y"]}, backend=backend
    )
    with pytest.raises(ValueError) as raised:
        scheduler.run({"nodes": [over("${items}", node)]}, {"items": ["y", "x"]}, backend=backend)

    assert (type(raised.value), str(raised.value)) == (ValueError, "boom x")
    if backend == "local":  # a note (shown with a traceback) says where it came from; notes do not travel
        assert raised.value.__notes__ == ["raised in node 'f' of workflow node 'call'"]

    errors = continued.shared["call"]["errors"]
    assert [(e["index"], e["error"], e["exception_type"]) for e in errors] == [(0, "boom x", "ValueError")]
    assert continued.shared["call"]["results"][1] == {"f": {"value": "y"}}


def test_bad_inputs_at_run_time_fail_the_node_naming_it() -> None:
    wf = {"nodes": [{"id": "src", "type": "echo", "params": {"rec": {"txt": "typo"}}}, call(SHOUT, "${src.rec}")]}

    with pytest.raises(ValueError, match="workflow node 'call'") as raised:
        scheduler.run(wf)

    assert "unknown input 'txt' (did you mean 'text'?)" in str(raised.value)


def test_the_sub_run_leaves_the_parent_run_alone() -> None:
    events: list[dict[str, Any]] = []
    runs = LocalRuns.default()
    before = len(runs.recent(limit=10_000))
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"word": "a"}},
            call({"nodes": [*ROUTED["nodes"]], "edges": ROUTED["edges"]}, {"kind": "${src.word}"}),
        ]
    }

    result = scheduler.run(wf, on_event=events.append)

    assert [e["node"] for e in events if e["type"] == "state"] == ["src", "call"]  # no event of the sub's nodes
    assert len(runs.recent(limit=10_000)) == before + 1  # one run record: the parent's
    assert runs.trail(result.run_id) == ["src", "call"]


def test_cancelling_the_parent_run_stops_its_sub_workflow() -> None:
    cancelled = threading.Event()
    inner = {"nodes": [{"id": "rec", "type": "test-record", "params": {"item": "sub"}}]}

    def started(node: str) -> None:
        if node == "call":
            cancelled.set()  # after the parent's own check, before the sub-workflow's first node

    result = scheduler.run({"nodes": [call(inner)]}, cancelled=cancelled, on_node_start=started)

    assert result.status == "cancelled"
    assert tn.RECORDS == []
    assert result.shared == {"call": {}}  # its namespace, and nothing written in it


# -- validation -------------------------------------------------------------------------------------------------


def test_problems_inside_a_sub_workflow_file_name_both_files_and_the_nodes(tmp_path: Path) -> None:
    bad = {"inputs": {}, "nodes": [{"id": "x", "type": "ecko"}, {"id": "y", "type": "echo", "params": {"v": "${zz}"}}]}
    write(tmp_path / "lib" / "bad.json", bad)
    parent = write(tmp_path / "wf.json", {"nodes": [{"id": "a", "type": "echo"}, call("lib/bad.json")]})
    sub, wf = tmp_path / "lib" / "bad.json", tmp_path / "wf.json"

    with pytest.raises(ValidationError) as raised:
        ir.load(parent, node_types=["echo", "workflow"])

    assert raised.value.source is None  # each problem names its own file
    assert raised.value.problems == [
        f"{sub}: nodes[1] (id 'y').params.v: ${{zz}} refers to unknown node or input 'zz' (from {wf} node 'call')",
        f"{sub}: nodes[0] (id 'x').type: unknown node type 'ecko' (did you mean 'echo'?) (from {wf} node 'call')",
    ]


def test_problems_two_files_deep_name_the_whole_chain(tmp_path: Path) -> None:
    write(tmp_path / "leaf.json", {"nodes": [{"id": "x", "type": "ecko"}]})
    write(tmp_path / "mid.json", {"nodes": [call({"nodes": [call("leaf.json", node_id="deep")]}, node_id="in")]})
    write(tmp_path / "wf.json", {"nodes": [call("mid.json")]})

    with pytest.raises(ValidationError) as raised:
        ir.load(tmp_path / "wf.json", node_types=["echo", "workflow"])

    leaf, mid, wf = (tmp_path / name for name in ("leaf.json", "mid.json", "wf.json"))
    assert raised.value.problems == [
        f"{leaf}: nodes[0] (id 'x').type: unknown node type 'ecko' (did you mean 'echo'?) "
        f"(from {mid} node 'in' > 'deep', from {wf} node 'call')"
    ]


def test_problems_inside_an_inline_sub_workflow_are_locations_in_the_parent(tmp_path: Path) -> None:
    parent = write(tmp_path / "wf.json", {"nodes": [call({"nodes": [{"id": "x", "type": "ecko"}]})]})

    with pytest.raises(ValidationError) as raised:
        ir.load(parent, node_types=["echo", "workflow"])

    assert raised.value.source == str(parent)
    assert raised.value.problems == [
        "nodes[0] (id 'call').params.workflow: nodes[0] (id 'x').type: unknown node type 'ecko' (did you mean 'echo'?)"
    ]


@pytest.mark.parametrize("indirect", [False, True], ids=["itself", "through-another"])
def test_a_workflow_that_includes_itself_is_refused_naming_the_chain(tmp_path: Path, indirect: bool) -> None:
    wf, other = tmp_path / "wf.json", tmp_path / "other.json"
    write(wf, {"nodes": [{"id": "a", "type": "echo"}, call("other.json" if indirect else "wf.json")]})
    write(other, {"nodes": [call({"nodes": [call("wf.json", node_id="back")]}, node_id="in")]})

    with pytest.raises(ValidationError) as raised:
        ir.load(wf)

    reason = "a workflow cannot run itself, directly or through its sub-workflows"
    if indirect:
        expected = (
            f"{other}: nodes[0] (id 'in').params.workflow: nodes[0] (id 'back').params.workflow: "
            f"sub-workflow recursion {wf} -> {other} -> {wf}: {reason} (from {wf} node 'call')"
        )
        assert raised.value.problems == [expected]
    else:
        assert raised.value.problems == [
            f"nodes[1] (id 'call').params.workflow: sub-workflow recursion {wf} -> {wf}: {reason}"
        ]
        assert raised.value.source == str(wf)


def test_the_same_file_twice_side_by_side_is_no_recursion(tmp_path: Path) -> None:
    write(tmp_path / "shout.json", SHOUT)
    parent = write(
        tmp_path / "wf.json",
        {"nodes": [call("shout.json", {"text": "a"}), call("shout.json", {"text": "b"}, node_id="again")]},
    )

    result = scheduler.run(parent)

    assert (result.shared["call"], result.shared["again"]) == ({"loud": "A"}, {"loud": "B"})


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({}, "params.workflow is required: a path to a workflow file, or a workflow object"),
        ({"workflow": 3}, "params.workflow: must be a path to a workflow file or a workflow object, got int"),
        (
            {"workflow": "${name}.json"},
            "params.workflow: a path cannot hold templates ('${name}.json'): sub-workflows are included when "
            "the workflow is loaded",
        ),
        ({"workflow": "missing.json"}, "params.workflow: {dir}/missing.json: file not found"),
        (
            {"workflow": SHOUT, "input": {"text": "a"}},
            "params.input: unknown param of a workflow node (it takes 'workflow' and 'inputs')",
        ),
        ({"workflow": SHOUT, "inputs": {}}, "params.inputs: required input 'text' of the sub-workflow is not given"),
        (
            {"workflow": SHOUT, "inputs": {"txt": "a"}},
            "params.inputs: unknown input 'txt' (did you mean 'text'?)",
        ),
        (
            {"workflow": SHOUT, "inputs": "text ${x}"},
            "params.inputs: must be an object of inputs or one template like '${record}', got 'text ${x}'",
        ),
    ],
    ids=["missing", "not-a-path", "templated-path", "no-file", "unknown-param", "required", "typo", "not-one-template"],
)
def test_bad_workflow_node_params_are_problems(tmp_path: Path, params: dict[str, Any], problem: str) -> None:
    parent = write(tmp_path / "wf.json", {"nodes": [{"id": "call", "type": "workflow", "params": params}]})

    with pytest.raises(ValidationError) as raised:
        ir.load(parent)

    assert any(p == f"nodes[0] (id 'call').{problem.replace('{dir}', str(tmp_path))}" for p in raised.value.problems), (
        raised.value
    )


def test_param_checks_of_the_sub_workflows_node_types_run_at_validation(tmp_path: Path) -> None:
    inner = {"inputs": {"f": {}}, "nodes": [{"id": "sh", "type": "shell", "params": {"command": "cat ${f}"}}]}
    write(tmp_path / "sh.json", inner)
    parent = write(tmp_path / "wf.json", {"nodes": [call("sh.json", {"f": "x"})]})

    with pytest.raises(ValidationError) as raised:
        scheduler.compile(parent)

    text = str(raised.value)
    assert text.startswith(f"{parent}: nodes[0] (id 'call').params: {tmp_path / 'sh.json'}: nodes[0] (id 'sh').params")
    assert "contains the template '${f}'" in text


# -- the CLI, and a run that lives in the cluster ---------------------------------------------------------------


@pytest.mark.processes
def test_cli_validates_and_runs_a_parent_and_its_sub_workflow_file(tmp_path: Path) -> None:
    write(tmp_path / "sub" / "shout.json", SHOUT)
    parent = write(
        tmp_path / "wf.json",
        {
            "inputs": {"word": {}},
            "nodes": [call("sub/shout.json", {"text": "${word}"})],
            "outputs": {"loud": {"source": "${call.loud}"}},
        },
    )

    checked = run_cli("validate", parent)
    ran = run_cli("run", parent, "--input", "word=hey", "--output", "json")

    assert (checked.returncode, checked.stdout.strip()) == (0, "ok: 1 nodes"), checked.stderr
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert (report["status"], report["outputs"], report["store"]["call"]) == (
        "success",
        {"loud": "HEY"},
        {"loud": "HEY"},
    )


@pytest.mark.processes
def test_cli_validate_reports_a_sub_workflow_problem_naming_both_files(tmp_path: Path) -> None:
    write(tmp_path / "sub.json", {"nodes": [{"id": "x", "type": "ecko"}]})
    parent = write(tmp_path / "wf.json", {"nodes": [call("sub.json")]})

    proc = run_cli("validate", parent)

    assert proc.returncode == 2
    assert err_lines(proc) == [
        f"error: {tmp_path / 'sub.json'}: nodes[0] (id 'x').type: unknown node type 'ecko' (did you mean 'echo'?) "
        f"(from {parent} node 'call')"
    ]


@pytest.mark.processes
def test_the_word_counts_by_file_example() -> None:
    proc = run_cli("run", "examples/word_counts_by_file.json", "--input", "folder=examples/texts", "--output", "json")

    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    texts = sorted((ROOT / "examples" / "texts").glob("*.txt"))
    expected = [len(path.read_text(encoding="utf-8").split()) for path in texts]
    results = report["store"]["stats"]["results"]
    assert [r["result"]["words"] for r in results] == expected
    assert [r["absolute_path"] for r in results] == [str(path) for path in texts]
    assert report["outputs"] == {"total_words": sum(expected), "files": len(texts)}


def test_a_cluster_run_carries_its_sub_workflows_to_the_workers(celery_cluster: Cluster, tmp_path: Path) -> None:
    inner = {
        "inputs": {"words": {}},
        "nodes": [over("${words}", {"id": "each", "type": "test-upper", "params": {"text": "${item}"}})],
        "outputs": {"upper": {"source": "${each.results}"}},
    }
    write(tmp_path / "inner.json", inner)
    parent = write(
        tmp_path / "wf.json",
        {
            "nodes": [
                call("inner.json", {"words": ["x"]}, node_id="once"),  # runs inside an `advance` task
                over("${groups}", call("inner.json", {"words": "${group}"}), **{"as": "group"}),  # in chunk tasks
            ]
        },
    )
    run_id = scheduler.submit(parent, {"groups": [["a", "b"], ["c"]]})
    (tmp_path / "inner.json").unlink()  # the workers never read the files: the run carries the sub-workflow

    result = scheduler.wait(run_id, timeout=60)

    assert result.status == "success", result.error
    assert result.shared["once"] == {"upper": [{"value": "X"}]}
    assert result.shared["call"]["results"] == [
        {"upper": [{"value": "A"}, {"value": "B"}]},
        {"upper": [{"value": "C"}]},
    ]
