"""harness: a coding-agent runtime as a tree of Trio actors over a SQLite ledger."""
