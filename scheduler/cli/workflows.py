"""Commands over a workflow that run nothing: `validate`, `schema`, `nodes`. Kept apart from running.py so that
`chordflow validate` loads neither the run machinery nor Rich (a fresh process answers in about 0.3 s)."""

from __future__ import annotations

import json

import click

import ir
from scheduler.cli.errors import DEBUG_KEY


@click.command()
@click.argument("workflow", metavar="WF.json")
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def validate(ctx: click.Context, workflow: str, debug: bool) -> None:
    """Check a workflow (shape, edges, templates, node types) without running it."""
    if debug:
        ctx.meta[DEBUG_KEY] = True
    from worker.engine.loader import load

    wf = load(workflow)
    for warning in wf.warnings:
        click.echo(f"warning: {warning}", err=True)
    click.echo(f"ok: {len(wf.nodes)} nodes")


@click.command()
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


@click.command()
def nodes() -> None:
    """List the registered node types with their params."""
    from rich.table import Table
    from rich.text import Text

    from scheduler.cli.output import stdout_console
    from worker.nodes import all_types

    table = Table(title="node types", title_justify="left")
    table.add_column("type", no_wrap=True)
    table.add_column("params", overflow="fold")
    table.add_column("description", overflow="fold")
    for name, cls in all_types().items():
        table.add_row(Text(name), Text(_params_text(cls)), Text(_first_doc_line(cls)))
    stdout_console().print(table)
