"""``lemon-desk worker``: lend this machine's memory and compute to a llama.cpp model loaded on another
machine (its ``--rpc``). Runs ``ggml-rpc-server`` from the llama.cpp backend (installing it first when
needed), keeps it running, prints what it offers; SIGINT or SIGTERM stops it and exits 0.

llama.cpp's RPC protocol has no authentication and no encryption: the worker listens on loopback unless
``--allow-network`` is given, and then says so on every start.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from app.commands.output import load_settings_noting_problems
from app.core.backends import BackendKey
from app.core.engine_state import EngineState
from app.core.errors import ConfigError
from app.core.rpc import DEFAULT_WORKER_PORT, Endpoint, exposure_warning, worker_endpoint
from app.supervisor.router import Router, RouterEvent
from app.supervisor.rpc import WorkerChanged
from app.supervisor.supervisor import InstallProgress


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "worker",
        help="lend this machine to a llama.cpp model on another machine (an RPC worker)",
        description=(
            "Runs llama.cpp's RPC worker. On the machine that loads the model: "
            "lemon-desk run MODEL --rpc THIS_HOST:PORT (or the workers list in Settings)."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_WORKER_PORT, help=f"default: {DEFAULT_WORKER_PORT}"
    )
    parser.add_argument(
        "--backend", metavar="llamacpp:BACKEND", help="default: the best one for this machine"
    )
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: llama.cpp's)")
    parser.add_argument(
        "--allow-network",
        action="store_true",
        help="listen beyond loopback; the protocol is unauthenticated and unencrypted",
    )
    parser.add_argument("--json", action="store_true", help="print what the worker offers as one JSON line")
    parser.set_defaults(handler=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    endpoint = worker_endpoint(args.host, args.port)
    warning = exposure_warning(endpoint, args.allow_network)
    backend = None
    if args.backend:
        key = BackendKey.parse(args.backend)
        if key.recipe != "llamacpp":
            raise ConfigError(f"{args.backend} is not a llama.cpp backend.", "Pick one such as llamacpp:cpu.")
        backend = key.backend
    if args.threads is not None and args.threads <= 0:
        raise ConfigError("--threads must be a positive number.")
    if warning:
        print(warning, file=sys.stderr, flush=True)
    return asyncio.run(_work(Router(load_settings_noting_problems()), endpoint, backend, args))


async def _work(router: Router, endpoint: Endpoint, backend: str | None, args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    gave_up: list[str] = []
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)

    def show(event: RouterEvent) -> None:
        if isinstance(event, InstallProgress) and event.done == 0:
            print(f"installing {event.key}", file=sys.stderr, flush=True)
        elif isinstance(event, WorkerChanged) and event.state is not EngineState.STARTING:
            print(event.message, file=sys.stderr, flush=True)
            if event.final:
                gave_up.append(event.message)
                stop.set()

    try:
        async with router:
            router.subscribe(show)
            worker = await router.start_worker(endpoint, backend, args.threads)
            assert worker.info is not None
            if args.json:
                print(json.dumps(worker.info.to_json()), flush=True)
            else:
                print(f"Lemon Desk RPC worker: {worker.info.describe()}", flush=True)
                print(f"Use it from the machine that loads a model: --rpc {endpoint}", file=sys.stderr)
            await stop.wait()
            if not gave_up:
                print("stopping", file=sys.stderr, flush=True)
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return 1 if gave_up else 0
