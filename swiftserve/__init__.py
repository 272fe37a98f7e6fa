"""SwiftServe: an OpenAI-compatible serving system for prompt-heavy workloads.

This package holds what every process shares and nothing heavy: environment
variables (``envs``), OpenAI-style errors (``errors``) and the ``swiftserve``
command that starts a whole stack (``cli``). It never imports torch.
"""

__version__ = "0.1.0"
