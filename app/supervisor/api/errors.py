"""The local API's errors, in OpenAI's shape: ``{"error": {"message", "type", "code"}}``.

Every failure a request can meet ends here as a status and that body: the app's own errors
(``app.core.errors``) are mapped once, below; nothing reaches a client as a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from app.core.errors import (
    ConfigError,
    DownloadError,
    EngineError,
    FitError,
    HubBusyError,
    HubUnreachableError,
    InstallError,
    LemonDeskError,
    ModelError,
    PolicyError,
    RemoteError,
    RequestError,
    StorageError,
    UnsafePathError,
    UnsupportedError,
    UnsupportedRequestError,
)

INVALID = "invalid_request_error"
AUTH = "authentication_error"
NOT_FOUND = "not_found_error"
CONFLICT = "conflict_error"
UPSTREAM = "server_error"


class ApiError(Exception):
    """A request that ends with ``status`` and an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = INVALID, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.code)


def error_body(message: str, kind: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": code}}


def sse_error_event(error: ApiError) -> bytes:
    """A failure mid-stream: the error as an event, then the end of the stream."""
    return f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()


def server_failed() -> ApiError:
    """A failure of the app's own (a bug): said as such, its traceback in the log only."""
    return ApiError(500, "The server failed on this request; see its log.", UPSTREAM)


def bad_request(message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, INVALID, code)


def bad_gateway(message: str, code: str = "engine_error") -> ApiError:
    """The engine or remote a request was passed on to failed it: not the client's to fix."""
    return ApiError(502, message, UPSTREAM, code)


def model_not_found(name: str) -> ApiError:
    return ApiError(
        404, f"There is no model named '{name}'. GET /v1/models lists them.", NOT_FOUND, "model_not_found"
    )


def from_app_error(err: LemonDeskError) -> ApiError:
    """The status and body for one of the app's own errors, whose text says what happened and what to do."""
    message = str(err)
    if isinstance(err, PolicyError):
        return ApiError(409, message, CONFLICT, "model_pinned")
    if isinstance(err, FitError):
        return ApiError(409, message, CONFLICT, "insufficient_memory")
    if isinstance(err, RemoteError):
        return ApiError(503, message, UPSTREAM, "remote_unavailable")
    if isinstance(err, UnsupportedRequestError):
        return ApiError(400, message, INVALID, "unsupported")
    if isinstance(err, RequestError):
        # The engine's own 4xx (a prompt longer than the context, a bad parameter) is the client's to fix;
        # anything else, its 401 included (the key between app and engine), is the engine's failure.
        if err.status is not None and 400 <= err.status < 500 and err.status != 401:
            return ApiError(err.status, message, INVALID, "engine_refused")
        return bad_gateway(message)
    if isinstance(err, ConfigError | UnsupportedError | UnsafePathError):
        return ApiError(400, message, INVALID, "invalid_value")
    if isinstance(err, DownloadError | InstallError):
        return bad_gateway(message, "download_failed")
    if isinstance(err, HubBusyError):  # the Hub's limit: the same request goes through later
        return ApiError(503, message, UPSTREAM, "hub_busy")
    if isinstance(err, HubUnreachableError):  # before ModelError: the network failed, not the request
        return bad_gateway(message, "hub_unreachable")
    if isinstance(err, EngineError):
        return ApiError(503, message, UPSTREAM, "engine_failed")
    if isinstance(err, ModelError):
        return ApiError(400, message, INVALID, "model_error")
    if isinstance(err, StorageError):  # this machine's disk, not the request: the text says what to do
        return ApiError(500, message, UPSTREAM, "storage_error")
    return ApiError(400, message, INVALID, None)
