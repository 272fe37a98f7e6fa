"""Model toolkit: prepare the embedded model, SwiftKV conversion and distillation,
corpus building, evaluation. Command line: ``modelkit --help``."""
