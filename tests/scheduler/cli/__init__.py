"""The command line (scheduler/cli/)."""
