"""What crosses the broker: what differs between Redis and RabbitMQ behind one interface (base.py; redis.py,
amqp.py, registry.py picks one by URL), the bounded pool that sends task messages (pool.py) and, on Redis, the
deliveries a worker holds, renewed while it lives so only a dead or paused worker's messages come back
(deliveries.py).

May import `worker.settings`, `worker.cluster.state`, `worker.cluster.priorities` (message priorities),
`worker.cluster.signing` (every message is signed on its way out), celery, kombu and redis; nothing else of the
cluster (the app, tasks and dispatch import this package, never the other way round)."""
