"""Platform plumbing: lake storage, IO manager, step execution, logs, metrics, plots."""
