"""What a person runs when a day failed: diagnose, reproduce, health."""
