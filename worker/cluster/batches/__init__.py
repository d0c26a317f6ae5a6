"""A batch on the cluster: cut into chunks (chunking.py), sent a window at a time (dispatch.py), each chunk run by
`chordflow.run_chunk`, which hands out the next ones, and merged by `chordflow.aggregate` in the chord body's role
(tasks.py), with the worker-side
middleware around a chunk's items (middleware.py) and the decoded snapshots a worker process keeps
(snapshot_cache.py).

May import `ir`, everything in `worker` outside the cluster, `worker.cluster.app`, `worker.cluster.logs`,
`worker.cluster.broker`, `worker.cluster.state`, celery and redis."""
