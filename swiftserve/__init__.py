"""SwiftServe: an OpenAI-compatible serving system for prompt-heavy workloads.

This package is the top layer: the ``swiftserve`` command that starts a whole stack
(``cli``, ``supervisor``, ``rolling``). (The offline GPU validation bundle is not part of the
product: ``gpubundle/`` at the repository root, outside the wheel.) What
every process shares (environment variables, logging helpers, the version) lives in
``swiftcommon`` (docs/architecture.md). It never imports torch at import time.
"""

from swiftcommon.version import __version__

__all__ = ["__version__"]
