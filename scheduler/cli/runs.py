"""Runs already started, found by run id in the run store (local SQLite or the cluster's Redis):
`status`, `runs`, `wait`, `update`, `cancel`, going on with one: `resume`, `redrive`, `repair`, and deleting
them: `purge`, `runs --prune`. What only a run's resumption needs (the IR's models) is imported where it is used:
`wait` starts without it."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

import ir
from ir import durations
from ir.errors import CliUsageError, WaitTimeout
from scheduler.cli import repair as cli_repair
from scheduler.cli import rowsfile
from scheduler.cli.errors import EXIT_TIMEOUT
from scheduler.cli.follow import follow, follow_cluster_run
from scheduler.cli.options import run_id_argument
from scheduler.cli.output import llm_line, plain, stderr_console, stdout_console, to_json
from worker.runs.record import FINAL


@click.command()
@run_id_argument
@click.option("--timeout", type=float, default=None, help="Give up after S seconds (exit 124; the run goes on).")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@rowsfile.out_option
@click.pass_context
def wait(ctx: click.Context, run_id: str, timeout: float | None, output: str, rows_out: str | None) -> None:
    """Follow a run until it ends, with the same display and exit codes as `run` (124: timeout).

    --out FILE (a dataset job): its rows written to FILE as its chunks finish, so no `results` is needed after."""
    from scheduler import lookup

    record, _ = lookup.find_run(run_id)
    if rows_out is not None and record.dataset is None:
        raise CliUsageError(rowsfile.not_a_dataset(f"run {run_id}"))
    store: dict[str, Any] = {}

    def start(on_event: Any = None, **_: Any) -> Any:
        try:
            result = follow_cluster_run(ctx, run_id, store, timeout, on_event)
        except WaitTimeout as exc:
            click.echo(f"timeout: {exc}", err=True)
            raise click.exceptions.Exit(EXIT_TIMEOUT) from None
        return (lambda: ir.load(record.workflow)), result  # loaded for the text summary only

    if rows_out is None:
        follow(ctx, output, run_id, store, start, owns=False)
        return
    with rowsfile.written_as_it_runs(rows_out, run_id, record.backend):
        follow(ctx, output, run_id, store, start, owns=False)


@click.command()
@run_id_argument
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
    from scheduler import api, lookup
    from worker.runs.record import resume_refusal

    record, _ = lookup.find_run(run_id)
    if refusal := resume_refusal(record, edited):  # before the plan: a dataset job has no steps to go on from
        raise CliUsageError(refusal)
    plan = api.plan_resume(run_id, edited)
    if output != "json":
        for cached in dict.fromkeys(plan.kept):
            stderr_console().print(plain(f"↻ cached {cached}", style="dim"))
        if items := plan.cached_items:
            stderr_console().print(
                plain(f"↻ cached {items} items of batch node {plan.node} (from the checkpoint)", style="dim")
            )
        if plan.reason is not None:
            stderr_console().print(plain(f"resume: {plan.reason}: runs again from step {plan.step}"))
    if plan.runs.durable:
        api.resume_cluster(run_id, workflow=edited)
        click.echo(run_id)
        return
    record = plan.record
    store: dict[str, Any] = {}

    def start(**hooks: Any) -> Any:
        result = scheduler.resume(run_id, workflow=edited, **hooks)
        store.update(result.shared)
        from ir.loader import given_inputs

        return ir.load(edited or record.workflow, inputs=given_inputs(record.workflow)), result

    follow(ctx, output, run_id, store, start)


@click.command()
@run_id_argument
@click.option("--node", default=None, metavar="N",
              help="A workflow run: run batch node N's failed items again (its succeeded ones are kept), then the "
              "nodes after it.")  # fmt: skip
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--detach", is_flag=True, help="A cluster run: print the run id and return at once.")
@click.pass_context
def redrive(ctx: click.Context, run_id: str, node: str | None, output: str, detach: bool) -> None:
    """Run a finished dataset job's failed records (and those never run) again, under the same run id; with
    --node N, a finished run's batch node N's failed items, then every node after it.

    Every record or item that succeeded is kept and not run again; `results` then shows the new outcomes. As
    often as needed. A local run goes on here; a cluster run goes to the workers and is followed like `wait`."""
    from scheduler import api, lookup

    record, runs = lookup.find_run(run_id)
    store: dict[str, Any] = {}
    if detach and not runs.durable:
        raise CliUsageError(f"--detach: run {run_id} is a local run; it goes on in this process")
    if node is not None and output != "json":
        plan = api.plan_redrive(run_id, node)
        for cached in dict.fromkeys(plan.kept):
            stderr_console().print(plain(f"↻ cached {cached}", style="dim"))
        stderr_console().print(plain(f"↻ cached {plan.cached_items} items of batch node {node}", style="dim"))
    if not runs.durable:
        follow(
            ctx, output, run_id, store,
            lambda **hooks: (ir.load(record.workflow), api.redrive(run_id, node, **hooks)),
        )  # fmt: skip
        return
    again = api.redrive(run_id, node)
    if output != "json":
        what = "records" if node is None else f"failed items of batch node {node}"
        stderr_console().print(plain(f"run {run_id}: {again} {what} to run again"))
    if detach:
        click.echo(run_id)
        return

    def start(on_event: Any = None, **_: Any) -> Any:
        return ir.load(record.workflow), follow_cluster_run(ctx, run_id, store, None, on_event)

    follow(ctx, output, run_id, store, start)


@click.command("repair")
@run_id_argument
@cli_repair.out_option
@cli_repair.generator_option
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.pass_context
def repair_run(ctx: click.Context, run_id: str, repair_out: str | None, repair_generator: str | None, output: str):
    """Repair a failed run's workflow and resume the run from its checkpoint (what `run --repair` does when
    a run fails): completed nodes the repair leaves unchanged are not run again."""
    from scheduler import lookup
    from scheduler.repair import Failure, Runner, generator_named

    generator_named(repair_generator)
    record, runs = lookup.find_run(run_id)
    if record.status != "failed":
        cli_repair.usage_error(f"run {run_id} is {record.status}; only a failed run can be repaired")
    failure = Failure.from_error_line(record.error or "failed", run_id, record.node)
    options = cli_repair.RepairOptions(repair_out, repair_generator)
    store: dict[str, Any] = {}

    def start(**hooks: Any) -> Any:
        runner = Runner("celery" if runs.durable else "local", None, run_id, hooks)
        name = Path(record.source).name if record.source else f"run {run_id}"
        return cli_repair.run_repair(ctx, record.workflow, failure, runner, options, name, store)

    follow(ctx, output, run_id, store, start)


@click.command()
@run_id_argument
@click.option("--json", "as_json", is_flag=True, help="Print the status object as JSON.")
def status(run_id: str, as_json: bool) -> None:
    """Where a run stands: status, current node, steps, batch counts, error."""
    from scheduler import api

    info = api.status(run_id)
    if as_json:
        click.echo(to_json(info))
        return
    console = stdout_console()
    console.print(plain(f"run {info['run_id']}: {info['status']}  ({info['workflow']}, {info['backend']})"))
    if "records" not in info:  # a dataset job's progress is its records (`steps: 0  node: -` says nothing)
        console.print(plain(f"  steps: {info['steps']}  node: {info['node'] or '-'}  priority: {info['priority']}"))
    for node, counts in info["batches"].items():
        console.print(plain(f"  {node}: {counts['done']}/{counts['total']} items, {counts['failed']} failed"))
    if "waiting" in info:
        console.print(plain(f"  {info['waiting']['node']}: {info['waiting']['text']}"))
        for batch in info["waiting"].get("provider_batches", ()):  # each one's counts
            console.print(plain(f"    {batch['provider']} {batch['id']}: {batch['done']}/{batch['total']} answered, "
                                f"{batch['failed']} refused ({batch['state']})"))  # fmt: skip
    if "records" in info:
        r = info["records"]
        total = r["total"] if r["total"] is not None else f"{r['read']}+ (reading)"
        if r["total"] is None and info["status"] in FINAL:  # its file was never read to the end: the error says why
            total = f"{r['read']} read"
        eta = f", ETA {r['eta_s']:.0f}s" if r["eta_s"] is not None and info["status"] == "running" else ""
        console.print(plain(f"  records: {r['done']}/{total} done, {r['failed']} failed, {r['rate']:.1f}/s{eta}"))
    if "workers" in info:
        live = ", ".join(f"{host} ({n})" for host, n in sorted(info["workers"].items()))
        console.print(plain(f"  workers: {live or 'none registered (the run waits for one)'}"))
    if "llm" in info:
        console.print(plain("  " + llm_line(info["llm"])))
    for change in info.get("updates") or []:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(change["at"]))
        settings = ", ".join(f"{name}={value}" for name, value in change["changes"].items())
        console.print(plain(f"  updated {at}: {settings}"))
    if info["error"]:
        console.print(plain(f"  error: {info['error']}"))


@click.command()
@click.option(
    "--status", "status_", type=click.Choice(["queued", "running", "succeeded", "success", "failed", "cancelled"]),
    help="Only runs with this status (`success`, as a run's report says it, is `succeeded`).",
)  # fmt: skip
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a list of status objects.")
@click.option("--prune", is_flag=True, help="Delete the ended runs (both stores) not updated for --older-than D.")
@click.option("--older-than", metavar="D", default=None, help="With --prune: an age, like 7d, 12h, 30m or 90s.")
def runs(status_: str | None, limit: int, as_json: bool, prune: bool, older_than: str | None) -> None:
    """Recent runs, newest first; with --prune --older-than D, delete the old ones instead (never a running one)."""
    from scheduler import lookup
    from scheduler.datasets import reading

    status_ = "succeeded" if status_ == "success" else status_
    if prune or older_than is not None:
        _prune(prune, older_than, status_)
        return
    records = lookup.recent(status_, limit, unreachable=_warn_local_only)
    if as_json:
        click.echo(to_json([r.status_dict() for r in records]))
        return
    rows = [_run_row(r, reading) for r in records]
    console = stdout_console()
    if not sys.stdout.isatty():  # a pipe or a file: whole values, one tab-separated line per run
        for row in [RUNS_COLUMNS, *rows]:
            click.echo("\t".join(cell.replace("\t", " ") for cell in row))
        return
    shown = _fitting_columns(rows, console.width)
    from rich.table import Table

    table = Table(title="runs", title_justify="left")
    for column in shown:
        if column == "run":  # a whole id always: it is what every other command takes
            table.add_column(column, no_wrap=True, min_width=max([len(row[0]) for row in rows] + [3]))
        else:
            table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(plain(cell) for column, cell in zip(RUNS_COLUMNS, row, strict=True) if column in shown))
    console.print(table)


def _warn_local_only(exc: Exception) -> None:
    click.echo(f"warning: local runs only: {exc}", err=True)


#: The columns of `runs`; in a narrow terminal DROPPED_FIRST go in its order, `run` and `status` never.
RUNS_COLUMNS = ("run", "workflow", "backend", "priority", "status", "progress", "started", "duration")
DROPPED_FIRST = ("backend", "priority", "duration", "started", "progress", "workflow")


def _run_row(r: Any, reading: Any) -> tuple[str, ...]:
    done = sum(c["done"] for c in r.batches.values())
    total = sum(c["total"] for c in r.batches.values())
    progress = f"{done}/{total} items" if total else f"{r.step} steps"
    if r.dataset is not None:  # a dataset job: its records (one read of its counts)
        with contextlib.suppress(Exception):
            counts = reading.progress(r)
            progress = f"{counts['done']}/{counts['total'] if counts['total'] is not None else '?'} records"
    progress = r.waits or progress
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.created))
    return r.run_id, r.name, r.backend, r.priority, r.status, progress, started, f"{r.updated - r.created:.1f}s"


def _fitting_columns(rows: list[tuple[str, ...]], width: int) -> list[str]:
    """The columns whose whole values fit in `width` (each takes its widest cell and 3 for the borders), dropping
    DROPPED_FIRST in order until they do; a narrower terminal still gets `run` and `status` whole."""
    widths = {column: max([len(column)] + [len(row[i]) for row in rows]) + 3 for i, column in enumerate(RUNS_COLUMNS)}
    shown = list(RUNS_COLUMNS)
    for column in DROPPED_FIRST:
        if sum(widths[c] for c in shown) + 1 <= width:
            break
        shown.remove(column)
    return shown


#: Seconds per unit of `--older-than`.


def _prune(prune: bool, older_than: str | None, status_: str | None) -> None:
    """`runs --prune --older-than D`: one line per store, saying how many runs it deleted."""
    from scheduler import api

    if not prune:
        raise CliUsageError("--older-than: only with --prune")
    if older_than is None:
        raise CliUsageError("--prune needs --older-than D (an age, like 7d, 12h, 30m or 90s)")
    if status_ is not None:
        raise CliUsageError("--status: not with --prune (it deletes every ended run older than D)")
    age = durations.seconds(older_than)
    if age is None:
        raise CliUsageError(f"--older-than {older_than!r}: expected a number and a unit, {durations.EXAMPLES}")
    for where, count in api.prune(age).items():
        if count is None:
            click.echo(f"{where}: not reachable, nothing pruned there", err=True)
        else:
            click.echo(f"pruned {count} run{'' if count == 1 else 's'} from {where}")


@click.command()
@run_id_argument
def purge(run_id: str) -> None:
    """Delete an ended run from the store that holds it: its record, store, checkpoints, kept outcomes, and a
    dataset job's records and results (refused while it runs: `chordflow cancel` it first)."""
    from scheduler import api

    api.purge(run_id)
    click.echo(f"purged {run_id}")


@click.command()
@run_id_argument
@click.option("--max-concurrent", type=int, default=None, metavar="N", help="Items of its batches in flight at once.")
@click.option("--tolerated-failure-percent", type=float, default=None, metavar="P",
              help="A continue batch fails once more than P% of its items failed (0-100).")  # fmt: skip
@click.option("--tolerated-failure-count", type=int, default=None, metavar="K",
              help="A continue batch fails once more than K of its items failed.")  # fmt: skip
@click.option("--priority", default=None, metavar="P", help="high, normal or low.")
@click.option(
    "--budget-tokens", type=int, default=None, metavar="N", help="Its model calls' token budget (then resume)."
)
@click.option("--budget-usd", type=float, default=None, metavar="X", help="Its model calls' USD budget (then resume).")
def update(run_id: str, **changes: Any) -> None:
    """Change a running cluster run's limits: its batches take them within a few seconds; `status` shows the change.
    A budget may also be raised on a run that ended (a run over budget fails): `resume` it then."""
    from scheduler import api

    done = api.update(run_id, **changes)
    click.echo(f"updated run {run_id}: " + ", ".join(f"{name}={value}" for name, value in done.items()))


@click.command()
@run_id_argument
@click.argument("event")
@click.option("--data", "data", metavar="JSON", default=None, help="The event's data, a JSON value.")
def signal(run_id: str, event: str, data: str | None) -> None:
    """Send EVENT to a run: its `wait` node waiting for it goes on, with the data in its namespace; sent before
    the run waits for it, the event is kept until it does."""
    from scheduler import api

    try:
        value = None if data is None else json.loads(data)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--data") from None
    api.signal(run_id, event, value)
    click.echo(f"sent '{event}' to run {run_id}")


@click.command()
@run_id_argument
def cancel(run_id: str) -> None:
    """Cancel a distributed run: chunks stop between items, queued chunks are revoked, no new step starts."""
    from scheduler import api

    revoked = api.cancel(run_id)
    click.echo(f"cancel requested for run {run_id}: {revoked} chunks revoked")
