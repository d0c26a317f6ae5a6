"""The node runtime (registry, node types, wrappers, the per-item executor, the aggregate merge)
and the Celery app with its tasks. Imports only `ir`."""
