"""One process runs one flow: the ONE workflow loader, the flow builder, the wrappers every node wears, the
batch node, the stepper and its vocabulary, parallel sections, config hashes, the run context.

May import `ir`, `worker.batch`, `worker.nodes.registry` and worker's top-level modules; no Redis, no Celery."""
