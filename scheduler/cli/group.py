"""The `chordflow` click group: every command module's commands, under one group that turns any
exception into one error line and an exit code (scheduler/cli/errors.py).

The only module that imports the command modules; none imports it back, so no command depends on the
group being assembled.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from scheduler.cli import dashboard, ops, plans, running, runs, workers
from scheduler.cli.errors import DEBUG_KEY, EXIT_OK, FAILED_NODE_KEY, report_error


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


for _command in (
    running.run,
    running.submit,
    runs.wait,
    runs.resume,
    runs.redrive,
    runs.results,
    runs.status,
    runs.runs,
    running.validate,
    running.schema,
    running.nodes,
    workers.worker,
    runs.update,
    runs.cancel,
    runs.purge,
    workers.flower,
    plans.run_plan,
    runs.repair_run,
    plans.plan_to_ir,
    ops.metrics,
    ops.top,
    dashboard.dashboard,
):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    from worker import settings

    settings.warn_unknown()  # a misspelt CHORDFLOW_* variable is otherwise ignored without a word
    cli.main(args=argv, prog_name="chordflow")
