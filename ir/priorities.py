"""A run's priority on a cluster (`chordflow submit --priority`, the workflow's `priority` field): its words,
highest first. A module of its own so that the CLI's option and the cluster's queues read them without importing
the IR's models (and pydantic): `chordflow results` and `wait` never load those."""

PRIORITIES = ("high", "normal", "low")
