"""Plans: states by `_uid`, tool calls with `†state` reads and `_outputPath` writes, batched by tool.

Runs go through `scheduler.plans.run_plan` (on the local and the celery backend, real workers) and through
the CLI (`chordflow run-plan`, `chordflow plan-to-ir`) as a subprocess.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from scheduler.plans import compile_plan, load_plan, run_plan
from tests.scheduler.cli.test_cli import assert_one_line_error, cli_env, run_cli, write_wf
from worker.cluster.state.runstate import RunState

SEED_PLAN = {
    "context": [
        {"_uid": "①", "type": "state", "state": {"text": "This is wonderful!"}},
        {"_uid": "②", "type": "state", "state": {"text": "This is terrible."}},
    ],
    "calls": [
        {"_tool": "test-upper", "_uid": "①", "text": "†state.text", "_outputPath": "sentiment"},
        {"_tool": "test-upper", "_uid": "②", "text": "†state.text", "_outputPath": "sentiment"},
    ],
}
SEED_STATES = {
    "①": {"text": "This is wonderful!", "sentiment": "THIS IS WONDERFUL!"},
    "②": {"text": "This is terrible.", "sentiment": "THIS IS TERRIBLE."},
}


def states(*uids: str, **state: Any) -> list[dict[str, Any]]:
    return [{"_uid": uid, "type": "state", "state": {"name": uid, **state}} for uid in uids]


def batch_nodes(wf: dict[str, Any]) -> list[dict[str, Any]]:
    return [node for node in wf["nodes"] if "batch" in node]


def items_of(wf: dict[str, Any], node_id: str) -> list[list[Any]]:
    """The [call index, _uid] pairs of a batch node, from its gather node."""
    (gather,) = (node for node in wf["nodes"] if node["id"] == f"{node_id}-gather")
    return gather["params"]["calls"]


# -- running plans --------------------------------------------------------------------------------------------


def test_seed_example_writes_each_output_into_its_own_state(backend: str) -> None:
    assert run_plan(SEED_PLAN, backend=backend) == SEED_STATES


def test_dependent_chain_across_three_uids_runs_in_two_batches(backend: str) -> None:
    calls = []
    for uid in ("a", "b", "c"):  # listed reader first: the dependency comes from the paths, not the order
        calls.append({"_tool": "echo", "_uid": uid, "_outputPath": "report.loud", "shout": "†state.upper"})
        calls.append({"_tool": "test-upper", "_uid": uid, "_outputPath": "upper", "text": "†state.name"})
    plan = {"context": states("a", "b", "c"), "calls": calls}

    wf = compile_plan(plan)
    assert [(node["type"], items_of(wf, node["id"])) for node in batch_nodes(wf)] == [
        ("test-upper", [[1, "a"], [3, "b"], [5, "c"]]),
        ("echo", [[0, "a"], [2, "b"], [4, "c"]]),
    ]
    assert run_plan(plan, backend=backend) == {
        uid: {"name": uid, "upper": uid.upper(), "report": {"loud": uid.upper()}} for uid in ("a", "b", "c")
    }


def test_a_plan_without_uids_is_a_template_applied_to_every_state(backend: str) -> None:
    plan = {
        "context": states("x", "y", "z", "w"),
        "calls": [
            {"_tool": "test-upper", "_outputPath": "upper", "text": "†state.name"},
            {"_tool": "echo", "_outputPath": "pair", "first": "†state.name", "second": "†state.upper", "n": 7},
        ],
    }
    wf = compile_plan(plan)
    assert [len(items_of(wf, node["id"])) for node in batch_nodes(wf)] == [4, 4]
    assert run_plan(plan, backend=backend) == {
        uid: {"name": uid, "upper": uid.upper(), "pair": {"first": uid, "second": uid.upper(), "n": 7}}
        for uid in ("x", "y", "z", "w")
    }


def test_a_write_waits_for_the_earlier_reads_of_the_path_it_overwrites(backend: str) -> None:
    # Without that rule calls 0 and 2 (echo) would run in one batch before call 1, which would read "new".
    plan = {
        "context": states("a", "b", text="old"),
        "calls": [
            {"_tool": "echo", "_outputPath": "other", "v": 1},
            {"_tool": "test-upper", "_outputPath": "shout", "text": "†state.text"},
            {"_tool": "echo", "_outputPath": "text", "v": "new"},
        ],
    }
    assert run_plan(plan, backend=backend) == {
        uid: {"name": uid, "text": "new", "shout": "OLD", "other": 1} for uid in ("a", "b")
    }


def test_nested_paths_list_indexes_and_template_looking_literals() -> None:
    plan = {
        "context": [{"_uid": "u", "state": {"doc": {"parts": ["intro", "body"]}}}],
        "calls": [
            {"_tool": "test-upper", "_outputPath": "doc.loud[1]", "text": "†state.doc.parts[1]"},
            {"_tool": "echo", "_outputPath": "out.deep", "whole": "†state.doc", "literal": "${not_a_template}"},
        ],
    }
    with pytest.raises(
        ValueError, match=r"calls\[0\] \(_uid 'u'\) _outputPath 'doc.loud\[1\]': cannot write \[1\] into nothing"
    ):
        run_plan(plan)  # doc.loud does not exist: a list index cannot be created
    plan["calls"][0]["_outputPath"] = "doc.loud"
    assert run_plan(plan) == {
        "u": {
            "doc": {"parts": ["intro", "body"], "loud": "BODY"},
            "out": {"deep": {"whole": {"parts": ["intro", "body"], "loud": "BODY"}, "literal": "${not_a_template}"}},
        }
    }


# -- one batch per tool and level -----------------------------------------------------------------------------


def _four_uid_plan() -> dict[str, Any]:
    calls = [{"_tool": "test-upper", "_uid": uid, "_outputPath": "upper", "text": "†state.name"} for uid in "pqrs"]
    calls.insert(2, {"_tool": "echo", "_uid": "q", "_outputPath": "tag", "tag": "independent"})
    return {"context": states(*"pqrs"), "calls": calls}


def test_same_tool_calls_ready_together_compile_to_one_batch_node() -> None:
    wf = compile_plan(_four_uid_plan())
    assert [(node["id"], node["type"]) for node in wf["nodes"]] == [
        ("test-upper-1-gather", "plan-gather"),
        ("test-upper-1", "test-upper"),
        ("test-upper-1-scatter", "plan-scatter"),
        ("echo-2-gather", "plan-gather"),
        ("echo-2", "echo"),
        ("echo-2-scatter", "plan-scatter"),
    ]
    upper = batch_nodes(wf)[0]
    assert upper["batch"] == {"items": "${test-upper-1-gather.items}", "as": "call", "parallel": True}
    assert upper["params"] == {"text": "${call.text}"}
    assert items_of(wf, "test-upper-1") == [[0, "p"], [1, "q"], [3, "r"], [4, "s"]]
    # A literal that every call of a batch shares is a param of the batch node, not an item field.
    assert batch_nodes(wf)[1]["params"] == {"tag": "independent"}


@pytest.mark.usefixtures("celery_cluster")
def test_same_tool_calls_ready_together_run_as_one_chord_on_the_cluster() -> None:
    events: list[dict[str, Any]] = []
    result = run_plan(_four_uid_plan(), backend="celery", run_id="plan-one-chord", on_event=events.append)
    assert result["s"] == {"name": "s", "upper": "S"} and result["q"]["tag"] == "independent"
    state = RunState("plan-one-chord")
    totals = {k.decode(): int(v) for k, v in state.redis.hgetall(state.keys.totals).items()}
    # One chord dispatched per batch node (its item count recorded once, under the node and its step).
    assert totals == {"test-upper-1#1": 4, "echo-2#4": 1}
    progress = Counter(e["node"] for e in events if e["type"] == "batch_progress")
    assert progress == {"test-upper-1": 4, "echo-2": 1}


# -- the CLI ------------------------------------------------------------------------------------------------


@pytest.mark.processes
def test_run_plan_prints_the_final_states_by_uid(tmp_path: Path) -> None:
    proc = run_cli("run-plan", write_wf(tmp_path, SEED_PLAN, "plan.json"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == SEED_STATES
    assert proc.stdout.count("\n") == 1 and proc.stderr == ""


def test_run_plan_on_the_cluster_runs_the_calls_on_workers(celery_cluster: Any, tmp_path: Path) -> None:
    plan = {
        "context": states("a", "b", "c"),
        "calls": [
            {"_tool": "test-upper", "_outputPath": "upper", "text": "†state.name"},
            {"_tool": "test-worker-name", "_outputPath": "worker"},
        ],
    }
    env = cli_env(**{k: v for k, v in celery_cluster.env.items() if k.startswith("CHORDFLOW_")})
    proc = run_cli("run-plan", write_wf(tmp_path, plan, "plan.json"), "--backend", "celery", env=env)
    assert proc.returncode == 0, proc.stderr
    final = json.loads(proc.stdout)
    assert {uid: s["upper"] for uid, s in final.items()} == {"a": "A", "b": "B", "c": "C"}
    assert {s["worker"].split("@")[0] for s in final.values()} <= {"w1", "w2"}  # not "in-process"


@pytest.mark.processes
def test_a_failing_tool_call_is_one_error_line_and_exit_1(tmp_path: Path) -> None:
    plan = {"context": states("a", "b"), "calls": [{"_tool": "test-fail", "_outputPath": "v", "value": "†state.name"}]}
    plan["calls"][0]["fail_on"] = "b"
    line = assert_one_line_error(run_cli("run-plan", write_wf(tmp_path, plan, "plan.json")), 1)
    assert "ValueError: boom b" in line


PLAN_ERRORS = {
    "unknown _uid": (
        {"context": states("a"), "calls": [{"_tool": "echo", "_uid": "zz", "_outputPath": "o", "v": 1}]},
        "calls[0]._uid: unknown _uid 'zz' (the context has 'a')",
    ),
    "unknown tool": (
        {"context": states("a"), "calls": [{"_tool": "test-uper", "_outputPath": "o", "text": "x"}]},
        "calls[0]._tool: unknown tool 'test-uper' (did you mean 'test-upper'?)",
    ),
    "cycle": (
        {
            "context": states("a", "b"),
            "calls": [
                {"_tool": "echo", "_outputPath": "x", "v": "†state.y"},
                {"_tool": "echo", "_outputPath": "y", "v": "†state.x.deep"},
            ],
        },
        "_uid 'a' (and 1 more): the calls form a cycle: calls[0] reads 'y' written by calls[1]; "
        "calls[1] reads 'x.deep' written by calls[0]",
    ),
    "unwritten path": (
        {
            "context": [*states("a"), {"_uid": "b", "state": {"summary": "s"}}],
            "calls": [{"_tool": "echo", "_outputPath": "o", "v": {"nested": ["†state.summary"]}}],
        },
        "calls[0].v.nested[0]: †state.summary: no call writes 'summary' and the state of _uid 'a' does not have it",
    ),
}


@pytest.mark.parametrize("case", list(PLAN_ERRORS))
@pytest.mark.processes
def test_plan_errors_are_one_line_naming_the_problem_and_exit_2(case: str, tmp_path: Path) -> None:
    plan, message = PLAN_ERRORS[case]
    path = write_wf(tmp_path, plan, "plan.json")
    for command in ("run-plan", "plan-to-ir"):
        proc = run_cli(command, path)
        assert assert_one_line_error(proc, 2) == f"error: {path}: {message}"
        assert proc.stdout == ""


@pytest.mark.processes
def test_plan_to_ir_validates_and_runs_to_the_same_states(tmp_path: Path) -> None:
    plan = {
        "context": states("a", "b", "c"),
        "calls": [
            {"_tool": "echo", "_outputPath": "report", "shout": "†state.upper", "of": "†state.name"},
            {"_tool": "test-upper", "_outputPath": "upper", "text": "†state.name"},
        ],
    }
    proc = run_cli("plan-to-ir", write_wf(tmp_path, plan, "plan.json"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == compile_plan(plan)
    ir_path = write_wf(tmp_path, proc.stdout, "plan-ir.json")

    checked = run_cli("validate", ir_path)
    assert (checked.returncode, checked.stdout.strip()) == (0, "ok: 6 nodes"), checked.stderr
    ran = run_cli("run", ir_path, "--output", "json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["outputs"]["states"] == run_plan(plan)


def test_plan_to_ir_runs_on_the_cluster_to_the_same_states(celery_cluster: Any, tmp_path: Path) -> None:
    """`chordflow run --backend celery` hands the whole run to the workers: gather and scatter run there too."""
    ir_path = write_wf(tmp_path, compile_plan(SEED_PLAN), "plan-ir.json")
    env = cli_env(**{k: v for k, v in celery_cluster.env.items() if k.startswith("CHORDFLOW_")})
    ran = run_cli("run", ir_path, "--backend", "celery", "--output", "json", env=env)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["outputs"]["states"] == SEED_STATES


def test_load_plan_reports_every_shape_problem_together() -> None:
    plan = {
        "context": [{"_uid": "a", "state": {}}, {"_uid": "a", "state": []}],
        "calls": [{"_tool": "echo", "_outputPath": "o", "v": 1}],
    }
    with pytest.raises(ValueError) as raised:
        load_plan(plan)
    assert raised.value.problems == [  # type: ignore[attr-defined]
        "context[1]._uid: duplicate _uid 'a' (first used by context[0])",
        "context[1].state: must be an object, got list",
    ]


@pytest.mark.processes
def test_the_sentiment_example_runs_as_the_readme_shows() -> None:
    proc = run_cli("run-plan", "examples/plans/sentiment.json")
    assert proc.returncode == 0, proc.stderr
    final = json.loads(proc.stdout)
    assert {uid: (s["sentiment"], s["reply"]["text"].split(":")[0]) for uid, s in final.items()} == {
        "①": ("positive", "Glad to hear it"),
        "②": ("negative", "Sorry about that"),
        "③": ("neutral", "Thanks"),
    }


@pytest.mark.processes
def test_a_literal_every_call_shares_is_checked_before_anything_runs(tmp_path: Path) -> None:
    plan = json.loads((Path(__file__).parents[2] / "examples" / "plans" / "sentiment.json").read_text(encoding="utf-8"))
    for call in plan["calls"][:3]:
        call["function"] = "examples.sentiment:analyse"
    line = assert_one_line_error(run_cli("run-plan", write_wf(tmp_path, plan, "plan.json")), 2)
    assert "nodes[1] (id 'python-1').params.function: module 'examples.sentiment' has no attribute 'analyse'" in line
