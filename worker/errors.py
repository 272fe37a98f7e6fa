"""OpenAI-style errors for the worker: ``{"error": {message, type, param, code}}``.

Every failure a client can cause is an ``APIError`` with a 4xx status, raised
anywhere in the request path and turned into JSON by the handlers installed with
``install_error_handlers``. FastAPI's own validation errors (malformed JSON, wrong
types, out-of-range values) become 400s that name the offending parameter, and
unknown routes / wrong methods keep their status but get the same JSON shape.
An unexpected exception is a 500 in the same shape, never a plain-text page.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          405: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 500: "internal_error", 503: "service_unavailable"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: Any = None,
                 type: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "internal_error")
        self.headers = headers

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str, param: str | None = None, code: Any = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def model_not_found(name: str | None) -> APIError:
    return APIError(404, f"The model `{name}` does not exist.", param="model", code="model_not_found")


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


def _loc_to_param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    # pydantic names union branches in the location ("str", "list[int]", ...): not parameter names.
    parts = [p for p in parts if p not in _UNION_TAGS and "[" not in p]
    return ".".join(parts) or None


def validation_error_to_api_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("Invalid request.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        detail = ctx.get("error", first.get("msg", ""))
        return bad_request(f"Malformed JSON in request body: {detail}")
    param = _loc_to_param(tuple(first.get("loc", ())))
    msgs, seen = [], set()
    for e in errors:
        p = _loc_to_param(tuple(e.get("loc", ())))
        if p in seen:
            continue    # a union reports one error per branch: keep the first per parameter
        seen.add(p)
        msgs.append(f"{p}: {e.get('msg')}" if p else str(e.get("msg")))
        if len(msgs) == 3:
            break
    if first.get("type") in ("model_attributes_type", "dict_type") and param is None:
        msgs = ["The request body must be a JSON object."]
    return bad_request("Invalid request: " + "; ".join(msgs), param=param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_req: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_req: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error_to_api_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return error_response(APIError(exc.status_code, msg, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _unexpected(_req: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(APIError(500, f"Internal server error: {type(exc).__name__}"))
