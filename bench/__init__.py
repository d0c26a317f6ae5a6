"""chordflow benchmarks against raw Celery: `python -m bench` (see bench/README.md)."""
