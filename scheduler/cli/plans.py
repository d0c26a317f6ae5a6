"""`chordflow run-plan` and `chordflow plan-to-ir`: plans (seed 001) from the command line.

Standalone click commands, added to the `cli` group by scheduler/cli/group.py. The group turns their
exceptions into one-line errors and exit codes (2 for an invalid plan).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading

import click

from scheduler.cli.errors import DEBUG_KEY
from scheduler.cli.follow import ProgressDisplay, cancel_on_signals, make_event_handler
from scheduler.cli.output import escape_surrogates, jsonable, stderr_console, to_json


@click.command("run-plan")
@click.argument("plan", metavar="PLAN.json")
@click.option("--backend", type=click.Choice(["local", "celery"]), default="local", show_default=True)
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def run_plan(ctx: click.Context, plan: str, backend: str, debug: bool) -> None:
    """Run a plan (states by _uid, tool calls) and print the final states by _uid as one JSON object.

    Calls of the same tool that are ready at the same time, across all states, run as ONE batch (one
    chord with --backend celery). Exit 2 when the plan is invalid, 1 when a tool call fails.
    """
    from scheduler import plans

    if debug:
        ctx.meta[DEBUG_KEY] = True
    display = ProgressDisplay(stderr_console()) if sys.stderr.isatty() else None
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
