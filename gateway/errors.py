"""OpenAI-style error responses of the gateway."""

from __future__ import annotations

from fastapi.responses import JSONResponse


def error(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
          param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)
