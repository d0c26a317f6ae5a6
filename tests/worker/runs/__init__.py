"""Run records and checkpoints (worker/runs/): resume, redrive, the embedded store."""
