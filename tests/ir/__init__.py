"""The workflow IR (ir/): loading, validation, templates, the snapshot codec."""
