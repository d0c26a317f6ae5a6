"""Runs: the run record and its status vocabulary, the RunStore protocol both stores implement, the
embedded (SQLite) store, and where a resumed run goes on.

May import `ir`, `worker.batch` and `worker.engine`; no Redis, no Celery (the Redis store lives in
worker/cluster/state/)."""
