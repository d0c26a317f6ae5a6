"""Per-item batch semantics for every backend: BatchJob and the Backend protocol, the local
backend, the ONE per-item executor, item outcomes, the ONE merge, thresholds, the in-process middleware.

May import `ir` and worker's top-level modules (redact, events, store, node_error, tracing); no Redis, no Celery."""
