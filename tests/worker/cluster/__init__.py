"""The cluster (worker/cluster/): tasks, messages, signing, windows, priorities, RabbitMQ."""
