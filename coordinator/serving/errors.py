"""Every refusal as a 4xx JSON body ``{"v": 1, "error": code, "detail": ...}`` (protocol.schemas.ErrorBody).

Errors raised on purpose are :class:`protocol.errors.PrimeError` subclasses and carry their
status code and machine code, so a client maps the body back to the same class with
``protocol.errors.error_for_code``. Request-validation failures become ``malformed`` (400)
with the offending fields named; unknown routes and methods keep their 404/405. Anything
else is a bug: logged with its traceback and answered 500 without internals.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from protocol.errors import PrimeError, RateLimitedError
from protocol.schemas import ErrorBody

log = logging.getLogger("coordinator.serving")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_response(status_code: int, code: str, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorBody(error=code, detail=detail).model_dump()
    return JSONResponse(body, status_code=status_code, headers=headers)


def prime_error_response(exc: PrimeError) -> JSONResponse:
    headers = None
    if isinstance(exc, RateLimitedError):
        headers = {"Retry-After": f"{max(1, round(exc.retry_after_s))}"}
    status = exc.status_code if 400 <= exc.status_code < 600 else 500
    return error_response(status, exc.code, exc.message, headers)


def describe_validation_error(exc: RequestValidationError) -> str:
    parts = []
    for error in exc.errors()[:5]:
        where = ".".join(str(part) for part in error.get("loc", ()) if part != "body") or "body"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    more = len(exc.errors()) - 5
    return "invalid request: " + "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def install_error_handlers(app: FastAPI) -> None:
    async def on_prime_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PrimeError)
        return prime_error_response(exc)

    async def on_validation_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return error_response(400, "malformed", describe_validation_error(exc))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        code = _HTTP_CODES.get(exc.status_code, "refused" if exc.status_code < 500 else "internal")
        detail = str(exc.detail)
        if exc.status_code in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
            detail = f"no route {request.method} {request.url.path}; the API is described at /docs and /openapi.json"
        return error_response(exc.status_code, code, detail, dict(exc.headers or {}))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal", "the coordinator hit an unexpected error; it was logged")

    app.add_exception_handler(PrimeError, on_prime_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
