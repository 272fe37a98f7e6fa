"""The reference engine (refengine.AsyncEngine) as an EngineClient. It already
implements the contract; this module names it for the worker."""

from __future__ import annotations

from refengine.async_engine import AsyncEngine


class ReferenceEngineClient(AsyncEngine):
    """EngineClient over our PyTorch engine, run on a background thread."""
