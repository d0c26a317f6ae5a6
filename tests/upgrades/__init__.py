"""Rolling upgrades: the previous release's messages and run records replayed, its workers replaced mid-run."""
