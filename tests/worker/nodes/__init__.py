"""The built-in node types (worker/nodes/)."""
