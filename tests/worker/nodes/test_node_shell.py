"""The `shell` node: real subprocesses, exit codes as the `error` action, and injection safety."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import scheduler
from worker.nodes.shell import ShellNode, check_command_param
from worker.store import NamespacedStore

PAYLOAD = 'x\'; rm -rf ~; $(touch PWNED) `touch PWNED2` && echo injected "quoted" $HOME'


def run_shell(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    node = ShellNode()
    node.params = params
    store: dict[str, Any] = {}
    action = node._run(store)
    return action, store


def test_string_command_captures_stdout_stderr_and_exit_code() -> None:
    action, out = run_shell({"command": "printf out; printf err >&2"})
    assert action == "default"
    assert out == {"stdout": "out", "stderr": "err", "exit_code": 0}


def test_nonzero_exit_writes_error_and_returns_error_action() -> None:
    action, out = run_shell({"command": "echo first >&2; echo last-line >&2; echo partial; exit 3"})
    assert action == "error"
    assert out["exit_code"] == 3
    assert out["stdout"] == "partial\n"
    assert out["error"] == "exit code 3: last-line"


def test_nonzero_exit_without_stderr() -> None:
    action, out = run_shell({"command": ["false"]})
    assert action == "error"
    assert out["error"] == "exit code 1"


def test_stdin_is_fed_to_the_command() -> None:
    _, out = run_shell({"command": "tr a-z A-Z", "stdin": "hello\nworld"})
    assert out["stdout"] == "HELLO\nWORLD"


def test_list_command_runs_without_a_shell() -> None:
    _, out = run_shell({"command": ["printf", "%s|%s", PAYLOAD, 7]})
    assert out["stdout"] == f"{PAYLOAD}|7"


def test_env_is_added_to_the_inherited_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CF_PARENT", "from-parent")
    _, out = run_shell({"command": 'printf "%s %s" "$CF_PARENT" "$CF_GREETING"', "env": {"CF_GREETING": "hi"}})
    assert out["stdout"] == "from-parent hi"
    assert "CF_GREETING" not in os.environ


def test_cwd(tmp_path: Any) -> None:
    _, out = run_shell({"command": "pwd -P", "cwd": str(tmp_path)})
    assert out["stdout"].strip() == os.path.realpath(tmp_path)


def test_timeout_raises_naming_command_and_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"sleep 30.*0\.3s"):
        run_shell({"command": "sleep 30; echo never", "timeout": 0.3})
    assert time.monotonic() - started < 10


def test_vars_reach_the_shell_only_as_environment_values(tmp_path: Any) -> None:
    action, out = run_shell({"command": 'printf "%s" "$payload"', "vars": {"payload": PAYLOAD}, "cwd": str(tmp_path)})
    assert action == "default"
    assert out["stdout"] == PAYLOAD
    assert os.listdir(tmp_path) == []  # neither $(...) nor `...` ran


def test_vars_non_strings_are_rendered_as_json() -> None:
    _, out = run_shell(
        {"command": 'printf "%s %s %s" "$n" "$flag" "$obj"', "vars": {"n": 3, "flag": True, "obj": {"a": 1}}}
    )
    assert out["stdout"] == '3 true {"a": 1}'


def test_outputs_go_to_the_node_namespace() -> None:
    root: dict[str, Any] = {"other": 1}
    node = ShellNode()
    node.params = {"command": ["printf", "ns"]}
    node._run(NamespacedStore(root, "sh"))
    assert root == {"other": 1, "sh": {"stdout": "ns", "stderr": "", "exit_code": 0}}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({}, "shell: param 'command' is required"),
        ({"command": 5}, "shell: param 'command' must be"),
        ({"command": "   "}, "shell: param 'command' must be"),
        ({"command": ["echo", {"a": 1}]}, "shell: param 'command' must be"),
        ({"command": "true", "stdin": 5}, "shell: param 'stdin'"),
        ({"command": "true", "timeout": "soon"}, "shell: param 'timeout'"),
        ({"command": "true", "timeout": 0}, "shell: param 'timeout'"),
        ({"command": "true", "env": ["A=1"]}, "shell: param 'env' must be a dict"),
        ({"command": "true", "vars": {"bad-name": "x"}}, "shell: param 'vars' has an invalid variable name"),
        ({"command": "true", "cwd": 3}, "shell: param 'cwd'"),
        ({"command": "true", "vars": {"BASH_ENV": "x"}}, "shell: param 'vars' sets 'BASH_ENV'"),
    ],
)
def test_bad_params_raise_value_error(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        run_shell(params)
    assert "\n" not in str(info.value)


def test_check_command_param_rejects_templates_in_a_command_string() -> None:
    message = check_command_param({"command": "echo ${user.name} | wc -c"})
    assert message is not None
    assert "'command'" in message and "${user.name}" in message and "vars" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "raw",
    [
        {"command": 'echo "$name"', "vars": {"name": "${user.name}"}},
        {"command": ["echo", "${user.name}"]},
        {"command": "echo ${HOME:-/tmp} ${#PATH}"},  # shell expansions the template engine leaves alone
        {"command": ["sh", "-c", 'echo "$v"'], "vars": {"v": "${item}"}},
        {"command": ["sh", "-c", 'echo "$1"', "sh", "${item}"]},  # $0 and $1 are not code
        {"command": ["sh", "run.sh", "${item}"]},  # a script file's arguments are not code
        {"command": ["bash", "-e", "-o", "pipefail", "run.sh", "${item}"]},
        {"command": ["sh", "--", "${script}", "${item}"]},  # after --, a value is the script file
        {"command": ["sh", "./${name}.sh"]},  # starts with "./": an operand whatever the value
        {"command": ["grep", "-c", "bash", "${item}"]},  # a shell's name as data
        {"command": ["grep", "-c", "bash"], "stdin": "${item}"},
        {"command": "tr a-z A-Z", "stdin": "${item}"},
        {"command": ["sh", "run.sh"], "stdin": "${item}"},  # the script file reads stdin as data
        {"command": "sh run.sh", "stdin": "${item}"},
        {"command": ["sh", "-c", "cat"], "stdin": "${item}"},
        {"command": "sh", "stdin": "echo literal"},
        {"command": "true", "env": {"PS4": "+ ", "X": "${item}"}},
        {},
        {"command": None},
        "not a dict",
    ],
)
def test_check_command_param_accepts_safe_forms(raw: dict[str, Any]) -> None:
    assert check_command_param(raw) is None


@pytest.mark.parametrize(
    ("raw", "names"),
    [
        ({"command": ["/bin/sh", "-c", "echo ${item}"]}, ["'command'", "'/bin/sh -c'"]),
        ({"command": ["/usr/bin/env", "bash", "-lc", "echo ${item}"]}, ["'command'", "'bash -lc'"]),
        ({"command": ["ksh93", "-c", "-x", "echo ${item}"]}, ["'command'", "'ksh93 -c'"]),  # options after -c
        ({"command": ["sh", "-o", "errexit", "-ec", "${item}"]}, ["'command'", "'sh -ec'"]),
        ({"command": ["sudo", "-u", "app", "zsh", "${item}"]}, ["'command'", "reads its options"]),
        ({"command": ["xargs", "sh", "-c", "echo ${item}"]}, ["'command'", "'sh -c'"]),
        ({"command": "sh", "stdin": "echo ${item}"}, ["'stdin'", "'sh' runs its stdin"]),
        ({"command": ["sh", "-s", "a"], "stdin": "${item}"}, ["'stdin'"]),
        ({"command": "echo $(bash)", "stdin": "${item}"}, ["'stdin'", "'bash'"]),
        ({"command": ". /dev/stdin", "stdin": "${item}"}, ["'stdin'", "'.'"]),
        ({"command": "true", "env": {"BASH_ENV": "${item}"}}, ["'env'", "'BASH_ENV'"]),
        ({"command": "true", "vars": {"PROMPT_COMMAND": "${item}"}}, ["'vars'", "'PROMPT_COMMAND'"]),
    ],
)
def test_check_command_param_rejects_templates_a_shell_reads_as_code(raw: dict[str, Any], names: list[str]) -> None:
    message = check_command_param(raw)
    assert message is not None
    assert all(name in message for name in names), message
    assert "pass the value in 'vars' and use \"$name\"" in message
    assert "\n" not in message


def test_end_to_end_template_through_vars_stays_literal(tmp_path: Any) -> None:
    workflow = {
        "nodes": [
            {
                "id": "greet",
                "type": "shell",
                "params": {"command": 'printf "hello %s" "$who"', "vars": {"who": "${name}"}, "cwd": str(tmp_path)},
            },
            {"id": "show", "type": "echo", "params": {"text": "${greet.stdout}"}},
        ]
    }
    result = scheduler.run(workflow, {"name": PAYLOAD})
    assert result.status == "success"
    assert result.shared["greet"]["stdout"] == f"hello {PAYLOAD}"
    assert result.shared["show"]["text"] == f"hello {PAYLOAD}"
    assert os.listdir(tmp_path) == []


def test_end_to_end_nonzero_exit_fails_the_run() -> None:
    result = scheduler.run({"nodes": [{"id": "bad", "type": "shell", "params": {"command": "echo boom >&2; exit 4"}}]})
    assert result.status == "failed"
    assert result.shared["bad"]["exit_code"] == 4
    assert "exit code 4: boom" in (result.error or "")


def test_end_to_end_error_edge_routes_the_error_action() -> None:
    workflow = {
        "nodes": [
            {"id": "bad", "type": "shell", "params": {"command": "exit 2"}},
            {"id": "handler", "type": "echo", "params": {"handled": "${bad.error}"}},
        ],
        "edges": [{"from": "bad", "to": "handler", "action": "error"}],
    }
    result = scheduler.run(workflow)
    assert result.shared["handler"] == {"handled": "exit code 2"}


def test_end_to_end_batch_items_stay_literal(backend: str) -> None:
    items = ["plain", "a; echo injected", "$(echo sub)", "fail"]
    workflow = {
        "nodes": [
            {
                "id": "each",
                "type": "shell",
                "params": {"command": 'test "$v" != fail || exit 9; printf %s "$v"', "vars": {"v": "${item}"}},
                "batch": {"items": "${things}", "error_handling": "continue"},
            }
        ]
    }
    result = scheduler.run(workflow, {"things": items}, backend=backend)
    agg = result.shared["each"]
    assert [r["stdout"] for r in agg["results"]] == ["plain", "a; echo injected", "$(echo sub)", ""]
    assert agg["error_count"] == 1
    assert agg["errors"][0]["index"] == 3 and agg["errors"][0]["error"]
