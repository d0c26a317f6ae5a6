"""`chordflow results`: a run's outputs, its store, a batch's rows, or a dataset job's rows in input order.

A command of its own so that it starts light: reading rows needs neither the engine, the IR's models (pydantic),
Rich nor Celery, and `results --out` after a dataset job is mostly its start when those are not loaded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import click

from ir.errors import CliUsageError
from scheduler.cli import rowsfile
from scheduler.cli.options import run_id_argument
from scheduler.cli.output import jsonl_rows, llm_line, to_json
from worker.datasets.job import follow_chunks
from worker.llm.usage import CALLS, usage_totals
from worker.runs.record import FINAL


@click.command()
@run_id_argument
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
    from scheduler import lookup
    from scheduler.datasets import reading

    record, runs = lookup.find_run(run_id)
    if record.dataset is not None and node is None and not whole_store:

        def is_final() -> bool:  # asked of the store found above: a poll costs one read, not a lookup and a PING
            current = runs.get(run_id)
            return current is None or current.status in FINAL  # gone (expired): nothing more will come

        if fmt == "jsonl" and not errors_only:  # the rows of each chunk written at once, none built
            chunks = follow_chunks(reading.store_of(record), is_final, done_only=done_only)
            with rowsfile.sink(out) as sink:
                for chunk in chunks:
                    sink.write(rowsfile.chunk_lines(*chunk))
        else:
            rows = reading.rows(record, done_only=done_only, is_final=is_final)
            _write_rows(rows, fmt, errors_only, out, list(record.workflow.get("outputs") or {}))
        if calls := reading.model_calls(record):  # stderr, as a run's: stdout stays the rows
            click.echo(llm_line(usage_totals({CALLS: calls})), err=True)
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
            from scheduler import api  # the engine: a workflow's outputs are resolved from its IR

            value = api.outputs(run_id)
        with rowsfile.sink(out) as sink:
            sink.write(to_json(value) + "\n")
        if (totals := usage_totals(store)) is not None:  # stderr: stdout stays the JSON a script reads
            click.echo(llm_line(totals), err=True)
        return
    try:  # before --out is opened: an unknown node leaves no empty file behind
        rows = runs.batch_rows(run_id, node)
    except LookupError:
        raise CliUsageError(f"--node {node}: run {run_id} has no batch results for node '{node}'") from None
    _write_rows(rows, fmt, errors_only, out)


#: Rows of a finished batch `results --node N` encodes at once, with one encoder call (output.jsonl_rows).
ROWS_AT_ONCE = 500


def _write_rows(
    rows: Iterator[dict[str, Any]],
    fmt: str,
    errors_only: bool,
    out: str | None,
    columns: list[str] | None = None,
) -> None:
    """Rows `{"index", "result", "error"}` as JSON lines (ROWS_AT_ONCE encoded together; the failed rows of
    --errors one by one, as they come), one JSON array or CSV, written one by one.

    CSV is for flat results: a column per result key (`columns`, else the first dict result's keys),
    nested values as JSON text."""
    if errors_only:
        rows = (row for row in rows if row["error"] is not None)
    with rowsfile.sink(out) as sink:
        if fmt == "csv":
            _write_csv(rows, sink, list(columns or []))
        elif fmt == "json":  # one JSON array, still written row by row
            sink.write("[")
            for i, row in enumerate(rows):
                sink.write(("," if i else "") + to_json(row))
            sink.write("]\n")
        else:
            while batch := list(itertools.islice(rows, 1 if errors_only else ROWS_AT_ONCE)):
                sink.write(jsonl_rows(batch))


def _write_csv(rows: Iterator[dict[str, Any]], sink: Any, columns: list[str]) -> None:
    import csv

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
