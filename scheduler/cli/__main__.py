"""`python -m scheduler.cli`: the `chordflow` command."""

from scheduler.cli import main

main()
