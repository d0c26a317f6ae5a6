"""Dataset jobs (worker/datasets/, scheduler/datasets/): the workflow once per record."""
