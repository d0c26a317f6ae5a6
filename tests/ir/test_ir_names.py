"""Names (ir/names.py): node ids, inputs, outputs and template paths accept Unicode letters; bad names said in words."""

from __future__ import annotations

import pytest

import ir
from ir.templates import references
from tests.support import workflow

RULE = "may contain only letters, digits, '_' and '-', and must not start with a digit or '-'"


def _problems(wf: dict) -> list[str]:
    with pytest.raises(ir.ValidationError) as info:
        ir.load(wf)
    return info.value.problems


def test_unicode_node_id_input_name_and_template() -> None:
    wf = ir.load(
        workflow(
            {"id": "données", "type": "echo", "params": {"v": "${entrée}"}},
            {
                "id": "b",
                "type": "echo",
                "params": {"v": "${données.x}"},
                "batch": {"items": "${données.liste}", "as": "élément"},
            },
            inputs={"entrée": {}},
            outputs={"résultat": {"source": "${données.x}"}},
        )
    )
    assert [n.id for n in wf.nodes] == ["données", "b"]
    assert wf.nodes[1].batch.alias == "élément"
    assert [r.path for r in references("${données.x[0].clé}")] == [("données", "x", 0, "clé")]


def test_unicode_template_to_unknown_node_is_reported_as_a_reference() -> None:
    problems = _problems(
        workflow({"id": "données", "type": "echo"}, {"id": "b", "type": "echo", "params": {"v": "${donnée.x}"}})
    )
    assert problems == [
        "nodes[1] (id 'b').params.v: ${donnée.x} refers to unknown node or input 'donnée' (did you mean 'données'?)"
    ]


@pytest.mark.parametrize("node_id", ["x y", "1a", "-a", "a.b", "é\u0301"])
def test_bad_node_id_said_in_words(node_id: str) -> None:
    assert _problems(workflow({"id": node_id, "type": "echo"})) == [f"nodes[0].id: node id {node_id!r} {RULE}"]


def test_bad_node_id_reports_nothing_that_follows_from_it() -> None:
    wf = workflow({"id": "x y", "type": "echo"}, {"id": "b", "type": "echo", "batch": {"items": "${x y.files}"}})
    assert _problems(wf) == [f"nodes[0].id: node id 'x y' {RULE}"]


def test_bad_input_and_output_names() -> None:
    wf = workflow({"id": "a", "type": "echo"}, inputs={"x y": {}}, outputs={"-o": {"source": "${a.x}"}})
    assert _problems(wf) == [f"inputs: input name 'x y' {RULE}", f"outputs: output name '-o' {RULE}"]


def test_dash_inside_names_is_allowed_but_not_in_batch_alias() -> None:
    wf = ir.load(
        workflow({"id": "fetch-page", "type": "echo"}, {"id": "b", "type": "echo", "params": {"v": "${fetch-page.x}"}})
    )
    assert [n.id for n in wf.nodes] == ["fetch-page", "b"]
    assert _problems(workflow({"id": "a", "type": "echo", "batch": {"items": "${x}", "as": "an-item"}})) == [
        "nodes[0] (id 'a').batch.as: batch.as must be a valid identifier, got 'an-item'"
    ]
