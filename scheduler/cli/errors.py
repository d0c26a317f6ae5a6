"""Errors on the command line: which exit code an exception gives and the stderr lines that say why.

The `cli` group (scheduler/cli/group.py) reports every command's exception through `report_error`, so the
mapping lives in ONE place:

- 0 success; 1 the workflow failed or raised while running; 2 usage or validation error; 130 cancelled;
  124 `wait --timeout` ran out.
- User errors print one line on stderr starting with ``error:`` (a ValidationError with several problems
  prints one line per problem after the first); ``--debug`` prints the full traceback instead.
"""

from __future__ import annotations

import traceback

import click

from ir.errors import (
    BackendError,
    CliUsageError,
    NodeTypeError,
    RemoteError,
    RunCancelled,
    StepLimitExceeded,
    StoreDiskError,
    UnknownRun,
    ValidationError,
    WorkflowFailed,
)
from worker.runs.record import error_at

#: ctx.meta key: print tracebacks (`--debug`, on the group or on a command).
DEBUG_KEY = "chordflow.debug"
#: ctx.meta key: the node a run failed at, named in the error line.
FAILED_NODE_KEY = "chordflow.failed_node"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED, EXIT_TIMEOUT = 0, 1, 2, 130, 124


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt | RunCancelled):
        return EXIT_CANCELLED
    if isinstance(exc, CliUsageError | ValidationError | NodeTypeError | UnknownRun):
        return EXIT_USAGE
    return EXIT_FAILED


def error_lines(exc: BaseException, node: str | None = None) -> list[str]:
    """The stderr lines for an error (no traceback), secrets masked (worker/redact.py)."""
    from worker import redact

    if isinstance(exc, KeyboardInterrupt | RunCancelled):
        return ["cancelled"]
    message = redact.mask(str(exc))
    if isinstance(exc, ValidationError):
        first, *rest = message.splitlines() or [type(exc).__name__]
        return [f"error: {first}", *rest]
    if isinstance(exc, CliUsageError | NodeTypeError | UnknownRun | WorkflowFailed | StepLimitExceeded | BackendError):
        return [f"error: {_one_line(message)}"]
    if isinstance(exc, StoreDiskError):  # `<CHORDFLOW_HOME>/runs.db: disk full`: the store's, not the node's
        return [f"error: {_one_line(message)}"]
    if isinstance(exc, RemoteError):
        text = f"{_one_line(message)} (raised on a worker)"
    else:
        text = f"{type(exc).__name__}: {_one_line(message)}" if message.strip() else type(exc).__name__
    return [f"error: {error_at(text, node)}"]


def error_text(exc: BaseException, node: str | None = None) -> str:
    """The `error` of a run report: what `error_lines` prints on stderr, without the ``error:`` prefix."""
    if isinstance(exc, KeyboardInterrupt | RunCancelled):
        return "run cancelled"
    return "\n".join(error_lines(exc, node)).removeprefix("error: ")


def report_error(exc: BaseException, *, debug: bool = False, node: str | None = None) -> int:
    """Print `exc` on stderr (a traceback with --debug, secrets masked too) and return the exit code."""
    from worker import redact

    if debug:
        click.echo(redact.mask("".join(traceback.format_exception(exc))).rstrip("\n"), err=True)
    else:
        for line in error_lines(exc, node):
            click.echo(line, err=True)
    return exit_code_for(exc)
