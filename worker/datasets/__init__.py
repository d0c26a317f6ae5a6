"""Dataset jobs: a workflow run once per record, in chunks of records; the job model (job.py), running a chunk
(chunks.py) and its embedded store (sqlite.py).

May import `ir`, `worker.batch`, `worker.engine` and `worker.runs`; no Redis, no Celery. job.py and sqlite.py import
neither the engine nor the IR's models (a job's rows are read without them)."""
