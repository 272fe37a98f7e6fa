"""Structured outputs in the reference engine: constraint spec, grammar compilation, token masks."""
