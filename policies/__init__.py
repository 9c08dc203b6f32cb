"""Budget policies: definitions and their evaluation (pure functions, no I/O)."""
