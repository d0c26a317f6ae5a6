"""`chordflow run --repair` and `chordflow repair RUN`: the repair flow (scheduler/repair/) on the command line.

`repair_options` gives `run` its three options and keeps them in the click context; `repairing` is the one
hook where a run fails: without --repair it hands back the run unchanged; `run_repair` is what both commands
do with a failure. On stderr the repair says what it tried, what it changed (a unified diff of the IR) and
how many nodes came from the checkpoint; the exit code is the repaired run's (or, not repaired, the original
failure's). No command lives here: `run` (scheduler/cli/running.py) and `repair` (scheduler/cli/runs.py)
both use it.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from scheduler.cli.errors import FAILED_NODE_KEY
from scheduler.cli.options import parse_inputs

#: ctx.meta key of the repair options of `run` (absent: no --repair).
REPAIR_KEY = "chordflow.repair"


@dataclass
class RepairOptions:
    out: str | None = None  # --repair-out: where the repaired workflow is saved
    generator: str | None = None  # --repair-generator (default: CHORDFLOW_REPAIR_GENERATOR, else auto)


def generator_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--repair-generator`, the same for `run --repair` and `repair`."""
    return click.option(
        "--repair-generator", default=None, metavar="NAME",
        help="deterministic, llm, auto (default: CHORDFLOW_REPAIR_GENERATOR, else auto) or a plugin's.",
    )(command)  # fmt: skip


def out_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--repair-out`, the same for `run --repair` and `repair`."""
    return click.option(
        "--repair-out", default=None, metavar="FIXED.json", type=click.Path(dir_okay=False),
        help="Save the repaired workflow here.",
    )(command)  # fmt: skip


def repair_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`--repair`, `--repair-out`, `--repair-generator` for `run` (they never reach the command itself)."""

    @functools.wraps(command)
    def with_repair(*args: Any, repair: bool, repair_out: str | None, repair_generator: str | None, **kwargs: Any):
        if not repair:
            if repair_out or repair_generator:
                usage_error("--repair-out and --repair-generator need --repair")
            return command(*args, **kwargs)
        from scheduler.repair import generator_named  # the repair flow (~0.1 s of imports): only with --repair

        for flag, given in (("--items", "items"), ("--detach", "detach"), ("--stream", "as_stream")):
            if kwargs.get(given):
                usage_error(f"--repair cannot be used with {flag}")
        generator_named(repair_generator)  # an unknown name is a usage error before anything runs
        click.get_current_context().meta[REPAIR_KEY] = RepairOptions(repair_out, repair_generator)
        return command(*args, **kwargs)

    flag = click.option("--repair", is_flag=True, help="On failure, repair the workflow and resume the run.")
    return flag(out_option(generator_option(with_repair)))


def repairing(
    ctx: click.Context,
    start: Callable[..., Any],
    workflow: str,
    backend: str,
    run_id: str,
    store: dict[str, Any],
    inputs: tuple[tuple[str, ...], str | None],
) -> Callable[..., Any]:
    """`run`'s start (hooks -> (workflow, RunResult)), repairing the run when it fails (with --repair).
    `inputs`: the --input pairs and --inputs-file, for a run repaired before it started."""
    options = ctx.meta.get(REPAIR_KEY)
    if options is None:
        return start

    def start_with_repair(**hooks: Any) -> Any:
        from ir.errors import RunCancelled
        from scheduler.repair import Failure, Runner

        runner = Runner(backend, None, run_id, hooks)
        try:
            wf, result = start(**hooks)
        except (RunCancelled, click.exceptions.Exit):
            raise
        except Exception as exc:
            if type(exc).__name__ == "CliUsageError":  # bad usage (of `scheduler.cli`, or of it run as __main__)
                raise
            recorded = runner.find(run_id)
            node = recorded[0].node if recorded else ctx.meta.get(FAILED_NODE_KEY)
            failure = Failure.from_exception(exc, run_id if recorded else None, node)
            original = _raw(workflow) or (recorded[0].workflow if recorded else None)
            if original is None:
                raise
            if recorded is None:
                runner.inputs = parse_inputs(*inputs)
            return run_repair(ctx, original, failure, runner, options, Path(workflow).name, store)
        if result.status != "failed":
            return wf, result
        recorded = runner.find(result.run_id)
        node = recorded[0].node if recorded else None
        failure = Failure.from_error_line(result.error or "failed", result.run_id, node)
        failure.result = result
        return run_repair(ctx, _raw(workflow) or wf.wire(), failure, runner, options, Path(workflow).name, store)

    return start_with_repair


def run_repair(
    ctx: click.Context,
    original: dict[str, Any],
    failure: Any,
    runner: Any,
    options: RepairOptions,
    name: str,
    store: dict[str, Any],
) -> Any:
    """The repair flow on a failure, reported on stderr; (workflow, RunResult) of the repaired run, or the
    original failure again (raised, or its failed RunResult) when not repaired."""
    import ir
    from scheduler.repair import repair
    from worker.runs.record import RunResult

    def note(line: str) -> None:
        click.echo(line, err=True)

    outcome = repair(original, failure, runner=runner, generator=options.generator, notify=note)
    if outcome.changed:
        note(outcome.diff(name))
    if outcome.cached or failure.run_id is not None:
        shown = f": {', '.join(outcome.cached)}" if outcome.cached else ""
        note(f"repair: {len(outcome.cached)} node{'' if len(outcome.cached) == 1 else 's'} from the checkpoint{shown}")
    if outcome.repaired:
        if options.out:
            Path(options.out).write_text(json.dumps(outcome.workflow, indent=2, ensure_ascii=False) + "\n")
            note(f"repair: repaired workflow saved to {options.out}")
        store.clear()
        store.update(outcome.result.shared)
        return ir.load(outcome.workflow), outcome.result
    note(f"repair: not repaired ({outcome.status}): {outcome.reason}")
    reported = outcome.failure
    if reported.run_id is not None:
        store.clear()
        store.update(runner.store(reported.run_id) or {})
        ctx.meta[FAILED_NODE_KEY] = reported.node
    if reported.exception is not None:
        raise reported.exception
    failed = reported.result or RunResult(dict(store), "failed", reported.error, {}, reported.run_id or "")
    return ir.load(outcome.workflow), failed


def usage_error(message: str) -> None:
    """Exit 2 with one `error:` line, as the `cli` group reports its own usage errors."""
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(2)


def _raw(workflow: str) -> dict[str, Any] | None:
    """The workflow file's JSON as written (what a repair edits and `--repair-out` saves), when it parses."""
    try:
        value = json.loads(Path(workflow).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None
