"""The `chordflow` click group: every command module's commands, under one group that turns any
exception into one error line and an exit code (scheduler/cli/errors.py).

The only module that imports the command modules (lazily, by name: COMMANDS); none imports it back, so no
command depends on the group being assembled.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from scheduler.cli.errors import DEBUG_KEY, EXIT_OK, FAILED_NODE_KEY, report_error
from scheduler.cwd import use_cwd_modules


class ChordflowGroup(click.Group):
    """A click group of the COMMANDS, each imported when asked for, whose `invoke` turns any command's exception
    into a message and an exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, name = COMMANDS[cmd_name].split(":")
        command = getattr(importlib.import_module(f"scheduler.cli.{module}"), name)
        assert command.name == cmd_name, (command.name, cmd_name)
        return command

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # a bad option or command: one line, as every user error, no usage block
            click.echo(f"error: {exc.format_message()}", err=True)
            raise click.exceptions.Exit(exc.exit_code) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:  # `chordflow results RUN | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise click.exceptions.Exit(EXIT_OK) from None
        except (Exception, KeyboardInterrupt) as exc:
            code = report_error(exc, debug=bool(ctx.meta.get(DEBUG_KEY)), node=ctx.meta.get(FAILED_NODE_KEY))
            raise click.exceptions.Exit(code) from None


@click.group(cls=ChordflowGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="chordflow", prog_name="chordflow", message="%(prog)s %(version)s")
@click.option("--debug", is_flag=True, help="Print full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """chordflow: run JSON workflows of PocketFlow nodes, with batch fan-out locally or on Celery."""
    ctx.meta[DEBUG_KEY] = debug
    use_cwd_modules()


#: Every command: the module of scheduler/cli that defines it and the function's name. A command's module is
#: imported when the command runs (or `--help` lists it), so `chordflow validate` loads no Celery, Rich or run
#: stores.
COMMANDS = {
    "run": "running:run",
    "submit": "running:submit",
    "schedule": "running:schedule",
    "validate": "workflows:validate",
    "schema": "workflows:schema",
    "nodes": "workflows:nodes",
    "wait": "runs:wait",
    "resume": "runs:resume",
    "redrive": "runs:redrive",
    "results": "results:results",
    "status": "runs:status",
    "runs": "runs:runs",
    "update": "runs:update",
    "cancel": "runs:cancel",
    "signal": "runs:signal",
    "purge": "runs:purge",
    "repair": "runs:repair_run",
    "worker": "ops:worker",
    "flower": "ops:flower",
    "run-plan": "running:run_plan",
    "plan-to-ir": "running:plan_to_ir",
    "metrics": "ops:metrics",
    "top": "ops:top",
    "dashboard": "ops:dashboard",
}


def main(argv: list[str] | None = None) -> None:
    from worker import settings

    settings.warn_unknown()  # a misspelt CHORDFLOW_* variable is otherwise ignored without a word
    cli.main(args=argv, prog_name="chordflow")
