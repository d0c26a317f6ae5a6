"""`chordflow top`: a live terminal view of the cluster, refreshed every second until `q`.

Active runs (queued and running) with their batch going on — a progress bar, items with an outcome of the
batch's items, items/s over the last RATE_WINDOW seconds, ETA, failed items, and what its model calls cost so far
(calls, tokens in+out, USD when priced: scheduler/ops/usage.py, where the terminal has room) — then the workers
in the registry (pool processes) and the queues (waiting messages, the age of the next one, chunks in flight).
Everything comes from one `ClusterView` snapshot per refresh (scheduler/ops/metrics.py), the same numbers
`chordflow metrics` serves.

Keys are read from the terminal in cbreak mode (one key at a time, no echo; Ctrl-C still works), and the
terminal's mode is restored however top ends. Not on a terminal, top prints one view and exits (1 when Redis
does not answer).
"""

from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ir.errors import BackendError
from scheduler.ops.metrics import ClusterSnapshot, ClusterView, RunView
from worker import redact

#: Seconds of history items/s is measured over.
RATE_WINDOW = 10.0
#: Keys that quit.
QUIT = ("q", "Q")


class Rates:
    """Items/s of each run over the last RATE_WINDOW seconds, from the item counts of successive snapshots."""

    def __init__(self, window: float = RATE_WINDOW):
        self.window = window
        self.samples: dict[str, deque[tuple[float, int]]] = {}

    def add(self, snap: ClusterSnapshot) -> None:
        for view in snap.active:
            samples = self.samples.setdefault(view.run_id, deque())
            samples.append((snap.taken, view.done))
            while len(samples) > 2 and snap.taken - samples[1][0] >= self.window:
                samples.popleft()
        for gone in set(self.samples) - {v.run_id for v in snap.active}:
            del self.samples[gone]

    def rate(self, run_id: str) -> float | None:
        samples = self.samples.get(run_id)
        if not samples or len(samples) < 2 or samples[-1][0] <= samples[0][0]:
            return None
        (t0, done0), (t1, done1) = samples[0], samples[-1]
        return max(0, done1 - done0) / (t1 - t0)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


#: The runs table's columns; a narrow terminal drops them in DROPPED_FIRST's order, never the run's whole id.
RUN_COLUMNS = ("run", "workflow", "status", "node", "progress", "items", "items/s", "ETA", "failed", "llm")
DROPPED_FIRST = ("llm", "workflow", "node", "items/s", "ETA")
#: The progress bar's width: at most WIDEST, narrowed down to NARROWEST to leave room for the other columns.
WIDEST_BAR, NARROWEST_BAR = 24, 8
#: Screen lines the runs table may not take (the header, the table's frame, the workers' table, the cluster line).
OTHER_LINES = 12


def _runs_table(snap: ClusterSnapshot, rates: Rates, width: int, height: int) -> Table:
    rows = [_run_row(view, rates.rate(view.run_id)) for view in snap.active]
    room = max(1, height - OTHER_LINES - max(1, len(snap.workers)))
    shown, bar = _layout(rows, width)
    more = f", {len(rows) - room} more not shown" if len(rows) > room else ""
    table = Table(title=f"active runs ({len(snap.active)}{more})", title_justify="left", expand=False)
    for column in shown:
        justify = "right" if column in ("items/s", "ETA", "failed") else "left"
        table.add_column(column, no_wrap=True, justify=justify, overflow="ellipsis")
    for row in rows[:room]:
        cells = dict(zip(RUN_COLUMNS, row, strict=True))
        if isinstance(cells["progress"], ProgressBar):
            cells["progress"].width = bar
        table.add_row(*(cells[column] for column in shown))
    return table


def _layout(rows: list[list[str | Text | ProgressBar]], width: int) -> tuple[list[str], int]:
    """The columns that fit in `width` (each its widest cell and 3 for the frame) and the progress bar's width."""
    widths = {column: len(column) for column in RUN_COLUMNS}
    for row in rows:
        for column, cell in zip(RUN_COLUMNS, row, strict=True):
            if not isinstance(cell, ProgressBar):
                widths[column] = max(widths[column], len(cell.plain if isinstance(cell, Text) else cell))
    shown = list(RUN_COLUMNS)
    for column in (None, *DROPPED_FIRST):
        if column is not None:
            shown.remove(column)
        rest = sum(widths[c] + 3 for c in shown if c != "progress") + 4
        if rest + NARROWEST_BAR <= width:
            break
    return shown, max(NARROWEST_BAR, min(WIDEST_BAR, width - rest))


def _run_row(view: RunView, rate: float | None) -> list[str | Text | ProgressBar]:
    batch = view.current
    if batch is None:
        bar: str | ProgressBar = ""
        items = f"{view.done} done" if view.done else "-"
        if view.waiting is not None and view.status == "running":
            items = view.waiting.describe()
        eta = None
    else:
        bar = ProgressBar(total=max(batch.total, 1), completed=batch.done, width=WIDEST_BAR)
        total = f"{batch.total}" if view.total_known else f"{batch.total}+"
        items = f"{batch.done}/{total} {batch.ratio:.0%}"
        left = batch.total - batch.done
        eta = left / rate if rate and view.total_known else (0.0 if not left and view.total_known else None)
    node = batch.node if batch is not None else view.node or "-"
    failed = Text(str(view.failed), style="bold red" if view.failed else "")
    speed = f"{rate:.1f}" if rate is not None else "-"
    return [view.run_id, Text(view.workflow), view.status, Text(node), bar, items, speed, duration(eta), failed,
            llm_cell(view.llm)]  # fmt: skip


def llm_cell(totals: dict[str, Any] | None) -> str:
    """A run's model calls in a few characters: `12 calls 3400 tok $0.0021` (`-` when it keeps none)."""
    if totals is None:
        return "-"
    cost = f" ${totals['cost_usd']:.4f}" if "cost_usd" in totals else ""
    return f"{totals['calls']} calls {totals['input_tokens'] + totals['output_tokens']} tok{cost}"


def _workers_table(snap: ClusterSnapshot) -> Table:
    table = Table(title=f"workers ({len(snap.workers)})", title_justify="left")
    table.add_column("worker", no_wrap=True)
    table.add_column("processes", justify="right")
    for hostname, processes in sorted(snap.workers.items()):
        table.add_row(Text(hostname), str(processes))
    if not snap.workers:
        table.add_row(Text("no worker is registered", style="yellow"), "0")
    return table


def _cluster_line(snap: ClusterSnapshot) -> Text:
    parts = [f"{sum(snap.workers.values())} processes"]
    in_flight = "?" if snap.unacked is None else str(snap.unacked)
    parts.append(f"chunks in flight {in_flight}")
    for queue in snap.queues:
        oldest = f" (oldest {duration(queue.oldest_age)})" if queue.oldest_age is not None and queue.messages else ""
        parts.append(f"queue {queue.name}: {queue.messages} waiting{oldest}")
    ended = {status: sum(n for (s, _), n in snap.runs.items() if s == status) for status in ("succeeded", "failed")}
    parts.append(f"ended runs: {ended['succeeded']} succeeded, {ended['failed']} failed")
    return Text(" | ".join(parts))


def render(snap: ClusterSnapshot, rates: Rates, source: str, width: int = 120, height: int = 40) -> Group:
    """One view laid out for a terminal of `width` x `height` (80x24 included: whole run ids, fewer columns)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.taken))
    header = Text.assemble(("chordflow top", "bold"), f"  {source}  {stamp}  ", ("q", "bold"), " quits")
    runs = _runs_table(snap, rates, width, height)
    return Group(header, runs, _workers_table(snap), _cluster_line(snap))


@contextlib.contextmanager
def keys(stream: object) -> Iterator[Callable[[float], str]]:
    """A reader of single keys from `stream` (waits up to its argument's seconds; "" when none came). A terminal
    is put in cbreak mode meanwhile, and given its mode back on the way out."""
    fd = stream.fileno() if hasattr(stream, "fileno") else -1  # type: ignore[attr-defined]
    saved = None
    if fd >= 0 and os.isatty(fd):
        saved = termios.tcgetattr(fd)
        tty.setcbreak(fd)
    ended = fd < 0

    def read(timeout: float) -> str:
        nonlocal ended
        if ended:  # nothing to read keys from: just pace the refreshes
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return ""
        data = os.read(fd, 32)
        if not data:
            ended = True
        return data.decode(errors="replace")

    try:
        yield read
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run(interval: float = 1.0, queues: Iterable[str] = ()) -> None:
    """Show the view until `q` (or Ctrl-C); once, when stdout is not a terminal."""
    view = ClusterView(queues=queues, every_run=False)  # model calls of the runs shown only
    source = redact.mask_url(view.settings.result_backend)
    console = Console()
    rates = Rates()

    def frame() -> Group | Text:
        try:
            snap = view.snapshot()
        except Exception as exc:  # Redis away: say so, and try again at the next refresh
            return Text(f"chordflow top  {source}: cannot read the cluster: {redact.mask(str(exc))}", style="red")
        rates.add(snap)
        return render(snap, rates, source, console.width, console.height)

    if not console.is_terminal:  # one view; Redis away is an error (one line on stderr, exit 1)
        try:
            snap = view.snapshot()
        except Exception as exc:
            raise BackendError(f"chordflow top: cannot read the cluster at {source}: {exc}") from None
        rates.add(snap)
        console.print(render(snap, rates, source, console.width, console.height))
        return
    with keys(sys.stdin) as read_key, Live(console=console, auto_refresh=False, screen=True) as live:
        try:
            while True:
                live.update(frame(), refresh=True)
                deadline = time.monotonic() + interval
                while (left := deadline - time.monotonic()) > 0:
                    if any(key in QUIT for key in read_key(left)):
                        return
        except KeyboardInterrupt:
            return
