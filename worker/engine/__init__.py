"""One process runs one flow: the flow builder, the wrappers every node wears, the batch node, the
stepper and its checkpoints' facts, parallel sections, the run context.

May import `ir`, `worker.batch`, `worker.nodes.registry` and worker's top-level modules; no Redis, no Celery."""
