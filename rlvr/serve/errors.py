"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status.

Validation errors name the field in ``param`` as a path into the JSON body (``messages[1].role``,
``temperature``), and come back as 400 (OpenAI's status for an invalid request; FastAPI's
default would be 422).
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

# pydantic puts the tried member of a union into the location (``stop.list[str]``): not a field
_UNION_TAGS = ("str", "int", "float", "bool", "none", "list", "dict")


class ApiError(Exception):
    """An error response: status, message and (for a bad field) the field's path."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code


def error_response(status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type, "param": param, "code": code}},
                        status_code=status, headers=headers)


def field_path(loc: tuple) -> str | None:
    """``("body", "messages", 1, "role")`` -> ``"messages[1].role"``; None for the body itself."""
    path = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif str(part).split("[")[0] in _UNION_TAGS or "[" in str(part) or str(part).startswith("function-"):
            continue
        else:
            path += f".{part}" if path else str(part)
    return path or None


async def api_error_handler(_: Request, e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status in (429, 503) else None
    return error_response(e.status, e.message, e.type, e.param, e.code, headers)


async def validation_handler(_: Request, e: RequestValidationError) -> JSONResponse:
    err = e.errors()[0]
    param = field_path(tuple(err.get("loc", ())))
    if err.get("type") == "json_invalid":
        return error_response(400, "the request body is not valid JSON", code="invalid_json")
    if err.get("type") == "missing":
        message = f"'{param}' is required"
    else:
        message = f"'{param}': {err.get('msg', 'invalid value')}" if param else err.get("msg", "invalid request")
    return error_response(400, message, param=param, code="invalid_value" if err.get("type") != "missing" else "missing")
