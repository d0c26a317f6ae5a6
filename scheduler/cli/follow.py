"""Following a run in the terminal: the live progress display, Ctrl-C, and the report when it ends.

Shared by every command that runs or waits for a workflow (`run`, `wait`, `resume`, `redrive`, `repair`,
`run-plan`), so they all show the same display and end with the same output and exit codes.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

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


class SecondsElapsedColumn(ProgressColumn):
    """`3.2s`: how long the task has been running."""

    def render(self, task: Task) -> Text:
        return Text(f"{task.elapsed or 0.0:.1f}s")


class ProgressDisplay:
    """What a terminal shows while a run goes on: a `running <node> 3.2s` spinner for the node running now
    (`node_started`), and one progress bar per batch node (`__call__`, the `on_event` handler), which takes
    the place of that node's spinner. Rich redraws both ten times a second from its own thread.
    """

    def __init__(self, console: Console):
        self.spinner = Progress(
            SpinnerColumn(), TextColumn("running {task.description}"), SecondsElapsedColumn(), console=console
        )
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[errors]} errors"),
            TimeElapsedColumn(),
            console=console,
        )
        self.live = Live(Group(self.spinner, self.progress), console=console, refresh_per_second=10)
        self.running: tuple[str, TaskID] | None = None  # the node the spinner shows, and its task
        self.tasks: dict[str, TaskID] = {}
        self.done: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.lock = threading.Lock()

    def __enter__(self) -> ProgressDisplay:
        self.live.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        with self.lock:
            self._stop_spinner()
        self.live.stop()

    def _stop_spinner(self, node: str | None = None) -> None:
        """Remove the spinner (only if it shows `node`, when given). Call with the lock held."""
        if self.running is not None and node in (None, self.running[0]):
            self.spinner.remove_task(self.running[1])
            self.running = None

    def node_started(self, node: str) -> None:
        """The `on_node_start` hook: the spinner now shows `node`, its time counted from now."""
        with self.lock:
            self._stop_spinner()
            self.running = (node, self.spinner.add_task(node, total=None))

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("type") in ("parallel_state", "parallel_error", "branch_complete"):
            self._branch(event)
            return
        if event.get("type") != "batch_progress":
            return
        node = str(event["node"])
        with self.lock:  # events come from several threads: apply them in one order, never going back
            self._stop_spinner(node)
            if node not in self.tasks:
                self.tasks[node] = self.progress.add_task(node, total=event.get("total"), errors=0)
                self.done[node] = self.errors[node] = 0
            if not event.get("ok", True):
                self.errors[node] += 1
            self.done[node] = max(self.done[node], int(event.get("done") or 0))
            self.progress.update(self.tasks[node], completed=self.done[node], errors=self.errors[node])

    def _branch(self, event: dict[str, Any]) -> None:
        """One line per parallel branch: the node it ran last, how many, and how it ended."""
        name = f"branch {event['branch']}"
        with self.lock:
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(name, total=None, errors=0)
                self.done[name] = self.errors[name] = 0
            kind = event["type"]
            if kind == "parallel_state":
                self.done[name] += 1
                description = f"{name}: {event.get('node')} ({self.done[name]} nodes)"
            elif kind == "parallel_error":
                self.errors[name] += 1
                description = f"{name}: {event.get('node')} failed"
            else:
                description = f"{name}: {'done' if event.get('ok') in (True, 'True') else 'failed'}"
            self.progress.update(
                self.tasks[name], description=description, completed=self.done[name], errors=self.errors[name]
            )
            if kind == "branch_complete":
                self.progress.update(self.tasks[name], total=self.done[name])


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
    """`durable.wait`, keeping the store (for the JSON report) and the failed node (for the error line).

    A cluster run's events only feed the display (none names a failed node): without one, `wait` reads no
    progress (a million records' outcomes, 0.7 s of CPU)."""
    from scheduler import api, lookup

    try:
        result = api.wait(run_id, timeout, on_event=on_event if ctx.meta.get(DISPLAY_KEY) else None)
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
    then report it: the summary or the JSON report, and the exit code.

    `owns`: this command started the run (`run`, `resume`...): Ctrl-C cancels it. Otherwise (`wait`) Ctrl-C only
    stops following it, and says so: the run goes on."""
    display = ProgressDisplay(stderr_console()) if output != "json" and sys.stderr.isatty() else None
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
        print_summary(stdout_console(), wf, result)
    if result.status == "cancelled":
        raise RunCancelled(result.error or "run cancelled")
    if result.status != "success":
        raise WorkflowFailed(f"workflow failed: {result.error or result.status}")
