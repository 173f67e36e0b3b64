"""Replays: a changed contract run over past days beside the live chain, and compared."""
