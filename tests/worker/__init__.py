"""The engine (worker/): nodes run in order, batches, branches, sub-workflows, retries, settings."""
