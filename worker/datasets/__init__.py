"""Dataset jobs: a workflow run once per record, in chunks of records; the job model and its embedded store.

May import `ir`, `worker.batch`, `worker.engine` and `worker.runs`; no Redis, no Celery."""
