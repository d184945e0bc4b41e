"""A remote server's routes other than the replies themselves: its model list and health (one probe),
load, unload and its own stats; and the adapter that names the remote's model in each request.

Replies go through the app's one ``ChatClient``, pointed at the remote's root with its key and
``RemoteAdapter``. Every call here is short and bounded (a probe gives up after ``PROBE_TIMEOUT_S``);
a load waits as long as the settings' load timeout, since the remote may download the model first.
What a remote sends is read up to ``MAX_ANSWER_BYTES``: a model list, or an answer to a load, without
end is refused, not held in memory. Nothing here keeps state: ``app.supervisor.remotes`` decides what a
probe means over time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.client.adapters import DeltaSplitter, Route
from app.client.capped import read_upto
from app.client.chat import error_detail, loopback_ssl
from app.core.errors import RequestError
from app.core.reasoning import ReasoningFormat
from app.core.remotes import (
    SERVER_LEMON_DESK,
    RemoteKind,
    RemoteModelInfo,
    RemoteState,
    loaded_models,
    parse_model_list,
)

if TYPE_CHECKING:
    import httpx

PROBE_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 3.0
# Below the keep-alive of the servers a remote is likely to be (aiohttp 75 s, nginx 75 s, uvicorn 5 s is
# below it: a connection it closed is met by one retry, below).
KEEPALIVE_S = 30.0
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # a model list of thousands of models is well under this


class TooLarge(ValueError):
    """A remote's answer went on past ``MAX_ANSWER_BYTES``."""


@dataclass(frozen=True)
class Probe:
    """What one look at a remote found."""

    state: RemoteState
    message: str = ""  # why it is unreachable or refused, for people
    kind: RemoteKind | None = None
    version: str = ""  # a Lemon Desk's or Lemonade's own version, when it says
    models: tuple[RemoteModelInfo, ...] | None = None  # None: not read (unreachable or refused)


class RemoteAdapter:
    """Names the remote's model in every request body; the remote adapts the request to its engine."""

    stream_headers: Mapping[str, str] = {}
    reasoning_inline = False

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id

    def check(self, route: Route, stream: bool) -> None:
        return None

    def adapt_body(self, body: dict[str, Any], route: Route = Route.CHAT) -> dict[str, Any]:
        body["model"] = self.model_id
        return body

    def splitter(self) -> DeltaSplitter | None:
        return None

    def stops(self, body: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def finish_reason(self, said: str | None, body: dict[str, Any], completion_tokens: int) -> str | None:
        return said

    def reasoning(self, body: dict[str, Any], fmt: ReasoningFormat) -> bool:
        # In llama-server's names, which a Lemon Desk reads as well (and a Lemonade passes on to its
        # llama-server): apart, or left in the content. None of them is sure to drop it: done here.
        body["reasoning_format"] = "none" if fmt is ReasoningFormat.INLINE else "auto"
        return fmt is ReasoningFormat.HIDDEN


def connection_pool(root: str) -> httpx.AsyncClient:
    """One pool of connections to a remote, shared by its probes and its replies."""
    import httpx

    # trust_env=False: the key goes to the address the user gave, not through a proxy from the environment.
    return httpx.AsyncClient(
        base_url=root,
        trust_env=False,
        verify=loopback_ssl(),  # the default, verifying context, made once
        limits=httpx.Limits(keepalive_expiry=KEEPALIVE_S),
        timeout=httpx.Timeout(PROBE_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
    )


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _why(err: Exception) -> str:
    detail = str(err).strip()
    return f"{type(err).__name__}: {detail}"[:300] if detail else type(err).__name__


async def _answer(
    http: httpx.AsyncClient, method: str, path: str, key: str | None, **kwargs: Any
) -> tuple[httpx.Response, bytes]:
    """``method path``: the response (its status) and its body, read up to the cap (past it, TooLarge).
    A pooled connection the server had closed meanwhile is met by one retry."""
    import httpx

    for attempt in range(2):
        try:
            async with http.stream(method, path, headers=auth(key), **kwargs) as response:
                body = await read_upto(response.aiter_bytes(), MAX_ANSWER_BYTES)
            break
        except httpx.RemoteProtocolError:
            if attempt:
                raise
    if len(body) > MAX_ANSWER_BYTES:
        raise TooLarge(f"its answer to {method} {path} went on past {MAX_ANSWER_BYTES >> 20} MiB")
    return response, body


async def _get_json(http: httpx.AsyncClient, path: str, key: str | None) -> tuple[int, Any]:
    """GET ``path``: its status and its JSON body (None when it is not JSON), read up to the cap."""
    response, body = await _answer(http, "GET", path, key)
    try:
        return response.status_code, json.loads(body) if body else None
    except (ValueError, RecursionError):
        return response.status_code, None


def _said(payload: Any) -> str:
    """``: <the server's error message>`` from an OpenAI-shaped error body, or nothing."""
    err = payload.get("error") if isinstance(payload, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    return f": {message[:300]}" if isinstance(message, str) else ""


async def probe(http: httpx.AsyncClient, key: str | None) -> Probe:
    """Ask a remote for its model list (and, when it has Lemonade's routes, its health)."""
    import httpx

    try:
        status, listing = await _get_json(http, "/v1/models", key)
    except httpx.HTTPError as err:
        # A TransportError is no answer; the rest (a body that does not decode) an answer not to be read.
        said = "no answer" if isinstance(err, httpx.TransportError) else "an answer it could not read"
        return Probe(RemoteState.UNREACHABLE, f"{said} ({_why(err)})")
    except TooLarge as err:
        return Probe(RemoteState.UNREACHABLE, str(err))
    if status in (401, 403):
        said = "refused the key it was given" if key else "asks for an API key and none was given"
        return Probe(RemoteState.REFUSED, f"it {said} (HTTP {status}{_said(listing)})")
    if status != 200:
        return Probe(
            RemoteState.UNREACHABLE,
            f"it answered HTTP {status} to GET /v1/models: no OpenAI-compatible server answers here",
        )
    kind, version, loaded = RemoteKind.OPENAI, "", frozenset[str]()
    try:
        health_status, data = await _get_json(http, "/api/v1/health", key)
        data = data if health_status == 200 else None
    except (httpx.HTTPError, TooLarge):
        data = None
    if isinstance(data, dict) and isinstance(data.get("all_models_loaded"), list):
        kind = RemoteKind.LEMON_DESK if data.get("server") == SERVER_LEMON_DESK else RemoteKind.LEMONADE
        version = data["version"][:40] if isinstance(data.get("version"), str) else ""
        loaded = loaded_models(data)
    try:
        models = parse_model_list(listing, loaded)
    except ValueError:
        return Probe(
            RemoteState.UNREACHABLE, "it answered GET /v1/models with something that is not a model list"
        )
    return Probe(RemoteState.REACHABLE, "", kind, version, models)


async def load(http: httpx.AsyncClient, key: str | None, model_id: str, timeout_s: float) -> None:
    """Lemonade's ``POST /api/v1/load``: the remote loads the model (downloading it first if it must)."""
    await _manage(http, key, "load", model_id, timeout_s)


async def unload(http: httpx.AsyncClient, key: str | None, model_id: str, timeout_s: float) -> None:
    await _manage(http, key, "unload", model_id, timeout_s)


async def _manage(
    http: httpx.AsyncClient, key: str | None, verb: str, model_id: str, timeout_s: float
) -> None:
    import httpx

    timeout = httpx.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
    try:
        response, body = await _answer(
            http, "POST", f"/api/v1/{verb}", key, json={"model_name": model_id}, timeout=timeout
        )
    except httpx.TimeoutException:
        raise RequestError(
            f"The remote did not finish the {verb} of {model_id} within {timeout_s:g} s.",
            "It may still be at it (a download, say): raise the load timeout in Settings, or try later.",
        ) from None
    except httpx.TransportError as err:
        raise RequestError(f"The connection to the remote broke during the {verb} ({_why(err)}).") from None
    except httpx.HTTPError as err:  # it answered, with a body that does not decode (say)
        raise RequestError(f"The remote's answer to the {verb} could not be read ({_why(err)}).") from None
    except TooLarge:
        raise RequestError(
            f"The remote's answer to the {verb} of {model_id} went on past {MAX_ANSWER_BYTES >> 20} MiB "
            "and was not read further.",
            f"No Lemon Desk or Lemonade Server answers so: check what runs at {http.base_url}.",
        ) from None
    if response.status_code != 200:
        detail = error_detail(body, response.reason_phrase)
        raise RequestError(
            f"The remote refused to {verb} {model_id} (HTTP {response.status_code}): {detail}",
            status=response.status_code,
        )


async def stats(http: httpx.AsyncClient, key: str | None) -> dict[str, Any] | None:
    """The remote's own figures for its last request (``GET /api/v1/stats``), or None."""
    import httpx

    try:
        status, data = await _get_json(http, "/api/v1/stats", key)
    except (httpx.HTTPError, TooLarge):
        return None
    return data if status == 200 and isinstance(data, dict) else None
