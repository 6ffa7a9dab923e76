"""What the model is told: the system prompt, the model's limits, compaction, budgets."""
