"""Watching a cluster: Prometheus metrics, `chordflow top`, the runs dashboard.

May import `scheduler`'s api and lookup, `worker` and `ir`; never `scheduler.cli`."""
