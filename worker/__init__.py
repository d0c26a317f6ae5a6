"""What runs nodes, in a worker or in this process, in packages by concept (docs/ARCHITECTURE.md):
engine/ (one process runs one flow), batch/ (per-item semantics), nodes/, runs/, datasets/, and cluster/,
the only package importing celery, kombu or redis. Top-level modules (settings, redact, events, store, periodic,
node_error, stopping, waits, tracing) are shared vocabulary: they import only `ir` and one another. `worker` may
import `ir`, never `scheduler`; `worker/app.py` is the address `celery -A worker.app` names."""
