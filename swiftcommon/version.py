"""The project's version, reported by the worker's /version and the FastAPI apps' schemas.

Kept equal to ``version`` in pyproject.toml (tests/test_architecture.py checks it).
"""

__version__ = "0.1.0"
