"""The live progress display of a run in a terminal (Rich): a spinner for the node running now, a bar per batch
node and a line per parallel branch. Imported only when stderr is a terminal (follow.py `progress_display`): a
command whose output a script reads starts without Rich.
"""

from __future__ import annotations

import threading
from typing import Any

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
