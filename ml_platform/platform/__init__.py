"""Plumbing every stage uses: storage, IO manager, steps, retries, failure classes, logs, plots."""
