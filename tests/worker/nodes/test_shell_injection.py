"""Item values never become shell code.

Every form validation accepts keeps an item's value data on both backends: injection strings run
through it as batch items and no marker file appears. Every form where a shell would read the value
as code (`sh -c ARG`, a shell's stdin, BASH_ENV) is refused by validation with the `vars` hint, and a
control shows that the same form, run without validation, does create the marker.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ir
import scheduler
from worker.nodes.shell import ShellNode

ROOT = Path(__file__).parents[3]
#: Shell syntax an item may carry; `{marker}` becomes an absolute path that only a shell running the
#: value as code would create.
INJECTIONS = [
    "x; touch {marker}",
    "$(touch {marker})",
    "`touch {marker}`",
    "x\ntouch {marker}",
    "x && touch {marker} #",
    "'; touch {marker}; '",
    '"; touch {marker}; "',
    "-c",  # an option where a shell would still read options
]
VARS_HINT = "pass the value in 'vars' and use \"$name\""


@pytest.fixture
def markers(tmp_path: Path) -> Path:
    """The directory an injection would write into; it must stay empty."""
    path = tmp_path / "pwned"
    path.mkdir()
    return path


def payloads(markers: Path) -> list[str]:
    return [text.format(marker=markers / f"p{i}") for i, text in enumerate(INJECTIONS)]


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return str(path)


def batch_workflow(params: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "id": "each",
                "type": "shell",
                "params": params,
                "batch": {"items": "${things}", "error_handling": "continue"},
            }
        ]
    }


def accepted_forms(show_arg: str, show_stdin: str) -> dict[str, tuple[dict[str, Any], str]]:
    """Each accepted form and how its stdout shows the item (`{}` is the item), given the two scripts."""
    return {
        "vars in a command string": ({"command": 'printf %s "$v"', "vars": {"v": "${item}"}}, "{}"),
        "vars in sh -c": ({"command": ["/bin/sh", "-c", 'printf %s "$v"'], "vars": {"v": "${item}"}}, "{}"),
        "vars in env bash -ec": (
            {"command": ["/usr/bin/env", "bash", "-ec", 'printf %s "$v"'], "vars": {"v": "${item}"}},
            "{}",
        ),
        "env value in a command string": ({"command": 'printf %s "$V"', "env": {"V": "${item}"}}, "{}"),
        "argv of a program": ({"command": ["printf", "%s", "${item}"]}, "{}"),
        "template inside an argv entry": ({"command": ["printf", "%s", "<${item}>"]}, "<{}>"),
        "sh script positional arg": ({"command": ["sh", show_arg, "${item}"]}, "{}"),
        "bash script after options": ({"command": ["bash", "-e", "-o", "pipefail", show_arg, "${item}"]}, "{}"),
        "sh -c positional arg": ({"command": ["sh", "-c", 'printf %s "$1"', "sh", "${item}"]}, "{}"),
        "stdin of a program": ({"command": "cat", "stdin": "${item}"}, "{}"),
        "stdin of a shell script file": ({"command": ["sh", show_stdin], "stdin": "${item}"}, "{}"),
        "stdin of a program under sh -c": ({"command": ["sh", "-c", "cat"], "stdin": "${item}"}, "{}"),
    }


ACCEPTED = list(accepted_forms("show.sh", "cat.sh"))


@pytest.mark.parametrize("form", ACCEPTED)
def test_accepted_forms_keep_injection_strings_literal(form: str, backend: str, tmp_path: Path, markers: Path) -> None:
    show_arg = script(tmp_path, "show.sh", 'printf %s "$1"\n')
    params, shown = accepted_forms(show_arg, script(tmp_path, "cat.sh", "cat\n"))[form]
    items = payloads(markers)
    result = scheduler.run(batch_workflow(params), {"things": items}, backend=backend)
    agg = result.shared["each"]
    assert agg["errors"] is None, agg["errors"]
    assert [r["stdout"] for r in agg["results"]] == [shown.replace("{}", item) for item in items]
    assert list(markers.iterdir()) == []


#: (params, the param the message names, the template it names): forms where a shell reads the item as code.
REJECTED = [
    ({"command": ["/bin/sh", "-c", "echo ${item}"]}, "command", "${item}"),  # the probe
    ({"command": "sh", "stdin": "echo ${item}"}, "stdin", "${item}"),  # the probe
    ({"command": "echo ${item}"}, "command", "${item}"),
    ({"command": ["/usr/bin/env", "bash", "-c", "echo ${item}"]}, "command", "${item}"),
    ({"command": ["bash", "-lc", "echo ${item}"]}, "command", "${item}"),
    ({"command": ["sh", "-ec", "echo ${item}"]}, "command", "${item}"),
    ({"command": ["sh", "-c", "${item}"]}, "command", "${item}"),
    ({"command": ["sh", "-c", "--", "${item}"]}, "command", "${item}"),
    ({"command": ["sh", "-o", "errexit", "-c", "echo ${item}"]}, "command", "${item}"),
    ({"command": ["sh", "${item}", "-c", "true"]}, "command", "${item}"),  # the value could be -c
    ({"command": ["nice", "sh", "${item}"]}, "command", "${item}"),
    ({"command": ["find", "/", "-maxdepth", "0", "-exec", "sh", "-c", "echo ${item}", ";"]}, "command", "${item}"),
    ({"command": ["sh"], "stdin": "${item}"}, "stdin", "${item}"),
    ({"command": ["/usr/bin/env", "bash", "-s", "arg"], "stdin": "${item}"}, "stdin", "${item}"),
    ({"command": ["bash", "/dev/stdin"], "stdin": "${item}"}, "stdin", "${item}"),
    ({"command": "cat | sh", "stdin": "${item}"}, "stdin", "${item}"),
    ({"command": "X=1 exec bash 2>/dev/null", "stdin": "${item}"}, "stdin", "${item}"),
    ({"command": ["sh", "-c", "tr -d x | sh"], "stdin": "${item}"}, "stdin", "${item}"),
    ({"command": ["bash", "-c", "true"], "env": {"BASH_ENV": "${item}"}}, "env", "${item}"),
    ({"command": ["bash", "-c", "true"], "vars": {"BASH_ENV": "${item}"}}, "vars", "BASH_ENV"),
]


@pytest.mark.parametrize(("params", "name", "template"), REJECTED, ids=[str(p) for p, _, _ in REJECTED])
def test_forms_that_give_a_shell_the_item_as_code_are_rejected(
    params: dict[str, Any], name: str, template: str, backend: str, markers: Path
) -> None:
    with pytest.raises(ir.ValidationError) as info:
        scheduler.run(batch_workflow(params), {"things": payloads(markers)}, backend=backend)
    [problem] = info.value.problems
    assert f"shell: param '{name}'" in problem and template in problem and VARS_HINT in problem
    assert list(markers.iterdir()) == []


def test_compile_reports_every_problem_of_a_node_on_one_line() -> None:
    params = {"command": ["sh", "-c", "echo ${a}"], "stdin": "${b}", "vars": {"PS4": "${c}"}}
    with pytest.raises(ir.ValidationError) as info:
        scheduler.compile({"nodes": [{"id": "n", "type": "shell", "params": params}]})
    [problem] = info.value.problems
    assert "'command'" in problem and "'vars'" in problem and "'PS4'" in problem
    assert "${a}" in problem and "\n" not in problem


@pytest.mark.processes
def test_chordflow_validate_rejects_the_probe(tmp_path: Path) -> None:
    workflow = batch_workflow({"command": ["/bin/sh", "-c", "echo ${item}"]})
    path = tmp_path / "wf.json"
    path.write_text(json.dumps(workflow), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "scheduler.cli", "validate", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "'/bin/sh -c'" in proc.stderr and "${item}" in proc.stderr and VARS_HINT in proc.stderr


def run_node(params: dict[str, Any]) -> dict[str, Any]:
    """The node alone, with params already resolved: what would run if validation let the form through."""
    node = ShellNode()
    node.params = params
    store: dict[str, Any] = {}
    node._run(store)
    return store


@pytest.mark.parametrize(
    "resolved",
    [
        lambda v: {"command": ["/bin/sh", "-c", f"echo {v}"]},
        lambda v: {"command": "sh", "stdin": f"echo {v}"},
        lambda v: {"command": ["bash", "-c", "true"], "env": {"BASH_ENV": v}},
    ],
    ids=["sh -c ARG", "sh reading stdin", "BASH_ENV"],
)
def test_control_the_rejected_forms_do_inject_when_nothing_stops_them(resolved: Any, markers: Path) -> None:
    """Shows the marker check can fail: the refused forms are live injections, not hypothetical ones."""
    run_node(resolved(f"$(touch {markers / 'p'})"))
    assert [p.name for p in markers.iterdir()] == ["p"]


def test_vars_from_a_template_cannot_set_a_variable_shells_run(backend: str, markers: Path) -> None:
    """A whole `vars` dict from the store is checked when the item runs: BASH_ENV fails that item."""
    workflow = batch_workflow({"command": ["bash", "-c", 'printf %s "$v"'], "vars": "${item}"})
    items = [{"v": "ok"}, {"BASH_ENV": f"$(touch {markers / 'p'})"}]
    result = scheduler.run(workflow, {"things": items}, backend=backend)
    agg = result.shared["each"]
    assert agg["results"][0]["stdout"] == "ok"
    assert [e["index"] for e in agg["errors"]] == [1]
    assert "'BASH_ENV'" in agg["errors"][0]["error"] and VARS_HINT in agg["errors"][0]["error"]
    assert list(markers.iterdir()) == []
