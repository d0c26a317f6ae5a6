"""The `chordflow` CLI, run as a subprocess from the repo root: output, messages and exit codes."""

from __future__ import annotations

import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from pocketflow import Node
from rich.console import Console

import scheduler
from ir.errors import (
    BatchItemsError,
    CliUsageError,
    RemoteError,
    StoreFull,
    TemplateError,
    ValidationError,
    WorkflowFailed,
)
from scheduler.cli.display import ProgressDisplay
from scheduler.cli.errors import error_lines, exit_code_for
from scheduler.cli.workflows import _params_text
from worker.runs.record import RUN_ID_RULE

ROOT = Path(__file__).parents[3]


def cli_env(**extra: str) -> dict[str, str]:
    """The subprocess environment: wide output, and the `python` node type available.

    While `worker.nodes` does not import the `python` node module itself, it is loaded as a plugin
    (CHORDFLOW_PLUGINS) in the CLI subprocess only.
    """
    from worker.nodes import names

    env = dict(os.environ)
    env["COLUMNS"] = "200"
    if "python" not in names():
        plugins = [p for p in env.get("CHORDFLOW_PLUGINS", "").split(",") if p.strip()]
        env["CHORDFLOW_PLUGINS"] = ",".join([*plugins, "worker.nodes.python_call"])
    env.update(extra)
    return env


def run_cli(*args: Any, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduler.cli", *map(str, args)],
        cwd=ROOT,
        env=env or cli_env(),
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )


def write_wf(tmp_path: Path, data: Any, name: str = "wf.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def err_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = err_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


BATCH_WF = {
    "inputs": {"greeting": {"description": "prefix", "required": True}},
    "nodes": [
        {"id": "src", "type": "echo", "params": {"records": ["a", "b", "c"]}},
        {
            "id": "each",
            "type": "echo",
            "batch": {"items": "${src.records}", "as": "rec"},
            "params": {"text": "${greeting} ${rec}"},
        },
    ],
    "outputs": {"n": {"source": "${each.count}"}},
}

CONTINUE_WF = {
    "nodes": [
        {"id": "src", "type": "echo", "params": {"records": ["ok-0", "Error: bad one", "ok-2", "Error: bad three"]}},
        {
            "id": "each",
            "type": "echo",
            "batch": {"items": "${src.records}", "error_handling": "continue"},
            "params": {"value": "${item}"},
        },
    ],
    "outputs": {"failed": {"source": "${each.error_count}"}},
}


# -- run -------------------------------------------------------------------------------------------------------


@pytest.mark.processes
def test_run_json_output_prints_one_report_object(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, BATCH_WF), "--input", "greeting=hi", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)  # stdout is exactly one JSON document
    assert list(report) == ["run_id", "status", "error", "outputs", "store"]
    assert (report["status"], report["error"], report["outputs"]) == ("success", None, {"n": 3})
    assert isinstance(report["run_id"], str) and len(report["run_id"]) == 12
    store = report["store"]
    assert store["greeting"] == "hi"
    agg = store["each"]
    assert agg["results"] == [{"text": "hi a"}, {"text": "hi b"}, {"text": "hi c"}]
    assert (agg["count"], agg["success_count"], agg["error_count"], agg["errors"]) == (3, 3, 0, None)
    assert proc.stderr == ""  # no progress bar without a TTY


@pytest.mark.processes
def test_run_inputs_are_json_when_they_parse_and_override_the_inputs_file(tmp_path: Path) -> None:
    wf = {"nodes": [{"id": "show", "type": "echo", "params": {"n": "${n}", "s": "${s}", "l": "${l}", "f": "${f}"}}]}
    inputs = tmp_path / "inputs.json"
    inputs.write_text(json.dumps({"n": 1, "s": "from-file", "f": "kept"}), encoding="utf-8")
    proc = run_cli(
        "run",
        write_wf(tmp_path, wf),
        "--inputs-file",
        inputs,
        "-i",
        "n=3",
        "--input",
        "s=hello",
        "--input",
        "l=[1,2]",
        "--output",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["store"]["show"] == {"n": 3, "s": "hello", "l": [1, 2], "f": "kept"}


@pytest.mark.processes
def test_run_text_output_summarizes_batches_errors_and_outputs(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, CONTINUE_WF))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "status: success" in out
    assert "each: 4 items, 2 succeeded, 2 failed" in out
    assert "each errors" in out
    assert out.index("Error: bad one") < out.index("Error: bad three")  # sorted by index
    assert "failed = 2" in out
    assert "src:" not in out  # non-batch nodes get no counts line


@pytest.mark.processes
def test_run_bad_input_syntax_is_a_usage_error(tmp_path: Path) -> None:
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, BATCH_WF), "--input", "greeting"), 2)
    assert "--input 'greeting'" in line
    assert "KEY=VALUE" in line


@pytest.mark.processes
def test_run_missing_required_input_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_cli("run", write_wf(tmp_path, BATCH_WF))
    line = assert_one_line_error(proc, 2)
    assert line == "error: inputs.greeting: required input 'greeting' was not given; pass --input greeting=..."


@pytest.mark.processes
def test_run_inputs_file_with_bad_json_names_line_and_column(tmp_path: Path) -> None:
    inputs = tmp_path / "inputs.json"
    inputs.write_text('{"a": 1,\n}', encoding="utf-8")
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, BATCH_WF), "--inputs-file", inputs), 2)
    assert "inputs.json" in line
    assert "line 2, column 1" in line


# -- user errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.processes
def test_malformed_json_is_one_line_with_line_and_column(tmp_path: Path, command: str) -> None:
    path = write_wf(tmp_path, '{"nodes": [\n  {"id": "a", "type": "echo",}\n]}', "broken.json")
    line = assert_one_line_error(run_cli(command, path), 2)
    assert "broken.json" in line
    assert "invalid JSON at line 2, column" in line


@pytest.mark.parametrize("command", ["run", "validate"])
@pytest.mark.processes
def test_missing_file(tmp_path: Path, command: str) -> None:
    line = assert_one_line_error(run_cli(command, tmp_path / "nope.json"), 2)
    assert "nope.json" in line
    assert "file not found" in line


@pytest.mark.processes
def test_unknown_node_type_suggests_the_closest(tmp_path: Path) -> None:
    wf = {"nodes": [{"id": "a", "type": "ecko", "params": {}}]}
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, wf)), 2)
    assert "nodes[0] (id 'a').type: unknown node type 'ecko'" in line
    assert "did you mean 'echo'?" in line


@pytest.mark.processes
def test_batch_items_not_a_list_fails_the_run_with_one_line(tmp_path: Path) -> None:
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"records": {"a": 1}}},
            {"id": "each", "type": "echo", "batch": {"items": "${src.records}"}, "params": {"v": "${item}"}},
        ]
    }
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, wf)), 1)
    assert "Batch items must be an array, got dict" in line
    assert "BatchItemsError" in line
    assert "'each'" in line  # names the node


@pytest.mark.processes
def test_unresolvable_template_names_node_param_and_template(tmp_path: Path) -> None:
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"x": 1}},
            {"id": "use", "type": "echo", "params": {"greeting": "hello ${src.missing}"}},
        ]
    }
    line = assert_one_line_error(run_cli("run", write_wf(tmp_path, wf), "--output", "json"), 1)
    assert "node 'use'" in line
    assert "param 'greeting'" in line
    assert "${src.missing}" in line


@pytest.mark.processes
def test_item_exception_propagates_as_type_and_message(tmp_path: Path) -> None:
    wf = {
        "nodes": [
            {
                "id": "src",
                "type": "echo",
                "params": {"records": [{"name": "ada", "age": 36}, {"name": "x", "age": "?"}]},
            },
            {
                "id": "check",
                "type": "python",
                "batch": {"items": "${src.records}", "as": "record"},
                "params": {"function": "examples.records:check_record", "record": "${record}"},
            },
        ]
    }
    proc = run_cli("run", write_wf(tmp_path, wf), "--output", "json")
    line = assert_one_line_error(proc, 1)
    assert line.startswith("error: ValueError: age of 'x' must be an integer")
    report = json.loads(proc.stdout)  # still one report, with the store as it was when the node raised
    assert (report["status"], report["error"], report["outputs"]) == ("failed", line.removeprefix("error: "), {})
    assert report["store"]["src"]["records"][1] == {"name": "x", "age": "?"}
    assert "check" not in report["store"]


@pytest.mark.processes
def test_unhandled_error_action_fails_the_run_but_still_prints_the_store(tmp_path: Path) -> None:
    wf = {"nodes": [{"id": "s", "type": "shell", "params": {"command": "echo oops >&2; exit 3"}}]}
    proc = run_cli("run", write_wf(tmp_path, wf), "--output", "json")
    line = assert_one_line_error(proc, 1)
    assert line.startswith("error: workflow failed: node 's' returned 'error'")
    report = json.loads(proc.stdout)
    assert (report["status"], report["error"]) == ("failed", "node 's' returned 'error': exit code 3: oops")
    assert report["store"]["s"]["exit_code"] == 3
    text = run_cli("run", write_wf(tmp_path, wf))
    assert text.returncode == 1
    assert "status: failed" in text.stdout


@pytest.mark.parametrize("where", ["group", "command"])
@pytest.mark.processes
def test_debug_prints_the_traceback(tmp_path: Path, where: str) -> None:
    wf = {
        "nodes": [
            {"id": "src", "type": "echo", "params": {"records": "not a list"}},
            {"id": "each", "type": "echo", "batch": {"items": "${src.records}"}, "params": {}},
        ]
    }
    path = write_wf(tmp_path, wf)
    args = ["--debug", "run", path] if where == "group" else ["run", path, "--debug"]
    proc = run_cli(*args)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert "BatchItemsError: Batch items must be an array, got str" in proc.stderr


@pytest.mark.parametrize("output", ["text", "json"])
@pytest.mark.processes
def test_ctrl_c_exits_130_with_cancelled(tmp_path: Path, output: str) -> None:
    (tmp_path / "slowmod.py").write_text(
        "import pathlib, time\n"
        "def slow(marker, seconds):\n"
        "    pathlib.Path(marker).touch()\n"
        "    time.sleep(seconds)\n"
        "    return seconds\n",
        encoding="utf-8",
    )
    marker = tmp_path / "started"
    wf = {
        "nodes": [
            {"id": "s", "type": "python", "params": {"function": "slowmod:slow", "marker": str(marker), "seconds": 30}}
        ]
    }
    env = cli_env(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "run", str(write_wf(tmp_path, wf)), "--output", output],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        encoding="utf-8",
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the node never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip() == "cancelled"
    if output == "json":
        report = json.loads(stdout)
        assert (report["status"], report["error"], report["outputs"]) == ("cancelled", "run cancelled", {})
        assert len(report["run_id"]) == 12


# -- validate / schema / nodes ----------------------------------------------------------------------------------


@pytest.mark.processes
def test_validate_ok(tmp_path: Path) -> None:
    proc = run_cli("validate", write_wf(tmp_path, BATCH_WF))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok: 2 nodes"


@pytest.mark.processes
def test_validate_lists_every_problem(tmp_path: Path) -> None:
    wf = {
        "nodes": [
            {"id": "a", "type": "echo"},
            {"id": "a", "type": "ecko"},
            {"id": "b", "type": "echo", "params": {"v": "${zzz.out}"}},
        ],
        "edges": [{"from": "a", "to": "b"}, {"from": "b", "to": "nowhere"}],
    }
    proc = run_cli("validate", write_wf(tmp_path, wf))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = err_lines(proc)
    assert lines[0].startswith("error: ") and "problems" in lines[0]
    text = proc.stderr
    assert "duplicate node id" in text
    assert "unknown node 'nowhere'" in text
    assert "unknown node type 'ecko'" in text
    assert len(lines) >= 4  # a first line, then one line per problem


@pytest.mark.processes
def test_schema_prints_the_ir_json_schema() -> None:
    proc = run_cli("schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert "nodes" in schema["properties"]


@pytest.mark.processes
def test_nodes_lists_registered_types_with_params() -> None:
    proc = run_cli("nodes")
    assert proc.returncode == 0, proc.stderr
    assert "echo" in proc.stdout
    assert "noop" in proc.stdout
    assert "Writes each of its params" in proc.stdout  # first docstring line of EchoNode


@pytest.mark.processes
def test_no_command_shows_help() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in ("run", "validate", "schema", "nodes"):
        assert command in proc.stdout


# -- in-process pieces --------------------------------------------------------------------------------------------


def test_params_text_tolerates_classes_without_params() -> None:
    class Bare(Node):
        pass

    class WithParams(Node):
        PARAMS = {"path": "file to read"}

    assert _params_text(Bare) == ""
    assert _params_text(WithParams) == "path: file to read"


def test_error_mapping_in_one_place() -> None:
    assert exit_code_for(ValidationError(["a", "b"])) == 2
    assert exit_code_for(CliUsageError("x")) == 2
    assert exit_code_for(TemplateError("t")) == 1
    assert exit_code_for(BatchItemsError("b")) == 1
    assert exit_code_for(WorkflowFailed("w")) == 1
    assert exit_code_for(KeyboardInterrupt()) == 130
    assert error_lines(ValidationError(["p1", "p2"], source="wf.json")) == [
        "error: wf.json: 2 problems:",
        "  - p1",
        "  - p2",
    ]
    assert error_lines(ValueError("bad\nvalue"), node="n") == ["error: ValueError: bad value (node 'n')"]
    assert error_lines(TemplateError("node 'n' param 'p': cannot resolve ${x}"), node="n") == [
        "error: TemplateError: node 'n' param 'p': cannot resolve ${x}"
    ]
    assert error_lines(RemoteError("KeyError", "'k'")) == ["error: KeyError: 'k' (raised on a worker)"]
    assert error_lines(KeyboardInterrupt()) == ["cancelled"]
    full = StoreFull(errno.ENOSPC, "disk full", "/home/x/.chordflow/runs.db")
    assert (error_lines(full, node="n"), exit_code_for(full)) == (["error: /home/x/.chordflow/runs.db: disk full"], 1)


@pytest.mark.parametrize("command", ["status", "wait", "results", "update", "cancel", "resume", "redrive", "repair"])
@pytest.mark.processes
def test_an_invalid_run_id_is_one_line_before_any_lookup(command: str) -> None:
    line = assert_one_line_error(run_cli(command, "../etc/passwd"), 2)
    assert line == "error: invalid run id '../etc/passwd': a run id is " + RUN_ID_RULE


@pytest.mark.processes
def test_a_long_run_id_is_not_printed_back_and_a_valid_one_is_looked_up() -> None:
    line = assert_one_line_error(run_cli("status", "x" * 129), 2)
    assert line == f"error: invalid run id (129 characters): a run id is {RUN_ID_RULE}"
    odd = assert_one_line_error(run_cli("status", "a\nb"), 2)
    assert odd.startswith("error: invalid run id 'a\\nb'")
    given = "user-given_id.v2-" + uuid.uuid4().hex + "x" * 79  # 128 characters of every allowed kind
    scheduler.run({"nodes": [{"id": "a", "type": "echo", "params": {"v": 1}}]}, run_id=given)
    status = run_cli("status", given, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["run_id"] == given


def test_progress_display_applies_out_of_order_events_monotonically() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    events = [
        {"type": "state", "node": "x"},
        {"type": "batch_progress", "node": "b", "index": 0, "done": 1, "total": 3, "ok": True},
        {"type": "batch_progress", "node": "b", "index": 2, "done": 3, "total": 3, "ok": False},
        {"type": "batch_progress", "node": "b", "index": 1, "done": 2, "total": 3, "ok": True},
    ]
    with ProgressDisplay(console) as display:
        for event in events:
            display(event)
    (task,) = display.progress.tasks
    assert (task.description, task.completed, task.total, task.fields["errors"]) == ("b", 3, 3, 1)
    assert "3/3" in console.file.getvalue()


@pytest.mark.processes
def test_version_prints_the_package_version() -> None:
    from importlib.metadata import version

    proc = run_cli("--version")
    assert (proc.returncode, proc.stdout) == (0, f"chordflow {version('chordflow')}\n")


@pytest.mark.processes
def test_validate_loads_neither_the_run_machinery_nor_rich(tmp_path: Path) -> None:
    """Why `chordflow validate` starts fast: its process imports only what checking a workflow needs."""
    code = (
        "import sys; from scheduler.cli import main\n"
        "try:\n    main(['validate', sys.argv[1]])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('rich', 'celery', 'redis') "
        "or m in ('scheduler.api', 'scheduler.driver', 'worker.runs.sqlite')))"
    )
    path = write_wf(tmp_path, {"nodes": [{"id": "a", "type": "echo"}]})
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        cwd=ROOT,
        env=cli_env(CHORDFLOW_PLUGINS=""),  # the suite's plugin node types import Celery themselves
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.splitlines() == ["ok: 1 nodes", "[]"], proc.stderr


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (
            ("--detach",),
            "--detach: only with --backend celery and without --stream (a local run lives in this process)",
        ),
        (("--backend", "celery", "--detach", "--stream"), "--detach: only with --backend celery and without --stream"),
    ],
)
@pytest.mark.processes
def test_detach_is_refused_where_it_means_nothing(tmp_path: Path, args: tuple[str, ...], problem: str) -> None:
    proc = run_cli("run", write_wf(tmp_path, {"nodes": [{"id": "a", "type": "echo"}]}), *args)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {problem}") and proc.stdout == ""


@pytest.mark.processes
def test_runs_takes_the_status_word_of_a_run_report_and_refuses_a_negative_limit() -> None:
    env = cli_env(CHORDFLOW_BROKER_URL="redis://127.0.0.1:1/0")
    assert scheduler.run({"nodes": [{"id": "a", "type": "echo"}]}).status == "success"
    listed = json.loads(run_cli("runs", "--status", "success", "--limit", "50", "--json", env=env).stdout)
    assert listed and {run["status"] for run in listed} == {"succeeded"}
    negative = run_cli("runs", "--limit", "-1", env=env)
    assert negative.returncode == 2 and "-1 is not in the range x>=1" in negative.stderr


@pytest.mark.processes
def test_the_python_api_imports_modules_of_the_working_directory_as_the_cli_does(tmp_path: Path) -> None:
    """`scheduler.run("wf.json")` from a script elsewhere: a `python` node's module in the working directory."""
    project, scripts = tmp_path / "project", tmp_path / "scripts"
    project.mkdir(), scripts.mkdir()
    (project / "cwd_helpers_21b.py").write_text("def double(x):\n    return 2 * x\n")
    wf = {"nodes": [{"id": "d", "type": "python", "params": {"function": "cwd_helpers_21b:double", "x": 21}}]}
    (project / "wf.json").write_text(json.dumps(wf))
    script = scripts / "go.py"  # sys.path[0] is the script's directory, not the working directory
    script.write_text("import scheduler\nprint(scheduler.run('wf.json').shared['d']['result'])\n")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=project,
        env=cli_env(CHORDFLOW_PLUGINS="worker.nodes.python_call"),  # not the suite's: `tests` is not importable there
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (0, "42\n"), proc.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["submit", "examples/word_counts.json", "--priority", "urgent"], "'urgent' is not one of 'high'"),
        (["runs", "--limit", "0"], "0 is not in the range x>=1"),
        (["results", "abcd", "--out", "examples"], "'examples' is a directory"),
        (["run", "examples/word_counts.json", "--nope"], "No such option '--nope'"),
        (["bogus"], "No such command 'bogus'"),
    ],
)
@pytest.mark.processes
def test_bad_usage_is_one_error_line_naming_the_option(args: list[str], says: str) -> None:
    """Click's own checks (a choice, a range, a path, an unknown option or command) end as every user error does:
    one `error:` line and exit 2, not Click's usage block."""
    line = assert_one_line_error(run_cli(*args), 2)
    assert says in line, line
