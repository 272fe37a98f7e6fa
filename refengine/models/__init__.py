"""Model implementations of the reference engine (Llama family, with SwiftKV)."""
