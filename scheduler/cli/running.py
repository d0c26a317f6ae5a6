"""Starting workflows: `run`, `submit`, and `schedule` (add, list, pause, resume, remove: runs the cluster's workers
make at the times a cron expression names); and plans: `run-plan` runs one, `plan-to-ir` prints the workflow it
compiles to (exit 2 for an invalid plan)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

import click

import ir
from ir.errors import CliUsageError
from scheduler.cli import repair as cli_repair
from scheduler.cli import rowsfile
from scheduler.cli.errors import DEBUG_KEY, EXIT_CANCELLED, EXIT_FAILED, EXIT_OK
from scheduler.cli.follow import cancel_on_signals, follow, follow_cluster_run, make_event_handler, progress_display
from scheduler.cli.options import (
    budget_options,
    dataset_job,
    dataset_options,
    load_for_run,
    priority_option,
    with_budget,
)
from scheduler.cli.output import escape_surrogates, jsonable, plain, stderr_console, stdout_console, to_json


@click.command()
@click.argument("workflow", metavar="WF.json")
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE", help="An input (JSON or text).")
@click.option("--inputs-file", type=str, metavar="F.json", help="A JSON object of inputs.")
@dataset_options
@click.option("--backend", type=click.Choice(["local", "celery"]), default="local", show_default=True)
@priority_option
@budget_options
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--detach", is_flag=True, help="With --backend celery: print the run id and return at once.")
@click.option("--stream", "as_stream", is_flag=True, help="Print the run's events as JSON lines while it runs.")
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@rowsfile.out_option
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
    priority: str | None,
    rows_out: str | None,
    budget_tokens: int | None,
    budget_usd: float | None,
    **job: Any,
) -> None:
    """Run a workflow and print a summary (with --output json: one JSON object, the run report, always).

    With --items FILE: a dataset job, the workflow once per record; exit 1 when more records failed than
    tolerated (any, without a threshold); `chordflow results RUN` streams each record's result, and --out FILE
    writes them to FILE as the records run."""
    if debug:
        ctx.meta[DEBUG_KEY] = True
    import scheduler

    if priority is not None and (backend == "local" or as_stream):
        where = "a streamed run is not queued" if as_stream else "a local run is not queued"
        raise CliUsageError(f"--priority: only with --backend celery and without --stream ({where})")
    if detach and (backend == "local" or as_stream):
        why = "it follows the run's events" if as_stream else "a local run lives in this process"
        raise CliUsageError(f"--detach: only with --backend celery and without --stream ({why})")
    store: dict[str, Any] = {}  # passed as `shared`, so still readable when the run raises
    run_id = uuid.uuid4().hex[:12]
    dataset = dataset_job(items, job)
    if rows_out is not None and (dataset is None or detach or as_stream):
        raise CliUsageError(
            rowsfile.not_a_dataset(workflow) if dataset is None else "--out: not with --detach or --stream (the rows "
            "are written as this command follows the job; `chordflow wait RUN --out FILE` does it later)"
        )  # fmt: skip
    if as_stream:
        _, inputs = load_for_run(workflow, pairs, inputs_file, None, whole=True)  # checked here, loaded by the run
        _stream_events(workflow, inputs, backend, run_id)
        return

    def start(**hooks: Any) -> Any:
        wf, inputs = load_for_run(workflow, pairs, inputs_file, dataset, whole=backend == "local")
        wf = with_budget(wf, budget_tokens, budget_usd)
        if dataset is not None and backend == "local":
            return wf, scheduler.run(wf, inputs, backend=backend, run_id=run_id, **hooks, **dataset)
        if backend == "local":
            return wf, scheduler.run(wf, inputs, shared=store, backend=backend, run_id=run_id, **hooks)
        submitted = {"inputs": inputs, "inputs_file": inputs_file, "priority": priority, **(dataset or {})}
        return wf, _submit_and_wait(ctx, wf, submitted, run_id, store, detach, output, hooks["on_event"])

    start = cli_repair.repairing(ctx, start, workflow, backend, run_id, store, (pairs, inputs_file))
    if rows_out is None:
        follow(ctx, output, run_id, store, start)
    elif backend == "local":  # the rows of each chunk as this process runs it
        with rowsfile.rows_file(rows_out) as sink:
            dataset["on_chunk"] = sink.write  # start() passes it on to scheduler.run
            follow(ctx, output, run_id, store, start)
    else:
        with rowsfile.written_as_it_runs(rows_out, run_id, backend):
            follow(ctx, output, run_id, store, start)


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
    from scheduler import api

    api.submit(wf, run_id=run_id, **submitted)
    if detach:
        click.echo(run_id)
        raise click.exceptions.Exit(EXIT_OK)
    if output != "json":
        stderr_console().print(plain(f"run {run_id} (cancel with: chordflow cancel {run_id})"))
    try:
        return follow_cluster_run(ctx, run_id, store, None, on_event)
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            api.cancel(run_id)
        raise


@click.command()
@click.argument("workflow", metavar="WF.json")
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE", help="An input (JSON or text).")
@click.option("--inputs-file", type=str, metavar="F.json", help="A JSON object of inputs.")
@click.option("--idempotency-key", "key", metavar="KEY", default=None,
              help="Submit at most once per KEY: the same KEY again (within CHORDFLOW_RUN_TTL) prints the first "
              "run's id and records nothing; another workflow or other inputs under it are an error.")  # fmt: skip
@dataset_options
@priority_option
@budget_options
def submit(
    workflow: str,
    pairs: tuple[str, ...],
    inputs_file: str | None,
    items: str | None,
    key: str | None,
    priority: str | None,
    budget_tokens: int | None,
    budget_usd: float | None,
    **job: Any,
) -> None:
    """Validate a workflow, record the run in Redis and enqueue it; print the run id. Workers do the rest.

    With --items FILE: a dataset job; returns once every record is stored in Redis."""
    from scheduler import api, durable

    dataset = dataset_job(items, job) or {}
    if dataset and inputs_file is not None:
        raise CliUsageError("--inputs-file: with --items, give the inputs common to every record with --input")
    if dataset and key is not None:
        raise CliUsageError("--idempotency-key: a dataset job (--items) takes none; only a workflow submit does")
    wf, inputs = load_for_run(workflow, pairs, inputs_file, dataset or None, whole=False)  # checked before anything
    budgeted = with_budget(wf, budget_tokens, budget_usd)

    def repeated(run_id: str) -> None:
        click.echo(f"note: idempotency key '{key}' was used by run {run_id}: nothing new submitted", err=True)

    run_id = api.submit(
        workflow if budgeted is wf else budgeted,  # the file, unless a flag changed the budget: then the workflow
        inputs,
        inputs_file=inputs_file,
        idempotency_key=key,
        on_repeat=repeated,
        priority=priority,
        **dataset,
    )
    click.echo(run_id)
    if not durable.workers_registered():
        click.echo(
            f"warning: no chordflow worker is registered; run {run_id} waits in the queue until one starts", err=True
        )


@click.command("run-plan")
@click.argument("plan", metavar="PLAN.json")
@click.option("--backend", type=click.Choice(["local", "celery"]), default="local", show_default=True)
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def run_plan(ctx: click.Context, plan: str, backend: str, debug: bool) -> None:
    """Run a plan (states by _uid, tool calls) and print the final states by _uid as one JSON object.

    Calls of the same tool that are ready at the same time, across all states, run as ONE batch (one
    batch of chunk tasks with --backend celery). Exit 2 when the plan is invalid, 1 when a tool call fails.
    """
    from scheduler import plans

    if debug:
        ctx.meta[DEBUG_KEY] = True
    display = progress_display()
    cancelled = threading.Event()
    with cancel_on_signals(cancelled), display or contextlib.nullcontext():
        states = plans.run_plan(
            plan,
            backend=backend,
            on_event=make_event_handler(ctx.meta, display),
            on_node_start=display.node_started if display else None,
            cancelled=cancelled,
        )
    click.echo(to_json(states))


@click.command("plan-to-ir")
@click.argument("plan", metavar="PLAN.json")
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def plan_to_ir(ctx: click.Context, plan: str, debug: bool) -> None:
    """Print the IR workflow a plan compiles to (`chordflow run` runs it; its output `states` is the result)."""
    from scheduler import plans

    if debug:
        ctx.meta[DEBUG_KEY] = True
    workflow = plans.compile_plan(plan)
    click.echo(escape_surrogates(json.dumps(jsonable(workflow), indent=2, ensure_ascii=False)))


#: What `schedule add --catchup` takes (worker/cluster/schedules.py CATCHUPS, not imported: it loads the cluster).
CATCHUPS = ("none", "last", "all")


@click.group("schedule")
def schedule() -> None:
    """Run a workflow on the cluster at the times a cron expression names: the workers make each run themselves
    (no other process to keep alive), exactly one per fire however many workers there are."""


@schedule.command("add")
@click.argument("name")
@click.argument("workflow", metavar="WF.json")
@click.option("--cron", required=True, metavar="EXPR",
              help="When: 5 fields (minute hour day month weekday), 6 with seconds first ('*/10 * * * * *'), or "
              "@hourly, @daily, @weekly, @monthly, @yearly.")  # fmt: skip
@click.option("--timezone", default="UTC", show_default=True, metavar="TZ",
              help="The timezone the cron is read in (an IANA name, like Europe/Berlin).")  # fmt: skip
@click.option("--input", "-i", "pairs", multiple=True, metavar="KEY=VALUE", help="An input (JSON or text).")
@click.option("--catchup", type=click.Choice(CATCHUPS), default="last", show_default=True,
              help="The fires missed while no worker ran: none, the latest, or each one (at most 100).")  # fmt: skip
@priority_option
def schedule_add(
    name: str, workflow: str, cron: str, timezone: str, pairs: tuple[str, ...], catchup: str, priority: str | None
) -> None:
    """Add schedule NAME: a run of WF.json at every time --cron names. A schedule named NAME already is replaced
    (said so; the fires it made are not made again). Checked here, like a submit; nothing is written if anything is
    wrong."""
    from ir.errors import ValidationError
    from scheduler import api, durable
    from worker.cluster.schedules import Cron

    try:
        Cron(cron, timezone)
    except ValidationError as exc:  # `cron '...': ...` / `timezone '...': ...`: the option's name first
        raise CliUsageError(f"--{exc}") from None
    _, inputs = load_for_run(workflow, pairs, None, None, whole=True)  # an unknown input with a did-you-mean
    added = api.schedule(
        name, workflow, cron, timezone=timezone, inputs=inputs, catchup=catchup, priority=priority
    )  # fmt: skip
    verb = "replaced" if added["replaced"] else "added"
    click.echo(
        f"{verb} schedule '{name}': {added['workflow']} at '{cron}' ({timezone}), catchup {catchup}; next fire "
        + _fire_text(added["next_fire"], timezone)
    )
    if not durable.workers_registered():
        click.echo(f"warning: no chordflow worker is registered; schedule '{name}' fires once one runs", err=True)


#: The columns of `schedule list`.
SCHEDULE_COLUMNS = ("name", "cron", "timezone", "catchup", "paused", "next fire", "next fire (UTC)", "last run")


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a list of schedule objects.")
def schedule_list(as_json: bool) -> None:
    """Every schedule: its cron, timezone, catchup, whether paused, its next fire (in its timezone and in UTC) and
    the last run it made."""
    from scheduler import api

    found = api.list_schedules()
    if as_json:
        click.echo(to_json(found))
        return
    rows = [
        (
            each["name"], each["cron"], each["timezone"], each["catchup"], "yes" if each["paused"] else "no",
            _when(each["next_fire"], each["timezone"]), _when(each["next_fire"], "UTC"), each["last_run"] or "-",
        )
        for each in found
    ]  # fmt: skip
    if not sys.stdout.isatty():  # a pipe or a file: whole values, one tab-separated line per schedule
        for row in [SCHEDULE_COLUMNS, *rows]:
            click.echo("\t".join(cell.replace("\t", " ") for cell in row))
        return
    from rich.table import Table

    table = Table(title="schedules", title_justify="left")
    for column in SCHEDULE_COLUMNS:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(plain(cell) for cell in row))
    stdout_console().print(table)


@schedule.command("remove")
@click.argument("name")
def schedule_remove(name: str) -> None:
    """Remove schedule NAME: no more runs (those it made are left as they are)."""
    from scheduler import api

    api.unschedule(name)
    click.echo(f"removed schedule '{name}'")


@schedule.command("pause")
@click.argument("name")
def schedule_pause(name: str) -> None:
    """Pause schedule NAME: no run until `schedule resume` (the fires meanwhile are skipped)."""
    from scheduler import api

    api.pause_schedule(name)
    click.echo(f"paused schedule '{name}'")


@schedule.command("resume")
@click.argument("name")
def schedule_resume(name: str) -> None:
    """Resume schedule NAME: it fires again from its first time after now."""
    from scheduler import api

    resumed = api.resume_schedule(name)
    click.echo(f"resumed schedule '{name}': next fire {_fire_text(resumed['next_fire'], resumed['timezone'])}")


def _fire_text(epoch: int, timezone: str) -> str:
    """`2026-12-06 02:00:00 CET (2026-12-06 01:00:00 UTC)`; in UTC once."""
    shown = _when(epoch, timezone)
    return shown if shown.endswith(" UTC") else f"{shown} ({_when(epoch, 'UTC')})"


def _when(epoch: int | None, timezone: str) -> str:
    """`2026-12-06 02:00:00 CET`: a fire time in a timezone ('-': none)."""
    if epoch is None:
        return "-"
    from datetime import datetime
    from zoneinfo import ZoneInfo

    return datetime.fromtimestamp(epoch, ZoneInfo(timezone)).strftime("%Y-%m-%d %H:%M:%S %Z")
