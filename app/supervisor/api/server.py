"""The server: aiohttp's web server inside the app's running asyncio loop (no thread, no Qt).

aiohttp rather than Starlette on uvicorn, by measurement (see the commit that chose it): its
``StreamResponse.write`` hands each SSE chunk to the transport as it comes, with no per-request task
group watching for disconnects, so it adds less per token and to the time to first token.

Middlewares, outermost first: errors (every failure becomes OpenAI's error shape, never a traceback),
the key (constant-time compare; the key is never logged), then the size limit.

A second listener on Ollama's port (11434, ``app.core.net.OLLAMA_PORT``; off unless asked for) serves
the same routes, so that Ollama's clients with only their default host set find Ollama's ``/api/*`` and
``/`` there (and OpenAI's ``/v1/``, which Ollama serves on that port too). It listens on the same host
as the first, under the same key: loopback unless a key is set.
"""

from __future__ import annotations

import errno
import hmac
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from app.core.errors import ConfigError, LemonDeskError
from app.core.net import is_loopback
from app.supervisor.api.anthropic import AnthropicRoutes
from app.supervisor.api.anthropic import error_response as anthropic_error
from app.supervisor.api.dialects import asked_in, dialect_of
from app.supervisor.api.errors import AUTH, INVALID, NOT_FOUND, ApiError, from_app_error, server_failed
from app.supervisor.api.lemonade import LemonadeRoutes
from app.supervisor.api.ollama import OllamaRoutes
from app.supervisor.api.ollama import error_response as ollama_error
from app.supervisor.api.openai import OpenAIRoutes
from app.supervisor.router import Dialect

if TYPE_CHECKING:
    from app.supervisor.router import Router

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 13305
MAX_BODY_BYTES = 32 * 1024 * 1024  # a long conversation with a few images in it, and then some
PREFIXES = ("/v1", "/api/v1", "/v0", "/api/v0")  # Lemonade serves every route under all four
STOP_GRACE_S = 2.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond this machine without a key."""
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"The local API would listen on {host}, where other machines can reach it, without an API key.",
            "Set one with --api-key or LEMON_DESK_API_KEY, or listen on 127.0.0.1.",
        )


def _json_error(request: web.Request, error: ApiError) -> web.Response:
    """The error in the shape of the dialect the request's route speaks (OpenAI's unless another)."""
    dialect = asked_in.get()
    if dialect is Dialect.ANTHROPIC:
        return anthropic_error(error)
    if dialect is Dialect.OLLAMA:
        return ollama_error(error)
    return web.json_response(error.body(), status=error.status)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    asked_in.set(dialect_of(request.path))  # for this request's task only
    try:
        return await handler(request)
    except ApiError as err:
        return _json_error(request, err)
    except LemonDeskError as err:
        return _json_error(request, from_app_error(err))
    except web.HTTPRequestEntityTooLarge:
        return _json_error(request, too_large())
    except web.HTTPNotFound:
        return _json_error(
            request, ApiError(404, f"There is no {request.path} here.", NOT_FOUND, "not_found")
        )
    except web.HTTPMethodNotAllowed as err:
        message = (
            f"{request.method} is not allowed on {request.path} (allowed: {', '.join(err.allowed_methods)})."
        )
        return _json_error(request, ApiError(405, message, INVALID, "method_not_allowed"))
    except web.HTTPException as err:
        return _json_error(request, ApiError(err.status, err.reason, INVALID, None))
    except (ConnectionResetError, web.HTTPClientError):
        raise
    except Exception:
        log.exception("the local API failed on %s %s", request.method, request.path)
        return _json_error(request, server_failed())


async def _live(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def too_large() -> ApiError:
    return ApiError(
        413, f"The request body is larger than {MAX_BODY_BYTES // (1024 * 1024)} MiB.", INVALID, "too_large"
    )


class ApiServer:
    """The local API over ``router``. ``start()`` listens (on the running loop); ``stop()`` closes every
    connection, which ends the streams and so the generations behind them. The router is not stopped."""

    def __init__(
        self,
        router: Router,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        api_key: str | None = None,
        *,
        ollama_port: int = 0,
    ) -> None:
        check_exposure(host, api_key)
        self.router = router
        self.host = host
        self.port = port
        self.ollama_port = ollama_port  # 0: no second listener
        self._key = (api_key or "").encode()
        self._runner: web.AppRunner | None = None
        self._ollama: web.TCPSite | None = None

    def __repr__(self) -> str:  # never the key
        return f"ApiServer({self.host}:{self.port}, key={'set' if self._key else 'none'})"

    @property
    def url(self) -> str:
        return self._url(self.port)

    @property
    def ollama_url(self) -> str | None:
        """Where the second listener answers, while it does."""
        return self._url(self.ollama_port) if self._ollama is not None else None

    def _url(self, port: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{port}"

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[_errors, self._auth], client_max_size=MAX_BODY_BYTES)
        openai, lemonade = OpenAIRoutes(self.router), LemonadeRoutes(self.router)
        anthropic = AnthropicRoutes(openai)
        app.on_cleanup.append(openai.close)
        for prefix in PREFIXES:
            openai.add_to(app, prefix)
            lemonade.add_to(app, prefix)
            anthropic.add_to(app, prefix)
        OllamaRoutes(openai).add_to(app)  # unprefixed: Ollama's /api/NAME has no version
        app.router.add_get("/live", _live)  # and HEAD: a liveness probe that does no work
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._key:
            # OpenAI's clients send the key as a bearer token, Anthropic's as x-api-key: either will do.
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            given = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "")
            if not hmac.compare_digest(given.encode(), self._key):
                raise ApiError(
                    401,
                    "A valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY).",
                    AUTH,
                    "invalid_api_key",
                )
        length = request.content_length
        if length is not None and length > MAX_BODY_BYTES:
            raise too_large()
        return await handler(request)

    async def start(self) -> None:
        """Listen (on Ollama's port too, when one is set); raises ConfigError when an address cannot be
        had (a port taken, say), listening on neither."""
        # Streams in flight get STOP_GRACE_S to finish when the server stops; then they are cancelled,
        # which closes their engine streams.
        runner = web.AppRunner(
            self._app(), access_log=None, handler_cancellation=True, shutdown_timeout=STOP_GRACE_S
        )
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            await runner.cleanup()
            raise self._cannot_listen(err) from None
        self._runner = runner
        if self.port == 0:
            self.port = int(runner.addresses[0][1])
        log.info("the local API listens on %s", self.url)
        if self.ollama_port:
            try:
                await self.listen_ollama(self.ollama_port)
            except ConfigError:
                await self.stop()
                raise

    async def listen_ollama(self, port: int) -> None:
        """Answer on Ollama's ``port`` too (0: stop answering there); raises ConfigError, saying who holds
        the port when that can be told, when it cannot be had. The first listener is left as it is."""
        if self._runner is None:
            raise RuntimeError("listen_ollama before start")
        if port and port == self.port:
            raise ConfigError(
                f"Ollama's port cannot be {port}: the local API itself listens there.",
                "Choose another port for Ollama's clients, such as 11434.",
            )
        if self._ollama is not None:
            if port == self.ollama_port:
                return
            await self._ollama.stop()
            self._ollama = None
        self.ollama_port = port
        if not port:
            return
        site = web.TCPSite(self._runner, self.host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            raise self._cannot_listen(err, port, "Ollama's port") from None
        self._ollama = site
        log.info("the local API answers on Ollama's port too: %s", self.ollama_url)

    def _cannot_listen(self, err: OSError, port: int | None = None, what: str = "") -> ConfigError:
        """Why the address cannot be had, blaming the host or the port as the error says."""
        port = self.port if port is None else port
        where = f"The local API could not listen on {what + ' ' if what else ''}{self.host}:{port}"
        other_host = "Give --host an address of this machine, such as 127.0.0.1."
        if isinstance(err, socket.gaierror):
            return ConfigError(
                f"{where}: the host name {self.host} does not resolve ({err.strerror}).", other_host
            )
        if err.errno == errno.EADDRNOTAVAIL:
            return ConfigError(f"{where}: {self.host} is not an address of this machine.", other_host)
        if err.errno == errno.EADDRINUSE:
            from app.platform import listener_of

            holder = listener_of(port)
            by = f"{holder} listens there" if holder else "another program listens there"
            flag = "--ollama-port (0: off)" if what else "--port"
            return ConfigError(
                f"{where}: the port is taken ({by}).",
                f"Stop that program, or pick another port with {flag} or in Settings.",
            )
        return ConfigError(
            f"{where}: {err.strerror or err}.",
            "Another program may be using the port; pick another with --port.",
        )

    async def stop(self) -> None:
        runner, self._runner, self._ollama = self._runner, None, None
        if runner is not None:
            await runner.cleanup()
