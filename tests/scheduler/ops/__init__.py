"""Operating a cluster (scheduler/ops/): the dashboard, metrics, top."""
