"""Options that `run`, `submit` and `run --repair` share: the workflow's inputs and the dataset job's; and
the RUN_ID argument of the commands that take a run (checked before any lookup).

Kept apart from the commands so that both scheduler/cli/running.py and scheduler/cli/repair.py read
inputs the same way without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

import ir
from ir.errors import CliUsageError, ValidationError
from ir.priorities import PRIORITIES
from worker.runs.record import RUN_ID_RULE, valid_run_id


def _checked_run_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A RUN_ID that cannot name a run is one line, exit 2 (a long one is not printed back)."""
    if not valid_run_id(value):
        shown = repr(value) if len(value) <= 64 else f"({len(value)} characters)"
        raise CliUsageError(f"invalid run id {shown}: a run id is {RUN_ID_RULE}")
    from scheduler import lookup  # the stores: only once a command taking a run id runs

    return lookup.full_run_id(value)


#: The RUN_ID argument of `status`, `wait`, `results`, `cancel`, `resume`, `redrive`, `repair`, `purge`: a whole
#: id, or a unique prefix of 4 characters or more (scheduler/lookup.py full_run_id).
run_id_argument = click.argument("run_id", callback=_checked_run_id)


def parse_inputs(pairs: tuple[str, ...], inputs_file: str | None) -> dict[str, Any]:
    """`--inputs-file` (a JSON object) first, then each `--input KEY=VALUE` on top of it."""
    from scheduler.inputs import parse_input_value
    from scheduler.inputs_file import read_whole

    inputs: dict[str, Any] = {}
    if inputs_file is not None:
        inputs.update(read_whole(inputs_file))
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CliUsageError(f"--input {pair!r}: expected KEY=VALUE")
        inputs[key] = parse_input_value(value, f"--input {key}")
    return inputs


def load_for_run(
    workflow: str, pairs: tuple[str, ...], inputs_file: str | None, dataset: dict[str, Any] | None, *, whole: bool
) -> tuple[ir.Workflow, dict[str, Any]]:
    """The workflow a run starts with and its inputs: `--inputs-file` parsed whole into them (`whole`: a run of
    this process) or only its names read (the cluster reads it into the run's store itself), then `--input`.

    Every name given (and a dataset job's `--as`) is a known input of a workflow that declares none (`ir.load`);
    of one that declares inputs, an `--input` name it does not declare is an error with a did-you-mean (not in
    a dataset job, whose records may carry inputs)."""
    from scheduler.inputs import unknown_input
    from scheduler.inputs_file import read_encoded
    from worker.engine.loader import load

    inputs = parse_inputs(pairs, inputs_file if whole else None)
    names = [*inputs, *(read_encoded(inputs_file) if inputs_file is not None and not whole else ())]
    if dataset is not None and dataset["as_"] != "-":
        names.append(dataset["as_"])
    wf = load(workflow, names)
    if dataset is None:
        keys = dict.fromkeys(pair.partition("=")[0].strip() for pair in pairs)
        if unknown := [f"--input {key}=...: {problem}" for key in keys if (problem := unknown_input(wf, key))]:
            raise ValidationError(unknown)
    return wf, inputs


def dataset_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--items FILE` and its options: a dataset job, the workflow once per record (scheduler/datasets/)."""
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
        click.option("--chunk-size", type=int, default=None, metavar="N",
                     help="Records per chunk (default 2000; a file of fewer than 64000 records: a 32nd of them, "
                     "at least 500)."),
        click.option("--max-record-bytes", type=int, default=None, metavar="B",
                     help="A record longer than B bytes is a bad record (default 16777216: 16 MiB)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def dataset_job(items: str | None, job: dict[str, Any]) -> dict[str, Any] | None:
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


def budget_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`run` and `submit`: `--budget-tokens N`, `--budget-usd X`, caps on the run's model calls."""
    options = [
        click.option("--budget-tokens", type=click.IntRange(min=1), default=None, metavar="N",
                     help="Most tokens the run's model calls may bill, on every worker together."),
        click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True), default=None, metavar="X",
                     help="Most USD they may cost (priced by CHORDFLOW_LLM_PRICES)."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def with_budget(wf: ir.Workflow, tokens: int | None, usd: float | None) -> ir.Workflow:
    """`wf` with the budget flags laid over its own `budget` (a flag given wins)."""
    if tokens is None and usd is None:
        return wf
    from ir.models import Budget

    caps = wf.budget.model_dump() if wf.budget is not None else {}
    caps.update({k: v for k, v in (("tokens", tokens), ("usd", usd)) if v is not None})
    return wf.model_copy(update={"budget": Budget.model_validate(caps)})


#: `run` and `submit`: the run's priority on a cluster (worker/cluster/priorities.py).
priority_option = click.option(
    "--priority", type=click.Choice(PRIORITIES), default=None,
    help="On a cluster: a higher run's chunks go first (default: the workflow's priority field, else normal).",
)  # fmt: skip
