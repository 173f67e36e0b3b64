"""Platform plumbing: lake storage, IO manager, step execution, retry policy, logs, metrics, plots."""
