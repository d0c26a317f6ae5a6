"""Following a run in the terminal: the live progress display (display.py), Ctrl-C, and the report when it ends.

Shared by every command that runs or waits for a workflow (`run`, `wait`, `resume`, `redrive`, `repair`,
`run-plan`), so they all show the same display and end with the same output and exit codes.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from ir.errors import RunCancelled, WaitTimeout
from scheduler.cli.errors import (
    EXIT_CANCELLED,
    EXIT_FAILED,
    EXIT_USAGE,
    FAILED_NODE_KEY,
    WorkflowFailed,
    error_text,
    exit_code_for,
)
from scheduler.cli.output import failed_branches, print_summary, run_report, stderr_console, stdout_console

if TYPE_CHECKING:
    from scheduler.cli.display import ProgressDisplay


def progress_display() -> ProgressDisplay | None:
    """The live display on stderr when it is a terminal, else None (Rich is imported only then)."""
    if not sys.stderr.isatty():
        return None
    from scheduler.cli.display import ProgressDisplay

    return ProgressDisplay(stderr_console())


def make_event_handler(meta: dict[str, Any], display: ProgressDisplay | None) -> Callable[[dict[str, Any]], None]:
    """The `on_event` hook: remembers the failed node (for the error line) and feeds the display."""

    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "error" and event.get("node"):
            meta.setdefault(FAILED_NODE_KEY, event["node"])
        if display is not None:
            display(event)

    return on_event


#: ctx.meta: whether `follow` shows the live display.
DISPLAY_KEY = "chordflow.display"

#: The signals that end a run this process drives as cancelled: Ctrl-C, `kill`, a closed terminal.
CANCEL_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def cancel_on_signals(cancelled: threading.Event) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP set the run's cancel flag first (batch threads stop taking items), then
    interrupt: the run ends cancelled, its record says so, and `resume` goes on from its checkpoint."""

    def on_signal(signum: int, frame: Any) -> None:
        cancelled.set()
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, on_signal) for signum in CANCEL_SIGNALS}
    try:
        yield
    except KeyboardInterrupt:
        cancelled.set()
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def follow_cluster_run(
    ctx: click.Context,
    run_id: str,
    store: dict[str, Any],
    timeout: float | None,
    on_event: Callable[[dict[str, Any]], None] | None,
) -> Any:
    """`waiting.wait`, keeping the store (for the JSON report) and the failed node (for the error line).

    A cluster run's events only feed the display (none names a failed node): without one, `wait` reads no
    progress (a million records' outcomes, 0.7 s of CPU)."""
    from scheduler import lookup, waiting

    try:
        result = waiting.wait(run_id, timeout, on_event=on_event if ctx.meta.get(DISPLAY_KEY) else None)
    except WaitTimeout:
        raise
    except Exception:
        with contextlib.suppress(Exception):
            record, runs = lookup.find_run(run_id)
            ctx.meta.setdefault(FAILED_NODE_KEY, record.node)
            store.update(runs.load_store(run_id))
        raise
    store.update(result.shared)
    return result


def stop_waiting(output: str, run_id: str, store: dict[str, Any]) -> None:
    """Ctrl-C on a command following a run it does not own: say the run goes on, and how to stop it; exit 130."""
    stopped = f"stopped waiting; run {run_id} goes on (chordflow cancel {run_id} to stop it)"
    if output == "json":  # a script reading the report learns the run is not over
        click.echo(run_report(run_id, "running", stopped, {}, store))
    click.echo(stopped, err=True)
    raise click.exceptions.Exit(EXIT_CANCELLED) from None


def follow(
    ctx: click.Context,
    output: str,
    run_id: str,
    store: dict[str, Any],
    start: Callable[..., Any],
    *,
    owns: bool = True,
) -> None:
    """Drive a run (`start(**hooks)` -> (workflow, RunResult)) with the live display and Ctrl-C handling,
    then report it: the summary or the JSON report, and the exit code. `workflow` may be a function that loads it
    (`wait`): only the text summary reads it.

    `owns`: this command started the run (`run`, `resume`...): Ctrl-C cancels it. Otherwise (`wait`) Ctrl-C only
    stops following it, and says so: the run goes on."""
    display = progress_display() if output != "json" else None
    ctx.meta[DISPLAY_KEY] = display is not None
    cancelled = threading.Event()
    try:
        with cancel_on_signals(cancelled) if owns else contextlib.nullcontext(), display or contextlib.nullcontext():
            wf, result = start(
                on_event=make_event_handler(ctx.meta, display),
                on_node_start=display.node_started if display else None,
                cancelled=cancelled,
            )
    except (Exception, KeyboardInterrupt) as exc:
        if isinstance(exc, KeyboardInterrupt) and not owns:
            stop_waiting(output, run_id, store)
        code = exit_code_for(exc)
        # a node failing after a parallel branch failed (the fan-in missing its values): the branch's error first
        branches = failed_branches(store) if code == EXIT_FAILED else []
        for branch in branches:
            click.echo(f"error: {branch}", err=True)
        if output == "json":  # the error line on stderr comes from ChordflowGroup.invoke
            click.echo(
                run_report(
                    None if code == EXIT_USAGE else run_id,  # exit 2: the run never started
                    "cancelled" if code == EXIT_CANCELLED else "failed",
                    "\n".join([*branches, error_text(exc, ctx.meta.get(FAILED_NODE_KEY))]),
                    {},
                    store,
                )
            )
        raise
    if output == "json":
        click.echo(run_report(result.run_id, result.status, result.error, result.outputs, result.shared))
    else:
        print_summary(stdout_console(), wf() if callable(wf) else wf, result)
    if result.status == "cancelled":
        raise RunCancelled(result.error or "run cancelled")
    if result.status != "success":
        raise WorkflowFailed(f"workflow failed: {result.error or result.status}")
