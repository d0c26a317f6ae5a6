"""The `chordflow` command line: run, validate, schema, nodes, worker, cancel, flower.

Every command is a plain click function on the `cli` group. Errors are turned into messages and exit
codes in ONE place, `ChordflowGroup.invoke` (via `report_error`):

- 0 success; 1 the workflow failed or raised while running; 2 usage or validation error; 130 cancelled.
- User errors print one line on stderr starting with ``error:`` (a ValidationError with several problems
  prints one line per problem after the first); ``--debug`` prints the full traceback instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
import traceback
import uuid
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
from rich.table import Table
from rich.text import Text

import ir
from ir.errors import BackendError, NodeTypeError, RemoteError, RunCancelled, StepLimitExceeded, ValidationError
from scheduler.cli import dashboard as cli_dashboard
from scheduler.cli import ops as cli_ops
from scheduler.cli import plans as cli_plans
from scheduler.cli import repair as cli_repair
from worker.runs.record import FINAL
from worker.runs.sqlite import LocalRuns

DEBUG_KEY = "chordflow.debug"
FAILED_NODE_KEY = "chordflow.failed_node"
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CANCELLED, EXIT_TIMEOUT = 0, 1, 2, 130, 124
MAX_ERROR_ROWS = 20


class CliUsageError(Exception):
    """Bad command-line usage detected by chordflow itself (exit 2, one line)."""


class WorkflowFailed(Exception):
    """The run finished with status "failed" (an unhandled `error` action): exit 1."""


# -- error reporting: the one place that maps exceptions to messages and exit codes ---------------------


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, KeyboardInterrupt | RunCancelled):
        return EXIT_CANCELLED
    if isinstance(exc, CliUsageError | ValidationError | NodeTypeError):
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
    if isinstance(exc, CliUsageError | NodeTypeError | WorkflowFailed | StepLimitExceeded | BackendError):
        return [f"error: {_one_line(message)}"]
    if isinstance(exc, RemoteError):
        text = f"{_one_line(message)} (raised on a worker)"
    else:
        text = f"{type(exc).__name__}: {_one_line(message)}" if message.strip() else type(exc).__name__
    if node and f"'{node}'" not in text:
        text += f" (node '{node}')"
    return [f"error: {text}"]


def report_error(exc: BaseException, *, debug: bool = False, node: str | None = None) -> int:
    """Print `exc` on stderr (a traceback with --debug, secrets masked too) and return the exit code."""
    from worker import redact

    if debug:
        click.echo(redact.mask("".join(traceback.format_exception(exc))).rstrip("\n"), err=True)
    else:
        for line in error_lines(exc, node):
            click.echo(line, err=True)
    return exit_code_for(exc)


class ChordflowGroup(click.Group):
    """A click group whose `invoke` turns any command's exception into a message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:  # `chordflow results RUN | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(EXIT_OK) from None
        except (Exception, KeyboardInterrupt) as exc:
            code = report_error(exc, debug=bool(ctx.meta.get(DEBUG_KEY)), node=ctx.meta.get(FAILED_NODE_KEY))
            raise click.exceptions.Exit(code) from None


def _stdout() -> Console:
    return Console(highlight=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _use_cwd_modules() -> None:
    """Like `python -m`: modules in the working directory (e.g. `examples.wordcount`) are importable."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


@click.group(cls=ChordflowGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """chordflow: run JSON workflows of PocketFlow nodes, with batch fan-out locally or on Celery."""
    ctx.meta[DEBUG_KEY] = debug
    _use_cwd_modules()


# -- run ---------------------------------------------------------------------------------------------------


def parse_inputs(pairs: tuple[str, ...], inputs_file: str | None, wf: ir.Workflow | None = None) -> dict[str, Any]:
    """`--inputs-file` (a JSON object) first, then each `--input KEY=VALUE` on top of it.

    With `wf`, an `--input` key the workflow does not declare is an error (with a did-you-mean).
    """
    from scheduler.inputs import parse_input_value, unknown_input
    from scheduler.inputs_file import read_whole

    inputs: dict[str, Any] = {}
    if inputs_file is not None:
        inputs.update(read_whole(inputs_file))
    unknown = []
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliUsageError(f"--input {pair!r}: expected KEY=VALUE")
        if wf is not None and (problem := unknown_input(wf, key)):
            unknown.append(f"--input {key}=...: {problem}")
        inputs[key] = parse_input_value(value, f"--input {key}")
    if unknown:
        raise ValidationError(unknown)
    return inputs


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


def _make_event_handler(meta: dict[str, Any], display: ProgressDisplay | None) -> Callable[[dict[str, Any]], None]:
    def on_event(event: dict[str, Any]) -> None:
        if event.get("type") == "error" and event.get("node"):
            meta.setdefault(FAILED_NODE_KEY, event["node"])
        if display is not None:
            display(event)

    return on_event


@contextlib.contextmanager
def _cancel_on_sigint(cancelled: threading.Event) -> Iterator[None]:
    """Ctrl-C sets the run's cancel flag first (batch threads stop taking items), then interrupts."""

    def on_sigint(signum: int, frame: Any) -> None:
        cancelled.set()
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    except KeyboardInterrupt:
        cancelled.set()
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


# -- rendering values: one way for the text summary and for --output json ---------------------------------------

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape_surrogates(text: str) -> str:
    """Lone surrogates (undecodable bytes of a file name) cannot be written as UTF-8: keep them as escapes."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _json_default(value: Any) -> Any:
    """A value JSON cannot hold: a set becomes a sorted list, anything else (bytes, dates, objects) its str()."""
    if isinstance(value, set | frozenset):
        try:
            return sorted(value)
        except TypeError:
            return sorted(value, key=repr)
    return str(value)


def jsonable(value: Any) -> Any:
    """`value` as JSON holds it (see `_json_default`); what still cannot be JSON (a dict key that is not a
    string or number, a value inside itself) becomes its str()."""
    try:
        return json.loads(json.dumps(value, default=_json_default))
    except (TypeError, ValueError, RecursionError):
        return str(value)


def to_json(value: Any) -> str:
    """JSON text of `value` (via `jsonable`) with non-ASCII characters as they are, not as escapes."""
    return _escape_surrogates(json.dumps(jsonable(value), ensure_ascii=False))


def run_report(
    run_id: str | None, status: str, error: str | None, outputs: dict[str, Any], store: dict[str, Any]
) -> str:
    """The one JSON object `run --output json` prints, whatever happened (DESIGN section 2)."""
    report = {
        "run_id": run_id,
        "status": status,
        "error": error,
        "outputs": {str(name): jsonable(value) for name, value in outputs.items()},
        "store": {str(key): jsonable(value) for key, value in dict(store).items()},
    }
    return _escape_surrogates(json.dumps(report, ensure_ascii=False))


def error_text(exc: BaseException, node: str | None = None) -> str:
    """The `error` of a run report: what `error_lines` prints on stderr, without the ``error:`` prefix."""
    if isinstance(exc, KeyboardInterrupt | RunCancelled):
        return "run cancelled"
    return "\n".join(error_lines(exc, node)).removeprefix("error: ")


def _render(value: Any, limit: int | None = None) -> str:
    text = _escape_surrogates(value) if isinstance(value, str) else to_json(value)
    if limit is not None and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def print_summary(console: Console, wf: ir.Workflow, result: Any) -> None:
    """The human summary: status, each batch node's counts and errors, the workflow outputs."""
    style = {"success": "bold green", "failed": "bold red"}.get(result.status, "bold yellow")
    line = Text("status: ")
    line.append(result.status, style=style)
    n = len(wf.nodes)
    line.append(f"  ({n} node{'' if n == 1 else 's'}, {result.duration_s:.2f}s, run {result.run_id})")
    console.print(line)
    for spec in wf.nodes:
        agg = result.shared.get(spec.id) if spec.batch else None
        if not isinstance(agg, dict) or "count" not in agg:
            continue
        console.print(
            Text(
                f"{spec.id}: {agg.get('count', 0)} items, {agg.get('success_count', 0)} succeeded, "
                f"{agg.get('error_count', 0)} failed"
            )
        )
        errors = agg.get("errors") or []
        if errors:
            table = Table(title=Text(f"{spec.id} errors"), title_justify="left")
            table.add_column("index", justify="right")
            table.add_column("item", overflow="fold")
            table.add_column("error", overflow="fold")
            for entry in errors[:MAX_ERROR_ROWS]:
                kind = entry.get("exception_type")
                message = f"{kind}: {entry.get('error')}" if kind else str(entry.get("error"))
                table.add_row(str(entry.get("index")), Text(_render(entry.get("item"), 60)), Text(message))
            console.print(table)
            if len(errors) > MAX_ERROR_ROWS:
                console.print(Text(f"... and {len(errors) - MAX_ERROR_ROWS} more errors"))
    if result.outputs:
        console.print("outputs:")
        for name, value in result.outputs.items():
            console.print(Text(f"  {name} = {_render(value, 200)}"))


def dataset_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--items FILE` and its options: a dataset job, the workflow once per record (scheduler/datasets.py)."""
    options = [
        click.option("--items", type=str, metavar="FILE", help="Run the workflow once per record of FILE."),
        click.option("--as", "as_", default="record", show_default=True, metavar="NAME",
                     help="The input each record is given as ('-': the record's fields are the inputs)."),
        click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "json"]), default=None,
                     help="The records file's format (default: from its extension)."),
        click.option("--skip-bad-records", is_flag=True, help="A malformed record fails alone instead of the job."),
        click.option("--tolerated-failure-percent", type=float, default=None, metavar="P",
                     help="The job succeeds while at most P% of its records fail."),
        click.option("--tolerated-failure-count", type=int, default=None, metavar="K",
                     help="The job succeeds while at most K records fail."),
        click.option("--chunk-size", type=int, default=None, metavar="N", help="Records per chunk (default 500)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def _dataset_job(items: str | None, job: dict[str, Any]) -> dict[str, Any] | None:
    """The `scheduler.run` / `submit` keywords of a dataset job, or None (then no dataset option may be set)."""
    if items is not None:
        return {
            "items": items,
            "as_": job["as_"],
            "format": job["fmt"],
            **{k: v for k, v in job.items() if k not in ("as_", "fmt")},
        }
    given = [k for k, v in job.items() if v not in (None, False) and not (k == "as_" and v == "record")]
    if given:
        flag = "--" + given[0].rstrip("_").replace("_", "-").replace("fmt", "format")
        raise CliUsageError(f"{flag} needs --items FILE (a dataset job)")
    return None


@cli.command()
@click.argument("workflow", metavar="WF.json")
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE", help="An input (JSON or text).")
@click.option("--inputs-file", type=str, metavar="F.json", help="A JSON object of inputs.")
@dataset_options
@click.option("--backend", type=click.Choice(["local", "celery"]), default="local", show_default=True)
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--detach", is_flag=True, help="With --backend celery: print the run id and return at once.")
@click.option("--stream", "as_stream", is_flag=True, help="Print the run's events as JSON lines while it runs.")
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@cli_repair.repair_options
@click.pass_context
def run(
    ctx: click.Context,
    workflow: str,
    pairs: tuple[str, ...],
    inputs_file: str | None,
    backend: str,
    output: str,
    detach: bool,
    as_stream: bool,
    debug: bool,
    items: str | None,
    **job: Any,
) -> None:
    """Run a workflow and print a summary (with --output json: one JSON object, the run report, always).

    With --items FILE: a dataset job, the workflow once per record; exit 1 when more records failed than
    tolerated (any, without a threshold); `chordflow results RUN` streams each record's result."""
    if debug:
        ctx.meta[DEBUG_KEY] = True
    import scheduler
    from scheduler.compiler import load

    store: dict[str, Any] = {}  # passed as `shared`, so still readable when the run raises
    run_id = uuid.uuid4().hex[:12]
    dataset = _dataset_job(items, job)
    if as_stream:
        _stream_events(workflow, parse_inputs(pairs, inputs_file, load(workflow)), backend, run_id)
        return

    def start(**hooks: Any) -> Any:
        wf = load(workflow)
        if dataset is not None and backend == "local":
            inputs = parse_inputs(pairs, inputs_file, None)
            return wf, scheduler.run(wf, inputs, backend=backend, run_id=run_id, **hooks, **dataset)
        if backend == "local":
            inputs = parse_inputs(pairs, inputs_file, wf)
            return wf, scheduler.run(wf, inputs, shared=store, backend=backend, run_id=run_id, **hooks)
        inputs = parse_inputs(pairs, None, None if dataset else wf)
        submitted = {"inputs": inputs, "inputs_file": inputs_file, **(dataset or {})}
        return wf, _submit_and_wait(ctx, wf, submitted, run_id, store, detach, output, hooks["on_event"])

    start = cli_repair.repairing(ctx, start, workflow, backend, run_id, store, (pairs, inputs_file))
    _follow(ctx, output, run_id, store, start)


def _stream_events(workflow: str, inputs: dict[str, Any], backend: str, run_id: str) -> None:
    """`run --stream`: every event of `scheduler.stream` as one JSON line on stdout, the last one `final`;
    the exit code is the run's (0, 1 failed, 130 cancelled). Ctrl-C cancels the run."""
    import scheduler

    final: dict[str, Any] = {}
    events = scheduler.stream(workflow, inputs, backend=backend, run_id=run_id)
    try:
        for event in events:
            click.echo(to_json(event))
            final = event
    finally:
        events.close()
    if final.get("status") == "cancelled":
        raise click.exceptions.Exit(EXIT_CANCELLED)
    if final.get("status") != "success":
        click.echo(f"error: {final.get('error') or 'workflow failed'}", err=True)
        raise click.exceptions.Exit(EXIT_FAILED)


def _submit_and_wait(
    ctx: click.Context,
    wf: ir.Workflow,
    submitted: dict[str, Any],
    run_id: str,
    store: dict[str, Any],
    detach: bool,
    output: str,
    on_event: Callable[[dict[str, Any]], None],
) -> Any:
    """`run --backend celery`: the run lives in the cluster; this process only follows it (Ctrl-C cancels)."""
    from scheduler import durable

    durable.submit(wf, run_id=run_id, **submitted)
    if detach:
        click.echo(run_id)
        raise click.exceptions.Exit(EXIT_OK)
    if output != "json":
        _stderr().print(Text(f"run {run_id} (cancel with: chordflow cancel {run_id})"))
    try:
        return _follow_cluster_run(ctx, run_id, store, None, on_event)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            durable.cancel_run(run_id)
        raise


def _follow_cluster_run(
    ctx: click.Context,
    run_id: str,
    store: dict[str, Any],
    timeout: float | None,
    on_event: Callable[[dict[str, Any]], None] | None,
) -> Any:
    """`durable.wait`, keeping the store (for the JSON report) and the failed node (for the error line)."""
    from scheduler import durable

    try:
        result = durable.wait(run_id, timeout, on_event=on_event)
    except durable.WaitTimeout:
        raise
    except Exception:
        with contextlib.suppress(Exception):
            record, runs = durable.find_run(run_id)
            ctx.meta.setdefault(FAILED_NODE_KEY, record.node)
            store.update(runs.load_store(run_id))
        raise
    store.update(result.shared)
    return result


def _follow(ctx: click.Context, output: str, run_id: str, store: dict[str, Any], start: Callable[..., Any]) -> None:
    """Drive a run (`start(**hooks)` -> (workflow, RunResult)) with the live display and Ctrl-C handling,
    then report it: the summary or the JSON report, and the exit code."""
    display = ProgressDisplay(_stderr()) if output != "json" and sys.stderr.isatty() else None
    cancelled = threading.Event()
    try:
        with _cancel_on_sigint(cancelled), display or contextlib.nullcontext():
            wf, result = start(
                on_event=_make_event_handler(ctx.meta, display),
                on_node_start=display.node_started if display else None,
                cancelled=cancelled,
            )
    except (Exception, KeyboardInterrupt) as exc:
        code = exit_code_for(exc)
        if output == "json":  # the error line on stderr comes from ChordflowGroup.invoke
            click.echo(
                run_report(
                    None if code == EXIT_USAGE else run_id,  # exit 2: the run never started
                    "cancelled" if code == EXIT_CANCELLED else "failed",
                    error_text(exc, ctx.meta.get(FAILED_NODE_KEY)),
                    {},
                    store,
                )
            )
        raise
    if output == "json":
        click.echo(run_report(result.run_id, result.status, result.error, result.outputs, result.shared))
    else:
        print_summary(_stdout(), wf, result)
    if result.status == "cancelled":
        raise RunCancelled(result.error or "run cancelled")
    if result.status != "success":
        raise WorkflowFailed(f"workflow failed: {result.error or result.status}")


# -- durable runs: resume / status / runs -------------------------------------------------------------------


@cli.command()
@click.argument("workflow", metavar="WF.json")
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE", help="An input (JSON or text).")
@click.option("--inputs-file", type=str, metavar="F.json", help="A JSON object of inputs.")
@dataset_options
def submit(workflow: str, pairs: tuple[str, ...], inputs_file: str | None, items: str | None, **job: Any) -> None:
    """Validate a workflow, record the run in Redis and enqueue it; print the run id. Workers do the rest.

    With --items FILE: a dataset job; returns once every record is stored in Redis."""
    from scheduler import durable
    from scheduler.compiler import load

    wf = load(workflow)
    dataset = _dataset_job(items, job) or {}
    if dataset and inputs_file is not None:
        raise CliUsageError("--inputs-file: with --items, give the inputs common to every record with --input")
    inputs = parse_inputs(pairs, None, None if dataset else wf)
    run_id = durable.submit(workflow, inputs, inputs_file=inputs_file, **dataset)
    click.echo(run_id)
    if not durable.workers_registered():
        click.echo(
            f"warning: no chordflow worker is registered; run {run_id} waits in the queue until one starts", err=True
        )


@cli.command()
@click.argument("run_id")
@click.option("--timeout", type=float, default=None, help="Give up after S seconds (exit 124; the run goes on).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def wait(ctx: click.Context, run_id: str, timeout: float | None, output: str) -> None:
    """Follow a run until it ends, with the same display and exit codes as `run` (124: timeout)."""
    from scheduler import durable

    record, _ = durable.find_run(run_id)
    store: dict[str, Any] = {}

    def start(on_event: Any = None, **_: Any) -> Any:
        try:
            result = _follow_cluster_run(ctx, run_id, store, timeout, on_event)
        except durable.WaitTimeout as exc:
            click.echo(f"timeout: {exc}", err=True)
            raise click.exceptions.Exit(EXIT_TIMEOUT) from None
        return ir.load(record.workflow), result

    _follow(ctx, output, run_id, store, start)


@cli.command()
@click.argument("run_id")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--workflow", "edited", default=None, metavar="WF.json",
              help="Go on under an edited workflow: the completed nodes it leaves unchanged are kept, the first "
              "changed one and every node after it run again (a succeeded run too).")  # fmt: skip
@click.pass_context
def resume(ctx: click.Context, run_id: str, output: str, edited: str | None) -> None:
    """Go on with a failed or cancelled run from its last checkpoint (completed nodes are not run again).

    A local run resumes here, to the end; a cluster run is handed back to the workers (follow it with `wait`).
    """
    import scheduler
    from scheduler import durable
    from scheduler.engine import resumable
    from worker.engine.flow import build_flow
    from worker.runs.resume_point import items_from_checkpoint, resume_point

    record, runs = durable.find_run(run_id)
    if record.status not in resumable(edited):
        raise CliUsageError(f"run {run_id} is {record.status}; only a failed or cancelled run can be resumed")
    kept, node, step, why = runs.trail(run_id), record.node, record.step, None
    if edited is not None:
        point = resume_point(runs.steps(run_id), record, build_flow(scheduler.compiler.load(edited)))
        kept, node, step, why = point.kept, point.node, point.step, point.reason
    if output != "json":
        for cached in dict.fromkeys(kept):
            _stderr().print(Text(f"↻ cached {cached}", style="dim"))
        if why is None and (items := items_from_checkpoint(runs, run_id, node, step)):
            _stderr().print(Text(f"↻ cached {items} items of batch node {node} (from the checkpoint)", style="dim"))
        if why is not None:
            _stderr().print(Text(f"resume: {why}: runs again from step {step}"))
    if not isinstance(runs, LocalRuns):
        durable.resume_cluster(run_id, workflow=edited)
        click.echo(run_id)
        return
    store: dict[str, Any] = {}

    def start(**hooks: Any) -> Any:
        result = scheduler.resume(run_id, workflow=edited, **hooks)
        store.update(result.shared)
        return ir.load(edited or record.workflow), result

    _follow(ctx, output, run_id, store, start)


@cli.command()
@click.argument("run_id")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--detach", is_flag=True, help="A cluster job: print the run id and return at once.")
@click.pass_context
def redrive(ctx: click.Context, run_id: str, output: str, detach: bool) -> None:
    """Run a finished dataset job's failed records (and those never run) again, under the same run id.

    Every record that succeeded is kept and not run again; `results` then shows the new outcomes. As often
    as needed. A local job runs here; a cluster job goes to the workers and is followed like `wait`."""
    from scheduler import datasets, durable

    record, _ = durable.find_run(run_id)
    store: dict[str, Any] = {}
    if record.backend == "local":
        _follow(
            ctx, output, run_id, store, lambda **hooks: (ir.load(record.workflow), datasets.redrive(run_id, **hooks))
        )
        return
    records = datasets.redrive(run_id)
    if output != "json":
        _stderr().print(Text(f"run {run_id}: {records} records to run again"))
    if detach:
        click.echo(run_id)
        return

    def start(on_event: Any = None, **_: Any) -> Any:
        return ir.load(record.workflow), _follow_cluster_run(ctx, run_id, store, None, on_event)

    _follow(ctx, output, run_id, store, start)


@cli.command()
@click.argument("run_id")
@click.option("--store", "whole_store", is_flag=True, help="Print the run's final store instead of its outputs.")
@click.option("--node", default=None, help="A batch node: one JSON line per item, in input order.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "json", "csv"]), default="jsonl", show_default=True)
@click.option("--errors", "errors_only", is_flag=True, help="With --node or a dataset job: the failed items only.")
@click.option("--done", "done_only", is_flag=True, help="A dataset job still running: what has finished so far.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None, help="Write to this file.")
def results(
    run_id: str, whole_store: bool, node: str | None, fmt: str, errors_only: bool, done_only: bool, out: str | None
) -> None:
    """A run's declared outputs as one JSON object (--store: the store; --node N: a batch's items).

    A dataset job (--items): one `{"index", "result", "error"}` line per record in input order; while it
    runs, each line is written as its record finishes (--done: only what has finished, then exit)."""
    from scheduler import datasets, durable
    from worker.engine.flow import build_flow
    from worker.engine.stepper import Cursor, ending

    record, runs = durable.find_run(run_id)
    if record.dataset is not None and node is None and not whole_store:
        rows = datasets.rows(record, done_only=done_only, is_final=lambda: durable.find_run(run_id)[0].status in FINAL)
        _write_rows(rows, fmt, errors_only, out, list(record.workflow.get("outputs") or {}))
        return
    if node is None:
        if fmt == "csv":
            raise CliUsageError("--format csv: only for rows (--node N, or a dataset job's records)")
        store = runs.load_store(run_id)
        if whole_store:
            value = store
        elif record.status != "succeeded":
            raise CliUsageError(f"run {run_id} is {record.status}: it has no outputs (try --store)")
        else:
            value = ending(build_flow(ir.load(record.workflow)), Cursor(None), store, None)[2]
        with open(out, "w", encoding="utf-8") if out else contextlib.nullcontext(sys.stdout) as sink:
            sink.write(to_json(value) + "\n")
        return
    try:  # before --out is opened: an unknown node leaves no empty file behind
        rows = runs.batch_rows(run_id, node)
    except LookupError:
        raise CliUsageError(f"--node {node}: run {run_id} has no batch results for node '{node}'") from None
    _write_rows(rows, fmt, errors_only, out)


def _write_rows(
    rows: Iterator[dict[str, Any]], fmt: str, errors_only: bool, out: str | None, columns: list[str] | None = None
) -> None:
    """Rows `{"index", "result", "error"}` as JSON lines, one JSON array or CSV, written one by one.

    CSV is for flat results: a column per result key (`columns`, else the first dict result's keys),
    nested values as JSON text."""
    if errors_only:
        rows = (row for row in rows if row["error"] is not None)
    with open(out, "w", encoding="utf-8", newline="") if out else contextlib.nullcontext(sys.stdout) as sink:
        if fmt == "csv":
            _write_csv(rows, sink, list(columns or []))
        elif fmt == "json":  # one JSON array, still written row by row
            sink.write("[")
            for i, row in enumerate(rows):
                sink.write(("," if i else "") + to_json(row))
            sink.write("]\n")
        else:
            for row in rows:
                sink.write(to_json(row) + "\n")


def _write_csv(rows: Iterator[dict[str, Any]], sink: Any, columns: list[str]) -> None:
    import csv
    import itertools

    held: list[dict[str, Any]] = []
    if not columns:  # the first dict result names the columns (the rows before it wait, a few at most)
        for row in rows:
            held.append(row)
            if isinstance(row["result"], dict):
                columns = [str(k) for k in row["result"]]
                break
    writer = csv.writer(sink)
    writer.writerow(["index", *(columns or ["result"]), "error"])
    for row in itertools.chain(held, rows):
        result = row["result"]
        values = [result.get(c) for c in columns] if isinstance(result, dict) else [result] * bool(not columns)
        values += [None] * (len(columns or ["result"]) - len(values))
        cells = [v if isinstance(v, str) else "" if v is None else to_json(v) for v in values]
        writer.writerow([row["index"], *cells, row["error"] or ""])


@cli.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON.")
def status(run_id: str, as_json: bool) -> None:
    """Where a run stands: status, current node, steps, batch counts, error."""
    from scheduler import durable

    info = durable.status(run_id)
    if as_json:
        click.echo(to_json(info))
        return
    console = _stdout()
    console.print(Text(f"run {info['run_id']}: {info['status']}  ({info['workflow']}, {info['backend']})"))
    console.print(Text(f"  steps: {info['steps']}  node: {info['node'] or '-'}"))
    for node, counts in info["batches"].items():
        console.print(Text(f"  {node}: {counts['done']}/{counts['total']} items, {counts['failed']} failed"))
    if "records" in info:
        r = info["records"]
        total = r["total"] if r["total"] is not None else f"{r['read']}+ (reading)"
        eta = f", ETA {r['eta_s']:.0f}s" if r["eta_s"] is not None and info["status"] == "running" else ""
        console.print(Text(f"  records: {r['done']}/{total} done, {r['failed']} failed, {r['rate']:.1f}/s{eta}"))
    if info["error"]:
        console.print(Text(f"  error: {info['error']}"))


@cli.command()
@click.option("--status", "status_", type=click.Choice(["queued", "running", "succeeded", "failed", "cancelled"]))
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a list of status objects.")
def runs(status_: str | None, limit: int, as_json: bool) -> None:
    """Recent runs, newest first."""
    from scheduler import datasets, durable

    records = durable.recent(status_, limit)
    if as_json:
        click.echo(to_json([r.status_dict() for r in records]))
        return
    table = Table(title="runs", title_justify="left")
    for column in ("run", "workflow", "backend", "status", "progress", "started", "duration"):
        table.add_column(column)
    for r in records:
        done = sum(c["done"] for c in r.batches.values())
        total = sum(c["total"] for c in r.batches.values())
        progress = f"{done}/{total} items" if total else f"{r.step} steps"
        if r.dataset is not None:  # a dataset job: its records (one read of its counts)
            with contextlib.suppress(Exception):
                counts = datasets.progress(r)
                progress = f"{counts['done']}/{counts['total'] if counts['total'] is not None else '?'} records"
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created))
        table.add_row(
            r.run_id, Text(r.name), r.backend, r.status, progress, started, f"{r.updated - r.created:.1f}s"
        )  # fmt: skip
    _stdout().print(table)


# -- validate / schema / nodes ---------------------------------------------------------------------------------


@cli.command()
@click.argument("workflow", metavar="WF.json")
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def validate(ctx: click.Context, workflow: str, debug: bool) -> None:
    """Check a workflow (shape, edges, templates, node types) without running it."""
    if debug:
        ctx.meta[DEBUG_KEY] = True
    from scheduler.compiler import load

    wf = load(workflow)
    for warning in wf.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"ok: {len(wf.nodes)} nodes")


@cli.command()
def schema() -> None:
    """Print the JSON Schema of the workflow IR."""
    click.echo(json.dumps(ir.json_schema(), indent=2))


def _first_doc_line(cls: type) -> str:
    doc = (cls.__dict__.get("__doc__") or "").strip()
    return doc.splitlines()[0] if doc else ""


def _params_text(cls: type) -> str:
    params = getattr(cls, "PARAMS", None)
    if isinstance(params, dict):
        return "\n".join(f"{name}: {desc}" if desc else str(name) for name, desc in params.items())
    if isinstance(params, list | tuple | set):
        return "\n".join(str(name) for name in params)
    return ""


@cli.command()
def nodes() -> None:
    """List the registered node types with their params."""
    from worker.nodes import all_types

    table = Table(title="node types", title_justify="left")
    table.add_column("type", no_wrap=True)
    table.add_column("params", overflow="fold")
    table.add_column("description", overflow="fold")
    for name, cls in all_types().items():
        table.add_row(Text(name), Text(_params_text(cls)), Text(_first_doc_line(cls)))
    _stdout().print(table)


# -- the cluster: worker / cancel / flower --------------------------------------------------------------------


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--concurrency", "-c", type=int, default=None, help="Pool processes (default: CPU count).")
@click.option("--queues", "-Q", default=None, help="Comma-separated queues (default: CHORDFLOW_QUEUE or chordflow).")
@click.option("--loglevel", "-l", default="info", show_default=True)
@click.option("--pool", "-P", default="prefork", show_default=True, help="Celery pool: prefork, solo or threads.")
@click.option("--insecure", is_flag=True, help="Run without a signing key: unsigned tasks (private broker only).")
@click.option(
    "--metrics-port", default=None, metavar="[ADDRESS:]PORT",
    help="Serve this worker's Prometheus metrics (chunks, items, advances) on PORT (address default 127.0.0.1).",
)  # fmt: skip
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(
    concurrency: int | None,
    queues: str | None,
    loglevel: str,
    pool: str,
    insecure: bool,
    metrics_port: str | None,
    celery_args: tuple[str, ...],
) -> None:
    """Run a Celery worker for chordflow chunks (extra arguments go to `celery worker`)."""
    from worker import settings
    from worker.cluster import signing
    from worker.cluster.app import current_app
    from worker.nodes import registry

    if insecure:
        os.environ["CHORDFLOW_INSECURE"] = "1"  # what `celery -A worker.app worker` reads too
    signing.worker_may_start(current_app())  # no key and not --insecure: one line, before Celery starts
    registry.load_plugins()  # fail here, with one line, if a plugin cannot be imported
    if metrics_port is not None:
        _serve_worker_metrics(metrics_port)
    argv = ["worker", "-l", loglevel, "-P", pool, "-Q", queues or settings.load().queue]
    if concurrency:
        argv += ["-c", str(concurrency)]
    current_app().worker_main(argv=[*argv, *celery_args])


def _serve_worker_metrics(where: str) -> None:
    from scheduler.ops import metrics

    address, _, port = where.rpartition(":")
    if not port.isdigit():
        raise CliUsageError(f"--metrics-port: expected PORT or ADDRESS:PORT, got '{where}'")
    address = address.strip("[]") or "127.0.0.1"
    try:
        metrics.serve_worker_metrics(int(port), address)
    except OSError as exc:
        raise CliUsageError(f"--metrics-port: cannot serve on {address}:{port}: {exc.strerror or exc}") from None


@cli.command()
@click.argument("run_id")
def cancel(run_id: str) -> None:
    """Cancel a distributed run: chunks stop between items, queued chunks are revoked, no new step starts."""
    from scheduler import durable

    revoked = durable.cancel_run(run_id)
    click.echo(f"cancel requested for run {run_id}: {revoked} chunks revoked")


@cli.command()
@click.option("--port", type=int, default=5555, show_default=True)
@click.option("--address", default="127.0.0.1", show_default=True)
@click.option("--unauthenticated", is_flag=True, help="Start without basic auth (only on a trusted network).")
def flower(port: int, address: str, unauthenticated: bool) -> None:
    """Start Flower on the configured broker, with basic auth from FLOWER_BASIC_AUTH (user:password)."""
    from worker.cluster.app import current_app

    auth = os.environ.get("FLOWER_BASIC_AUTH", "")
    if not auth and not unauthenticated:
        raise CliUsageError("set FLOWER_BASIC_AUTH=user:password (or pass --unauthenticated) to start Flower")
    if auth and not all(":" in pair for pair in auth.split(",")):
        raise CliUsageError("FLOWER_BASIC_AUTH must be user:password[,user2:password2]")
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if auth:
        argv.append(f"--basic-auth={auth}")
    current_app().start(argv=argv)


cli.add_command(cli_plans.run_plan)
cli.add_command(cli_repair.repair_run)
cli.add_command(cli_plans.plan_to_ir)
cli.add_command(cli_ops.metrics)
cli.add_command(cli_ops.top)
cli.add_command(cli_dashboard.dashboard)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="chordflow")
