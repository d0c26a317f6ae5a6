"""`shell`: run a command and capture stdout, stderr and the exit code.

Injection safety: values from the store must never become shell syntax. They reach the command only
as environment variables (`vars`, used as "$name" in a command string) or as argv entries (the list
form of `command`, run without a shell). A `${...}` template inside a `command` *string* is rejected
at validation time by `check_command_param`, because the engine substitutes templates before the
node runs and the node could no longer tell data from code.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from typing import Any

from pocketflow import Node

from ir.templates import references
from worker.nodes.params import param
from worker.nodes.registry import register

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_command_param(raw_params: dict[str, Any]) -> str | None:
    """An error message when the RAW `command` string holds a `${...}` template, else None.

    Called by the compiler on the unresolved IR params. Shell syntax the template engine leaves
    alone (`$name`, `${name:-default}`) is allowed; the list form may hold templates (argv is safe).
    """
    command = raw_params.get("command") if isinstance(raw_params, dict) else None
    if not isinstance(command, str):
        return None
    found = references(command)
    if not found:
        return None
    return (
        f"shell: param 'command' contains the template '{found[0].text}'; a template in a command string could "
        "inject shell syntax - pass the value in 'vars' and use \"$name\", or use the list form of 'command'"
    )


def env_value(value: Any) -> str:
    """Strings pass unchanged; anything else is rendered as JSON (numbers, booleans, dicts, lists)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _env_dict(params: dict[str, Any], name: str) -> dict[str, str]:
    value = param("shell", params, name, dict, default={})
    for key in value:
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise ValueError(f"shell: param '{name}' has an invalid variable name {key!r}")
    return {key: env_value(v) for key, v in value.items()}


def _is_command(command: str | list[Any]) -> bool:
    if isinstance(command, str):
        return bool(command.strip())
    return bool(command) and all(isinstance(a, str | int | float) for a in command)


def _argv(params: dict[str, Any]) -> list[str]:
    what = "a non-empty string or list of strings"
    command = param("shell", params, "command", (str, list), required=True, what=what, check=_is_command)
    return ["/bin/sh", "-c", command] if isinstance(command, str) else [str(a) for a in command]


@register("shell")
class ShellNode(Node):
    """Runs a command; a non-zero exit is an `error` action (data), a timeout raises (retryable)."""

    PARAMS = {
        "command": "(required) string run by /bin/sh -c, or a list of argv run without a shell; "
        "no ${...} templates inside a string - use vars",
        "vars": "dict; each entry becomes an environment variable: the only way store values reach a shell string",
        "stdin": "string fed to the command's standard input",
        "env": "dict of environment variables added to the worker's environment",
        "cwd": "working directory",
        "timeout": "seconds before the command is killed and TimeoutError raised (default 60)",
    }
    check_params = staticmethod(check_command_param)  # static validation hook (scheduler.compiler.load)

    def prep(self, shared: Any) -> dict[str, Any]:
        params = self.params
        stdin = param("shell", params, "stdin", str)
        cwd = param("shell", params, "cwd", (str, os.PathLike), what="a path string")
        what = "a positive number of seconds"
        timeout = param("shell", params, "timeout", (int, float), default=60, what=what, check=lambda t: t > 0)
        env = {**os.environ, **_env_dict(params, "env"), **_env_dict(params, "vars")}
        return {"argv": _argv(params), "stdin": stdin, "cwd": cwd, "timeout": timeout, "env": env}

    def exec(self, prep_res: dict[str, Any]) -> dict[str, Any]:
        argv, timeout = prep_res["argv"], prep_res["timeout"]
        with subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if prep_res["stdin"] is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=prep_res["cwd"],
            env=prep_res["env"],
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=True,  # its own process group, so a timeout kills the children too
        ) as proc:
            try:
                stdout, stderr = proc.communicate(prep_res["stdin"], timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                shown = argv[2] if argv[:2] == ["/bin/sh", "-c"] else " ".join(argv)
                raise TimeoutError(f"shell: command {shown!r} timed out after {timeout}s") from None
        return {"stdout": stdout, "stderr": stderr, "exit_code": proc.returncode}

    def post(self, shared: Any, prep_res: Any, exec_res: dict[str, Any]) -> str:
        for key, value in exec_res.items():
            shared[key] = value
        code = exec_res["exit_code"]
        if code == 0:
            return "default"
        lines = [line for line in exec_res["stderr"].splitlines() if line.strip()]
        shared["error"] = f"exit code {code}: {lines[-1]}" if lines else f"exit code {code}"
        return "error"
