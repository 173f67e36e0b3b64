"""Drift: how far each day's features moved from a reference, and the check that says so."""
