"""``lemon-desk serve``: the local API without the window. Prints one line with the URL once it
listens (``--json``: one JSON object); SIGINT or SIGTERM stops every engine and exits 0.
``--ollama-port N`` answers on a second port too, Ollama's (11434) for clients that look there
(0 or absent: off); a port taken stops serve before it answers, saying who holds it.
``--collection NAME`` then loads a collection's models with their options while the API answers; one
that does not load stops serve (exit 1), saying which and why.

The key comes from ``--api-key`` or ``LEMON_DESK_API_KEY``; it is never printed or logged, and never
reaches an engine (each engine has its own key, from a file).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import sys

from app.commands.output import add_rpc_argument, checked_rpc, load_settings_noting_problems
from app.core.errors import ConfigError, LemonDeskError
from app.core.net import OLLAMA_PORT
from app.core.policy import parse_caps
from app.supervisor.api import DEFAULT_HOST, DEFAULT_PORT, ApiServer, check_exposure
from app.supervisor.router import Router

KEY_VARIABLE = "LEMON_DESK_API_KEY"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve the local API (OpenAI- and Lemonade-compatible) without the window",
        description=(
            "Serve /v1/ (OpenAI) and /api/v1/ (Lemonade) for other apps; models load on demand. "
            f"A host other than loopback needs an API key (--api-key or {KEY_VARIABLE})."
        ),
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help=f"default: {DEFAULT_HOST}")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default: {DEFAULT_PORT}")
    parser.add_argument("--api-key", metavar="KEY", help=f"require this key (default: ${KEY_VARIABLE})")
    parser.add_argument(
        "--ollama-port",
        type=int,
        default=0,
        metavar="N",
        help=f"answer on this port too, for Ollama's clients (Ollama's own is {OLLAMA_PORT}; default 0: off)",
    )
    parser.add_argument(
        "--max-loaded-models", metavar="N|JSON", help='a total, or per-device caps: \'{"gpu": 1, "cpu": 2}\''
    )
    parser.add_argument(
        "--collection",
        metavar="NAME",
        help="load this collection's models with their options (see `lemon-desk collections`)",
    )
    add_rpc_argument(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="say where it listens as one JSON line (whether a key is needed, not the key)",
    )
    parser.set_defaults(handler=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    key = args.api_key or os.environ.get(KEY_VARIABLE) or None
    check_exposure(args.host, key)
    for flag, port in (("--port", args.port), ("--ollama-port", args.ollama_port)):
        if not 0 <= port <= 65535:
            raise ConfigError(f"{flag} {port} is not a port number (0-65535).")
    settings = load_settings_noting_problems()
    if args.max_loaded_models is not None:
        caps = parse_caps(args.max_loaded_models)
        settings = dataclasses.replace(settings, max_loaded_models=caps.to_json())
    if args.rpc is not None:
        settings = dataclasses.replace(settings, rpc_workers=checked_rpc(args))
    router = Router(settings, raise_limit="start serve again with a higher --max-loaded-models")
    collection = router.collections.get(args.collection).name if args.collection else None
    ports = (args.port, args.ollama_port)
    return asyncio.run(_serve(router, args.host, ports, key, args.json, collection))


def _listening_line(server: ApiServer, key_required: bool, as_json: bool) -> str:
    """What serve prints once it listens: the URLs, or with ``as_json`` one object (never the key)."""
    openai, lemonade = f"{server.url}/v1/", f"{server.url}/api/v1/"
    ollama = server.ollama_url
    if not as_json:
        also = f", Ollama: {ollama}/api/" if ollama else ""
        return f"Lemon Desk API listening on {openai} (Lemonade: {lemonade}{also})"
    where: dict[str, object] = {
        "url": server.url,
        "openai_url": openai,
        "lemonade_url": lemonade,
        "host": server.host,
        "port": server.port,
        "key_required": key_required,
    }
    if ollama:
        where.update(ollama_url=ollama, ollama_port=server.ollama_port)
    return json.dumps(where)


async def _load_collection(router: Router, name: str, stop: asyncio.Event, failed: list[str]) -> None:
    """Load a collection while the API answers; a member that does not load stops serve, saying why."""
    print(f"loading the collection {name}", file=sys.stderr, flush=True)
    try:
        loaded = await router.collections.load(name)
    except LemonDeskError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        failed.append(str(err))
        stop.set()
        return
    print(f"Loaded the collection {name}: {', '.join(loaded)}.", file=sys.stderr, flush=True)


async def _serve(
    router: Router, host: str, ports: tuple[int, int], key: str | None, as_json: bool, collection: str | None
) -> int:
    stop = asyncio.Event()
    failed: list[str] = []  # why the collection did not load
    loading: asyncio.Future[None] | None = None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with router:
            await router.start()  # engines an earlier run left go before the API takes requests
            server = ApiServer(router, host, ports[0], key, ollama_port=ports[1])
            await server.start()
            router.remotes.watch()  # their models are listed and served as @NAME/MODEL
            try:
                print(_listening_line(server, key is not None, as_json), flush=True)
                if collection is not None:
                    loading = asyncio.ensure_future(_load_collection(router, collection, stop, failed))
                await stop.wait()
                print("stopping", file=sys.stderr, flush=True)
            finally:
                if loading is not None:  # a stop before the collection is loaded cancels its loads
                    loading.cancel()
                    await asyncio.gather(loading, return_exceptions=True)
                await server.stop()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return 1 if failed else 0
