"""The `chordflow` command line: one module per group of commands, assembled into one click group.

May import `scheduler` (its api and ops), `worker` and `ir`; a command module never imports another
command module's names (shared helpers live in a module of their own).

- group.py: the `cli` group and `main`, assembled from the command modules (nothing imports it back)
- running.py: run, submit, schedule (add, list, pause, resume, remove), run-plan, plan-to-ir; workflows.py:
  validate, schema, nodes (they run nothing)
- runs.py: status, runs, wait, cancel, resume, redrive, repair (runs found by run id); results.py: results
- ops.py: worker, flower, metrics, top, dashboard
- shared helpers: errors.py (exit codes, error lines), output.py (printing), follow.py (following a run),
  options.py (inputs, --items, --priority), rowsfile.py (--out files), repair.py (`run --repair` and the repair flow)
"""

from scheduler.cli.group import cli, main

__all__ = ["cli", "main"]
