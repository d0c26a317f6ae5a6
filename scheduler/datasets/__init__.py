"""Dataset jobs from the client's side (worker/datasets/job.py): running.py runs or submits a job as its
records file is read, and redrives it; reading.py reads it back (rows, progress, result) without the engine.

Locally the windows run in this process as they are read; on the cluster each window is stored in Redis
as a chunk and the workers take it from there (worker/cluster/datasets/), a bounded number of chunks
in flight. Either way no process holds all records or all results.

May import `ir`, `worker` and `scheduler`'s own modules; the cluster's (Celery, Redis) only inside the functions
that act on a cluster job. reading.py imports neither the engine nor the IR's models.
"""
