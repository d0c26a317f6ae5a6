"""Everything chordflow keeps in Redis: the keyspace (keys.py, named once), per-run state, run records and
checkpoints, the worker registry, and the Lua scripts beside them (lua/, each with its KEYS/ARGV).

May import `ir`, `worker.batch`, `worker.engine`, `worker.runs`, worker's top-level modules, redis, and
`worker.cluster.outage` (how every client rides out an outage)."""
