"""Batch node processing, the normative contract: one test per test criterion 1-29, plus the batch contract
(docs/ARCHITECTURE.md).

Tests that go through `scheduler.run` take the `backend` fixture and assert on the returned store only.
Tests that must watch each item's execution (criteria 6, 8, 9, 11, 13, 26) run the compiled flow
in-process and read the test nodes' records.
"""

from __future__ import annotations

import copy
import re

import pocketflow
import pytest

import ir
import scheduler
from tests.support import AGGREGATE_KEYS, batch_node, chain, chain_names, run_in_process, workflow
from tests.support import nodes as tn


def _wf_one(node: dict) -> dict:
    return workflow(node)


def _agg(result: scheduler.RunResult, node_id: str = "b") -> dict:
    assert result.status == "success"
    return result.shared[node_id]


def _raises_validation(node: dict, message: str) -> ir.ValidationError:
    with pytest.raises(ir.ValidationError, match=re.escape(message)) as info:
        ir.load(_wf_one(node))
    assert isinstance(info.value, ValueError)
    return info.value


# --- 1-4: validation ------------------------------------------------------------------------------------


def test_c01_valid_batch_config_passes():
    wf = ir.load(_wf_one(batch_node(items="${x}", **{"as": "item", "error_handling": "fail_fast"})))
    batch = wf.nodes[0].batch
    assert batch is not None
    assert batch.items == "${x}"
    assert batch.alias == "item"
    assert batch.error_handling == "fail_fast"
    # Also accepted by the compiler (node types known).
    assert scheduler.compile(wf).start_node is not None


def test_c02_items_not_template_rejected():
    err = _raises_validation(batch_node(items="not_template"), "batch.items must be a template reference")
    assert "nodes[0]" in str(err)


def test_c02_items_missing_or_not_string_rejected():
    node = batch_node()
    del node["batch"]["items"]
    _raises_validation(node, "batch.items is required")
    _raises_validation(batch_node(items=["${x}"]), "batch.items must be a template reference")
    _raises_validation(batch_node(items="${x} and more"), "batch.items must be a template reference")


def test_c03_alias_invalid_identifier_rejected():
    _raises_validation(batch_node(**{"as": "123invalid"}), "batch.as must be a valid identifier")
    _raises_validation(batch_node(**{"as": "has-dash"}), "batch.as must be a valid identifier")
    _raises_validation(batch_node(**{"as": ""}), "batch.as must be a valid identifier")


def test_c04_error_handling_invalid_rejected():
    _raises_validation(batch_node(error_handling="invalid"), "batch.error_handling must be 'fail_fast' or 'continue'")


def test_c02_c03_invalid_example_reports_both_problems():
    """The contract's "Invalid batch configuration" example: both problems in one ValidationError."""
    err = _raises_validation(
        batch_node(items="not_a_template", **{"as": "123invalid"}), "batch.items must be a template reference"
    )
    assert "batch.as must be a valid identifier" in str(err)
    assert len(err.problems) == 2


# --- 5: wrapper chain -----------------------------------------------------------------------------------


def test_c05_wrapper_chain_order():
    flow = scheduler.compile(_wf_one(batch_node()))
    assert isinstance(flow, pocketflow.Flow)
    nodes = chain(flow.start_node)
    assert [type(n).__name__ for n in nodes] == [
        "InstrumentedNode",
        "PflowBatchNode",
        "NamespacedNode",
        "TemplateNode",
        "UpperNode",
    ]
    assert isinstance(nodes[1], pocketflow.BatchNode)
    assert isinstance(nodes[-1], tn.UpperNode)


# --- 6-12: per-item execution ---------------------------------------------------------------------------


def _record_wf(**batch) -> dict:
    return _wf_one(batch_node(node_type="test-record", params={"item": "${item}"}, **batch))


def test_c06_three_items_three_isolated_executions():
    shared = {"x": ["a", "b", "c"]}
    run_in_process(_record_wf(), shared)
    assert tn.recorded() == [(0, "a"), (1, "b"), (2, "c")]
    stores = [c.store for c in tn.RECORDS]
    assert len({id(s) for s in stores}) == 3, "each item must get its own copy"
    assert all(s is not shared for s in stores)
    assert [s["item"] for s in stores] == ["a", "b", "c"]


def test_c07_items_string_raises_value_error(backend):
    with pytest.raises(ValueError, match=r"^Batch items must be an array, got str$"):
        scheduler.run(_wf_one(batch_node()), shared={"x": "string"}, backend=backend)


def test_c08_item_gets_shallow_copy_with_alias():
    upstream = {"nested": [1, 2]}
    shared = {"x": ["a", "b"], "upstream": upstream, "plain": 7}
    run_in_process(_wf_one(batch_node(node_type="test-record", params={"item": "${file}"}, **{"as": "file"})), shared)
    assert tn.recorded() == [(0, "a"), (1, "b")]
    for index, call in enumerate(tn.RECORDS):
        store = call.store
        assert store is not shared
        assert store["file"] == shared["x"][index]  # alias injected
        assert store["__index__"] == index
        # dict(shared): every original key, values shared by reference (shallow copy).
        assert set(shared) <= set(store)
        assert store["upstream"] is upstream
        assert store["x"] is shared["x"]
        assert store["plain"] == 7
        # The node's own namespace is fresh for every item.
        assert store["b"] == {"value": shared["x"][index]}
    assert tn.RECORDS[0].store["b"] is not tn.RECORDS[1].store["b"]


def test_c09_original_shared_untouched_during_iteration():
    class Watched(dict):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.writes: list[tuple[str, int]] = []

        def __setitem__(self, key, value):
            self.writes.append((key, len(tn.RECORDS)))
            super().__setitem__(key, value)

    shared = Watched(x=["a", "b", "c"])
    tn.OBSERVER["fn"] = lambda: ("item" in shared, "b" in shared)
    run_in_process(_record_wf(), shared)
    # While each item ran, the original store had neither the alias nor the node's output.
    assert [c.observed for c in tn.RECORDS] == [(False, False)] * 3
    # Exactly one write to the original store: the aggregate, after all three items.
    assert shared.writes == [("b", 3)]
    assert "item" not in shared


def test_c10_original_node_key_holds_only_aggregate(backend):
    shared = {"x": ["a", "b"], "keep": {"k": 1}}
    before = copy.deepcopy(shared)
    result = scheduler.run(_wf_one(batch_node()), shared=shared, backend=backend)
    assert set(result.shared["b"]) == AGGREGATE_KEYS
    # Nothing else was added to (or changed in) the original store: no alias, no __index__.
    assert set(result.shared) == set(before) | {"b"}
    assert {k: v for k, v in result.shared.items() if k != "b"} == before


def test_c11_result_is_item_namespace():
    shared = {"x": [{"n": 1}, {"n": 2}]}
    wf = _wf_one(batch_node(node_type="echo", params={"first": "${item.n}", "whole": "${item}"}))
    run_in_process(wf, shared)
    assert shared["b"]["results"] == [{"first": 1, "whole": {"n": 1}}, {"first": 2, "whole": {"n": 2}}]


def test_c11_result_is_item_namespace_dict_itself():
    shared = {"x": ["a", "b"]}
    run_in_process(_record_wf(), shared)
    # The result IS item_shared.get(node_id): the same dict object the item's node wrote into.
    for call, result in zip(tn.RECORDS, shared["b"]["results"], strict=True):
        assert result is call.store["b"]
        assert result == {"value": call.item}


def test_c11_whole_namespace_captured(backend):
    wf = _wf_one(batch_node(node_type="echo", params={"a": "${item}", "b": "x-${item}"}))
    result = scheduler.run(wf, shared={"x": ["p", "q"]}, backend=backend)
    assert _agg(result)["results"] == [{"a": "p", "b": "x-p"}, {"a": "q", "b": "x-q"}]


def test_c12_results_in_input_order(backend):
    items = ["c", "a", "b", "e", "d"]
    result = scheduler.run(_wf_one(batch_node()), shared={"x": items}, backend=backend)
    assert _agg(result)["results"] == [{"value": i.upper()} for i in items]


# --- 13-18: errors --------------------------------------------------------------------------------------


def _fail_wf(**batch) -> dict:
    return _wf_one(batch_node(node_type="test-fail", params={"value": "${item}", "fail_on": "b"}, **batch))


def test_c13_fail_fast_propagates_original_exception_shared_unchanged(backend):
    shared = {"x": ["a", "b", "c"], "__llm_calls__": [{"pre": True}], "keep": {"k": [1]}}
    before = copy.deepcopy(shared)
    with pytest.raises(ValueError, match=r"^boom b$") as info:
        scheduler.run(_fail_wf(error_handling="fail_fast"), shared=shared, backend=backend)
    assert type(info.value) is ValueError
    assert shared == before
    assert "b" not in shared


def test_c13_fail_fast_stops_execution():
    shared = {"x": ["a", "b", "c"]}
    before = copy.deepcopy(shared)
    wf = _wf_one(batch_node(node_type="test-record", params={"item": "${item}", "fail_on": "b"}))
    with pytest.raises(ValueError, match=r"^boom b$"):
        run_in_process(wf, shared)
    assert tn.recorded() == [(0, "a"), (1, "b")], "item 3 must not run after item 2 failed"
    assert shared == before


def test_c14_error_string_detected_and_next_item_runs(backend):
    wf = _wf_one(
        batch_node(
            node_type="test-error-string", params={"value": "${item}", "error_on": "b"}, error_handling="continue"
        )
    )
    agg = _agg(scheduler.run(wf, shared={"x": ["a", "b", "c"]}, backend=backend))
    assert agg["results"] == [{"value": "a"}, {"value": "Error: b is bad"}, {"value": "c"}]
    assert agg["error_count"] == 1
    assert agg["success_count"] == 2
    assert agg["errors"] == [{"index": 1, "item": "b", "error": "Error: b is bad"}]


def test_c15_none_result_is_success(backend):
    """The item result is the item's namespace dict: a node returning None and writing nothing gives an
    empty namespace, which counts as a success (the batch contract: "None or an empty namespace")."""
    wf = _wf_one(batch_node(node_type="test-none", params={}, error_handling="continue"))
    agg = _agg(scheduler.run(wf, shared={"x": ["a", "b", "c"]}, backend=backend))
    assert agg["results"] == [{}, {}, {}]
    assert agg["success_count"] == 3
    assert agg["error_count"] == 0
    assert agg["errors"] is None


def test_c15_none_value_is_success(backend):
    wf = _wf_one(batch_node(node_type="echo", params={"v": "${item}"}, error_handling="continue"))
    agg = _agg(scheduler.run(wf, shared={"x": [None, "a"]}, backend=backend))
    assert agg["results"] == [{"v": None}, {"v": "a"}]
    assert (agg["success_count"], agg["error_count"], agg["errors"]) == (2, 0, None)


def test_c16_node_key_exists_after_completion(backend):
    result = scheduler.run(_wf_one(batch_node()), shared={"x": ["a"]}, backend=backend)
    assert isinstance(result.shared.get("b"), dict)
    assert "results" in result.shared["b"]


def test_c17_results_dict_has_counts(backend):
    agg = _agg(scheduler.run(_fail_wf(error_handling="continue"), shared={"x": ["a", "b", "c"]}, backend=backend))
    assert (agg["count"], agg["success_count"], agg["error_count"]) == (3, 2, 1)
    assert all(isinstance(agg[k], int) for k in ("count", "success_count", "error_count"))


def test_c18_errors_entry_for_raised_item(backend):
    agg = _agg(scheduler.run(_fail_wf(error_handling="continue"), shared={"x": ["a", "b", "c"]}, backend=backend))
    assert agg["errors"] == [{"index": 1, "item": "b", "error": "boom b", "exception_type": "ValueError"}]
    assert agg["results"] == [{"value": "a"}, None, {"value": "c"}]


# --- 19-24: edge cases ----------------------------------------------------------------------------------


def test_c19_empty_items(backend):
    agg = _agg(scheduler.run(_wf_one(batch_node()), shared={"x": []}, backend=backend))
    assert agg == {"results": [], "count": 0, "success_count": 0, "error_count": 0, "errors": None}


def test_c20_items_dict_raises_value_error(backend):
    shared = {"x": {"not": "array"}}
    with pytest.raises(ValueError) as info:
        scheduler.run(_wf_one(batch_node()), shared=shared, backend=backend)
    assert str(info.value) == "Batch items must be an array, got dict"
    assert "b" not in shared


def test_c21_single_item(backend):
    agg = _agg(scheduler.run(_wf_one(batch_node()), shared={"x": ["single"]}, backend=backend))
    assert agg["results"] == [{"value": "SINGLE"}]
    assert agg["count"] == 1


def test_c22_alias_defaults_to_item(backend):
    node = batch_node()
    assert "as" not in node["batch"]
    assert ir.load(_wf_one(node)).nodes[0].batch.alias == "item"
    agg = _agg(scheduler.run(_wf_one(node), shared={"x": ["q"]}, backend=backend))
    assert agg["results"] == [{"value": "Q"}]


def test_c23_error_handling_defaults_to_fail_fast(backend):
    node = batch_node(node_type="test-fail", params={"value": "${item}", "fail_on": "b"})
    assert "error_handling" not in node["batch"]
    assert ir.load(_wf_one(node)).nodes[0].batch.error_handling == "fail_fast"
    shared = {"x": ["a", "b"]}
    with pytest.raises(ValueError, match=r"^boom b$"):
        scheduler.run(_wf_one(node), shared=shared, backend=backend)
    assert "b" not in shared


def test_c24_complex_item_field_template(backend):
    wf = _wf_one(batch_node(node_type="echo", params={"name": "${item.name}", "value": "${item.value}"}))
    agg = _agg(scheduler.run(wf, shared={"x": [{"name": "test", "value": 42}]}, backend=backend))
    assert agg["results"] == [{"name": "test", "value": 42}]
    assert type(agg["results"][0]["value"]) is int


# --- 25-29: integration ---------------------------------------------------------------------------------


def test_c25_non_batch_node_unchanged(backend):
    wf = _wf_one({"id": "u", "type": "test-upper", "params": {"text": "${name}"}})
    names = chain_names(scheduler.compile(wf).start_node)
    assert names == ["InstrumentedNode", "NamespacedNode", "TemplateNode", "UpperNode"]
    assert "PflowBatchNode" not in names
    result = scheduler.run(wf, {"name": "ada"}, backend=backend)
    assert result.status == "success"
    assert result.shared == {"name": "ada", "u": {"value": "ADA"}}


def test_c26_alias_isolated_from_original():
    shared = {"x": ["a", "b"], "item": "original"}
    run_in_process(_record_wf(), shared)
    assert [c.store["item"] for c in tn.RECORDS] == ["a", "b"]
    assert shared["item"] == "original"
    assert shared["b"]["results"] == [{"value": "a"}, {"value": "b"}]


def test_c26_alias_isolated_from_original_store(backend):
    shared = {"x": ["a", "b"], "item": "original"}
    result = scheduler.run(_wf_one(batch_node()), shared=shared, backend=backend)
    assert result.shared["item"] == "original"
    assert _agg(result)["results"] == [{"value": "A"}, {"value": "B"}]


def test_c27_llm_calls_list_shared_with_original(backend):
    calls = [{"pre": True}]
    shared = {"x": ["a", "b", "c"], "__llm_calls__": calls}
    wf = _wf_one(batch_node(node_type="test-llm-calls", params={"item": "${item}"}))
    result = scheduler.run(wf, shared=shared, backend=backend)
    assert result.shared["__llm_calls__"] is calls
    assert calls == [
        {"pre": True},
        {"index": 0, "item": "a"},
        {"index": 1, "item": "b"},
        {"index": 2, "item": "c"},
    ]
    assert _agg(result)["results"] == [{"value": "a"}, {"value": "b"}, {"value": "c"}]


def test_c28_cross_node_reference(backend):
    wf = workflow(
        {"id": "prev", "type": "echo", "params": {"output": "hello", "files": ["f1", "f2"]}},
        batch_node(items="${prev.files}", params={"text": "${prev.output} ${item}"}),
    )
    result = scheduler.run(wf, backend=backend)
    assert _agg(result)["results"] == [{"value": "HELLO F1"}, {"value": "HELLO F2"}]
    assert result.shared["prev"] == {"output": "hello", "files": ["f1", "f2"]}


def test_c29_multiple_batches_own_namespaces(backend):
    wf = workflow(
        batch_node("first", items="${x}", params={"text": "${item}"}),
        batch_node("second", node_type="echo", items="${first.results}", params={"v": "${item.value}-2"}),
        batch_node("third", node_type="test-fail", items="${y}", params={"value": "${item}"}),
    )
    result = scheduler.run(wf, shared={"x": ["a", "b"], "y": [1, 2, 3]}, backend=backend)
    assert result.shared["first"]["results"] == [{"value": "A"}, {"value": "B"}]
    assert result.shared["first"]["count"] == 2
    assert result.shared["second"]["results"] == [{"v": "A-2"}, {"v": "B-2"}]
    assert result.shared["third"]["results"] == [{"value": 1}, {"value": 2}, {"value": 3}]
    assert result.shared["third"]["count"] == 3
    assert set(result.shared) == {"x", "y", "first", "second", "third"}


# --- the batch contract's details ---------------------------------------------------------------------------


def test_design_index_injected(backend):
    wf = _wf_one(batch_node(node_type="echo", params={"i": "${__index__}", "v": "${item}"}))
    agg = _agg(scheduler.run(wf, shared={"x": ["a", "b", "c"]}, backend=backend))
    assert agg["results"] == [{"i": 0, "v": "a"}, {"i": 1, "v": "b"}, {"i": 2, "v": "c"}]


def test_design_errors_sorted_with_exception_type_and_none_results(backend):
    node = batch_node(
        node_type="test-fail", params={"value": "${item}", "fail": "${item.bad}"}, error_handling="continue"
    )
    items = [{"bad": True}, {"bad": False}, {"bad": True}, {"bad": False}, {"bad": True}]
    agg = _agg(scheduler.run(_wf_one(node), shared={"x": items}, backend=backend))
    assert [e["index"] for e in agg["errors"]] == [0, 2, 4]
    assert all(e["exception_type"] == "ValueError" for e in agg["errors"])
    assert [e["item"] for e in agg["errors"]] == [items[0], items[2], items[4]]
    assert agg["results"][0] is None and agg["results"][2] is None and agg["results"][4] is None
    assert agg["results"][1] == {"value": items[1]}
    assert (agg["success_count"], agg["error_count"]) == (2, 3)


def test_design_error_kinds_in_continue_mode(backend):
    """Each failure kind: raised, `error` action, truthy `error` key, "Error:" string; the last two are not raised."""
    wf = workflow(
        batch_node(
            "act",
            node_type="test-error-action",
            params={"value": "${item}", "error_on": "b"},
            error_handling="continue",
        ),
        batch_node("key", node_type="echo", params={"error": "${item.e}"}, items="${y}", error_handling="continue"),
    )
    result = scheduler.run(wf, shared={"x": ["a", "b"], "y": [{"e": ""}, {"e": "bad thing"}]}, backend=backend)
    act, key = result.shared["act"], result.shared["key"]
    assert act["results"] == [{"value": "a"}, {"value": "b"}]
    assert [(e["index"], e["item"]) for e in act["errors"]] == [(1, "b")]
    assert "exception_type" not in act["errors"][0]
    assert key["results"] == [{"error": ""}, {"error": "bad thing"}]
    assert key["errors"] == [{"index": 1, "item": {"e": "bad thing"}, "error": "bad thing"}]


def test_design_errors_none_when_all_succeed(backend):
    agg = _agg(scheduler.run(_fail_wf(error_handling="continue"), shared={"x": ["a", "c"]}, backend=backend))
    assert agg["errors"] is None
    assert agg["error_count"] == 0


def test_design_fail_fast_non_raising_failure_raises(backend):
    """fail_fast with an "Error:" item (nothing raised) still fails the batch and writes nothing."""
    wf = _wf_one(batch_node(node_type="test-error-string", params={"value": "${item}", "error_on": "b"}))
    shared = {"x": ["a", "b", "c"]}
    with pytest.raises(Exception, match="Error: b is bad"):
        scheduler.run(wf, shared=shared, backend=backend)
    assert "b" not in shared


def test_design_accumulator_merged_in_index_order(backend):
    calls: list = []
    wf = _wf_one(batch_node(node_type="test-llm-calls", params={"item": "${item}"}, error_handling="continue"))
    scheduler.run(wf, shared={"x": list("abcdefgh"), "__llm_calls__": calls}, backend=backend)
    assert calls == [{"index": i, "item": c} for i, c in enumerate("abcdefgh")]


def test_c27_llm_calls_of_failed_item_reach_original_list(backend):
    """Criterion 27, "Shallow copy sharing": an item's append to `__llm_calls__` reaches the original list.
    An item that made its call and then raised (continue mode) still made that call: the entry must not be lost."""
    calls: list = []
    wf = _wf_one(
        batch_node(node_type="test-llm-calls", params={"item": "${item}", "fail_on": "b"}, error_handling="continue")
    )
    result = scheduler.run(wf, shared={"x": ["a", "b", "c"], "__llm_calls__": calls}, backend=backend)
    assert _agg(result)["errors"] == [{"index": 1, "item": "b", "error": "boom b", "exception_type": "ValueError"}]
    assert calls == [{"index": 0, "item": "a"}, {"index": 1, "item": "b"}, {"index": 2, "item": "c"}]


def test_design_accumulator_absent_is_not_created(backend):
    wf = _wf_one(batch_node(node_type="test-llm-calls", params={"item": "${item}"}))
    result = scheduler.run(wf, shared={"x": ["a"]}, backend=backend)
    assert "__llm_calls__" not in result.shared
    assert _agg(result)["results"] == [{"value": "a"}]
