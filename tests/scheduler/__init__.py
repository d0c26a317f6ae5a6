"""The scheduler (scheduler/): submit, plans, repair, inputs, run ids, examples, deploy files."""
