"""The `chordflow` command line: one module per group of commands, assembled into one click group.

May import `scheduler` (its api and ops), `worker` and `ir`; a command module never imports another
command module's names (shared helpers live in a module of their own)."""

from scheduler.cli.commands import cli, main

__all__ = ["cli", "main"]
