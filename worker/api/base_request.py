"""The base of every API request model: unknown fields ignored, numbers finite, text valid.

``BaseRequest`` ignores fields it does not declare (the OpenAI SDK and vLLM clients send
extras), refuses NaN and infinities for every number, and refuses a body holding a lone
UTF-16 surrogate escape (``"\\ud800"``: not text; it would fail in the tokenizer and the chat
template), naming where it sits. Each API's request model (``worker.api.<api>.protocol``)
derives from it and declares its own fields, so validation errors name that API's fields.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, model_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _check_text(value: Any, where: str = "body") -> None:
    """Refuse lone surrogates, naming where. One C-speed encode of the whole body first (orjson's, which
    refuses any such string; where it refuses something else, such as an integer beyond 64 bits, the json
    module's): only a body that has one is walked (to name the place)."""
    try:
        orjson.dumps(value, default=str)
        return
    except TypeError:
        pass
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=True, default=str).encode("utf-8")
        return
    except UnicodeEncodeError:
        pass
    except (TypeError, ValueError, RecursionError):
        pass                # not JSON-like (or nested too deeply to encode): walk it below
    _walk_text(value, where)


def _walk_text(value: Any, where: str) -> None:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{where} contains a lone surrogate escape, which is not valid Unicode text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _walk_text(k, where)
            _walk_text(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk_text(v, f"{where}.{i}")


class BaseRequest(BaseModel):
    # Unknown fields are accepted and ignored: clients send vendor extras. NaN and
    # infinities (which Python's JSON parser accepts) are refused for every number.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, data: Any) -> Any:
        _check_text(data, "request")
        return data
