"""`shell`: run a command and capture stdout, stderr and the exit code.

Injection safety: values from the store must never become shell syntax. They reach the command only
as environment variables (`vars`, used as "$name" in a command string) or as argv entries (the list
form of `command`, run without a shell). The engine substitutes templates before the node runs, so
the node could no longer tell data from code; `check_command_param` therefore rejects, at validation
time, every `${...}` template a shell would read as code: inside a `command` string; in the list form,
after `sh -c` (any shell, by path or behind `env`/`sudo`/..., flags combined as in `-ec`) or where the
shell still reads its options; in `stdin` when a shell runs its stdin as its script; and in the
variables shells run or expand at start (`BASH_ENV`, `PS4`, ...). A script file's arguments
(`["sh", "run.sh", "${item}"]`) and a program's argv stay allowed: nothing interprets them. Not
checked: a template that picks the program itself, and other interpreters' code (`python -c`).

A batch's stop (cancel, fail_fast, a threshold: worker/stopping.py) kills a command still running within
STOP_SLICE, its process group with it, as a timeout does; the item has no outcome.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pocketflow import Node

from ir.templates import references
from worker import stopping
from worker.nodes.params import Param
from worker.nodes.registry import register

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Program names (the last path component) of shells: `sh`, `bash`, `ksh93`, `zsh5`, `tcsh`, `fish`, ...
SHELL_RE = re.compile(r"^(?:a|ba|rba|da|z|k|mk|pdk|ok|ya|po|c|tc|fi)?sh(?:\d[\d.]*)?$")
#: Programs that run the program named after them: `["env", "bash"]` runs a shell as much as `["bash"]`.
LAUNCHERS = frozenset(
    {"env", "sudo", "doas", "nice", "nohup", "timeout", "setsid", "stdbuf", "ionice", "chrt", "taskset"}
    | {"time", "exec", "command", "busybox", "runuser", "chroot", "unshare", "flock"}
)
#: Long shell options whose value is the next argument (short ones: `-o NAME`, `-O NAME`).
LONG_OPTIONS_WITH_VALUE = frozenset({"--rcfile", "--init-file"})
#: Script paths that are the shell's own standard input.
STDIN_SCRIPTS = frozenset({"-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0"})
#: Variables a shell runs or expands as code when it starts (bash expands `$(...)` in BASH_ENV).
SHELL_CODE_VARS = frozenset({"BASH_ENV", "ENV", "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS"})
#: Where a simple command may start inside a command string; quotes are ignored, which errs on the safe side.
_COMMAND_BREAK_RE = re.compile(r"[;&|()`\n{}]|\$\(|\bthen\b|\bdo\b|\belse\b")
_REDIRECTION_RE = re.compile(r"^\d*(?:<<?-?|>>?|<>|>\||&>>?)&?")
VARS_HINT = "pass the value in 'vars' and use \"$name\""


@dataclass(frozen=True, slots=True)
class ShellCall:
    """How one shell in an argv takes its arguments: options first, then code, a script file or stdin."""

    shell: str  # as written: "sh", "/bin/bash"
    code_flag: str | None  # the option that makes the first operand code: "-c", "-ec", "--command"
    code: str | None  # that operand
    option_template: str | None  # the first template where the shell still reads options
    reads_stdin: bool  # its script is its standard input


def _is_shell(word: str) -> bool:
    return bool(SHELL_RE.match(word.rsplit("/", 1)[-1]))


def _first_template(value: Any) -> str | None:
    found = references(value)
    return found[0].text if found else None


def _shell_call(words: list[str]) -> ShellCall:
    """Parse `words` (a shell, then its arguments) as the shell does: options until the first operand."""
    code_flag = option_template = None
    stdin_flag = False
    owed = 0  # option values still to skip (-o NAME, --rcfile FILE)
    operands: list[str] = []
    for i, word in enumerate(words[1:], 1):
        template = _first_template(word)
        if owed:
            owed -= 1
        elif word in ("--", "-"):  # both end the options (dash and bash agree)
            operands = words[i + 1 :]
            break
        elif template and (code_flag or word.split(template, 1)[0][:1] not in ("", "-", "+")):
            operands = words[i:]  # after -c: the code (or an option, as unsafe); "./${name}.sh": an operand
            break
        elif word.startswith("--") and not template:
            name = word.split("=", 1)[0]
            code_flag = word if name == "--command" else code_flag
            owed = int(name in LONG_OPTIONS_WITH_VALUE and "=" not in word)
        elif word[:1] in ("-", "+") and len(word) > 1 and not template:
            code_flag = word if "c" in word else code_flag
            stdin_flag = stdin_flag or (word[0] == "-" and ("s" in word or "i" in word))
            owed = word.count("o") + word.count("O")
        elif not template:
            operands = words[i:]
            break
        option_template = option_template or template  # a value here could become an option, -c included
    code = operands[0] if code_flag and operands else None
    reads_stdin = not code_flag and (stdin_flag or not operands or operands[0] in STDIN_SCRIPTS)
    return ShellCall(words[0], code_flag, code, option_template, reads_stdin)


def _program_shell(words: list[str]) -> int | None:
    """The index of the shell that `words` runs as its program (directly or through a launcher)."""
    if not words:
        return None
    if _is_shell(words[0]):
        return 0
    if words[0].rsplit("/", 1)[-1] in LAUNCHERS:
        return next((i for i, word in enumerate(words) if _is_shell(word)), None)
    return None


def _stdin_shell(words: list[str], depth: int = 0) -> str | None:
    """The shell that runs the standard input of `words` as its script, if any (also inside `sh -c CODE`)."""
    index = _program_shell(words)
    if index is None:
        return None
    call = _shell_call(words[index:])
    if call.reads_stdin:
        return call.shell
    return _stdin_shell_in_script(call.code, depth + 1) if call.code is not None and depth < 4 else None


def _stdin_shell_in_script(script: str, depth: int = 0) -> str | None:
    """`_stdin_shell` of every simple command of a command string (`cat | sh`, `x=1 sh`, `$(bash)`, ...)."""
    for part in _COMMAND_BREAK_RE.split(script):
        words = _words_without_redirections(part)
        while words and (re.match(r"^\w+=", words[0]) or words[0] in ("!", "if", "while", "until", "elif")):
            words = words[1:]
        if len(words) > 1 and words[0] in (".", "source") and words[1] in STDIN_SCRIPTS:
            return words[0]
        found = _stdin_shell(words, depth)
        if found:
            return found
    return None


def _words_without_redirections(part: str) -> list[str]:
    """The words of a simple command, unquoted, without `2>err`, `< FILE` (a redirected shell counts as
    reading stdin: the safe side)."""
    words: list[str] = []
    skip_next = False
    for word in part.split():
        redirection = _REDIRECTION_RE.match(word)
        if not skip_next and not redirection:
            words.append(word.strip("\"'"))
        skip_next = bool(redirection) and redirection.end() == len(word)  # `<` alone: the next word is its target
    return words


def _command_problems(raw_params: dict[str, Any]) -> Iterator[str]:
    command = raw_params.get("command")
    if isinstance(command, str) and (template := _first_template(command)):
        yield (
            f"shell: param 'command' contains the template '{template}'; a template in a command string "
            f"could inject shell syntax - {VARS_HINT}, or use the list form of 'command'"
        )
    if not isinstance(command, list):
        return
    words = [str(word) for word in command]
    program = _program_shell(words)
    for i, word in enumerate(words):
        if not _is_shell(word):
            continue
        call = _shell_call(words[i:])
        code_template = _first_template(call.code)
        if call.option_template and (i == program or call.code_flag):
            yield (
                f"shell: param 'command' has the template '{call.option_template}' where '{call.shell}' reads "
                f"its options; a value there could become -c and run shell code - {VARS_HINT}, or put the "
                "value after a script file"
            )
        elif code_template:
            yield (
                f"shell: param 'command' gives the template '{code_template}' to '{call.shell} {call.code_flag}' "
                f"as shell code; a value there could inject shell syntax - {VARS_HINT} in the code"
            )


def _stdin_problems(raw_params: dict[str, Any]) -> Iterator[str]:
    template = _first_template(raw_params.get("stdin"))
    command = raw_params.get("command")
    if template is None or not isinstance(command, str | list):
        return
    words = [str(word) for word in command] if isinstance(command, list) else None
    shell = _stdin_shell(words) if words is not None else _stdin_shell_in_script(command)
    if shell:
        yield (
            f"shell: param 'stdin' contains the template '{template}' and '{shell}' runs its stdin as shell "
            f"code; a value there could inject shell syntax - {VARS_HINT} in the command"
        )


def _variable_problems(raw_params: dict[str, Any]) -> Iterator[str]:
    for name in ("vars", "env"):
        value = raw_params.get(name)
        for key in value if isinstance(value, dict) else ():
            template = _first_template(value[key])
            if key in SHELL_CODE_VARS and name == "vars":
                yield _shell_code_var_message(key)
            elif key in SHELL_CODE_VARS and template:
                yield (
                    f"shell: param 'env' gives '{key}' the template '{template}'; shells run or expand that "
                    f"variable as code - {VARS_HINT} with another name"
                )


def _shell_code_var_message(key: str) -> str:
    return (
        f"shell: param 'vars' sets '{key}', which shells run or expand as code - {VARS_HINT} with another "
        "name (a fixed setting belongs in 'env')"
    )


#: The static checks of `check_command_param`, each a generator of one-line problems.
PARAM_CHECKS = (_command_problems, _stdin_problems, _variable_problems)


def check_command_param(raw_params: dict[str, Any]) -> str | None:
    """An error message when a RAW template would reach a shell as code, else None.

    Called by the compiler on the unresolved IR params (`check_params`), so `chordflow validate`,
    `run` and `submit` refuse the workflow before any item runs. Shell syntax the template engine
    leaves alone (`$name`, `${name:-default}`) is allowed; so are templates as argv entries of a
    program that is not a shell, and as the arguments of a shell script file. Several problems are
    joined with " | " (one line).
    """
    if not isinstance(raw_params, dict):
        return None
    return " | ".join(problem for check in PARAM_CHECKS for problem in check(raw_params)) or None


def env_value(value: Any) -> str:
    """Strings pass unchanged; anything else is rendered as JSON (numbers, booleans, dicts, lists)."""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _env_dict(params: dict[str, Any], name: str) -> dict[str, str]:
    value = PARAMS[name].get("shell", params, name)
    for key in value:
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise ValueError(f"shell: param '{name}' has an invalid variable name {key!r}")
        if name == "vars" and key in SHELL_CODE_VARS:  # also when the whole dict came from a template
            raise ValueError(_shell_code_var_message(key))
    return {key: env_value(v) for key, v in value.items()}


def _is_command(command: str | list[Any]) -> bool:
    if isinstance(command, str):
        return bool(command.strip())
    return bool(command) and all(isinstance(a, str | int | float) for a in command)


#: Seconds a command in a batch runs before the batch's stop is looked at again.
STOP_SLICE = 0.25

#: The shell node's params (worker/nodes/params.py): shown by `chordflow nodes`, checked by validation and in prep.
PARAMS = {
    "command": Param(
        "(required) string run by /bin/sh -c, or a list of argv run without a shell; no ${...} templates inside a "
        "string or after a shell's -c - use vars",
        (str, list), required=True, what="a non-empty string or list of strings", check=_is_command,
    ),
    "vars": Param(
        "dict; each entry becomes an environment variable: the only way store values reach a shell string (not "
        "BASH_ENV, ENV, PS1-PS4, PROMPT_COMMAND, SHELLOPTS, BASHOPTS: shells run those)",
        dict, default={},
    ),
    "stdin": Param(
        "string fed to the command's standard input; no ${...} templates when a shell reads it as its script", str
    ),
    "env": Param("dict of environment variables added to the worker's environment", dict, default={}),
    "cwd": Param("working directory", (str, os.PathLike), what="a path string"),
    "timeout": Param(
        "seconds before the command is killed and TimeoutError raised (default 60)",
        (int, float), default=60, what="a positive number of seconds", check=lambda t: t > 0,
    ),
}  # fmt: skip


def _argv(params: dict[str, Any]) -> list[str]:
    command = PARAMS["command"].get("shell", params, "command")
    return ["/bin/sh", "-c", command] if isinstance(command, str) else [str(a) for a in command]


def _communicate(proc: subprocess.Popen, stdin: str | None, timeout: float) -> tuple[str, str]:
    """`proc.communicate` within `timeout`, looking at the batch's stop every STOP_SLICE seconds (worker/stopping.py):
    Stopped, and the caller kills the command, as for a timeout."""
    if stopping.current() is None:
        return proc.communicate(stdin, timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.communicate(stdin, timeout=max(0.0, min(STOP_SLICE, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                raise
            stopping.check()
            stdin = None  # given once: a retried communicate goes on writing it


@register("shell")
class ShellNode(Node):
    """Runs a command; a non-zero exit is an `error` action (data), a timeout raises (retryable)."""

    PARAMS = PARAMS
    check_params = staticmethod(check_command_param)  # static validation hook (worker/engine/loader.py)

    def prep(self, shared: Any) -> dict[str, Any]:
        params = self.params
        stdin, cwd, timeout = (PARAMS[name].get("shell", params, name) for name in ("stdin", "cwd", "timeout"))
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
                stdout, stderr = _communicate(proc, prep_res["stdin"], timeout)
            except (subprocess.TimeoutExpired, stopping.Stopped) as exc:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if isinstance(exc, stopping.Stopped):
                    raise
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
