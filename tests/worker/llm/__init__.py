"""Model calls (worker/llm/, the `llm` node): providers, answers kept, budgets, schemas."""
