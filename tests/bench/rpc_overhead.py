"""What a model split over llama.cpp RPC workers costs in decode speed, on the real llama-server and
SmolLM2-135M through the app's router: the model on one loopback worker (``lemon-desk worker``'s
``ggml-rpc-server``, every layer and the KV cache on it) against the same model run locally.

On loopback this is the protocol's own cost (a round trip per token, the graph sent each step), not a
network's. Each round loads the model both ways in turn (so the machine's load hits both) and asks
each for the same greedy reply of exactly ``--tokens`` tokens; the figure is the engine's own decode
rate, and the ratio is the median of the per-round ratios.

Then the other way of using another machine, a remote Lemon Desk: ``remote_overhead.py`` (decode and
TTFT through one and two ``serve`` hops against the engine directly) runs with the same rounds and
tokens, unless ``--rpc-only``.

    .venv/bin/python tests/bench/rpc_overhead.py [--rounds N] [--tokens N] [--threads N] [--rpc-only]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.rpc import Endpoint
from app.store.library import Library
from app.store.model_options import ModelOptions
from app.store.settings import Settings, save_settings
from app.supervisor.process import free_port
from app.supervisor.router import Router
from tests.conftest import profile_path
from tests.support.llama import build_llama_server, fetch_smollm_gguf

MODEL = "user.smol"
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


async def decode_tps(router: Router, options: ModelOptions, tokens: int) -> float:
    await router.load(MODEL, options, force=True)
    try:
        reply = await router.chat(MODEL, PROMPT, max_tokens=tokens, temperature=0, seed=1)
        assert reply.telemetry.completion_tokens == tokens, reply.telemetry
        return reply.telemetry.decode_tps or 0.0
    finally:
        await router.unload(MODEL)


async def measure(rounds: int, tokens: int, threads: int) -> None:
    server = build_llama_server(print) / "llama-server"
    settings = Settings(llama_server_path=str(server))
    save_settings(settings)
    Library(settings).import_path(fetch_smollm_gguf(print), name=MODEL)
    args = f"-t {threads} --ignore-eos"  # exactly ``tokens`` tokens each time
    local = ModelOptions(backend="system", ctx_size=2048, args=args, rpc="local")
    async with Router(settings) as router:
        worker = await router.start_worker(Endpoint("127.0.0.1", free_port()), "system", threads)
        assert worker.info is not None
        print(f"worker: {worker.info.describe()}")
        on_worker = ModelOptions(backend="system", ctx_size=2048, args=args, rpc=str(worker.endpoint))
        here, there = [], []
        for n in range(rounds):
            here.append(await decode_tps(router, local, tokens))
            there.append(await decode_tps(router, on_worker, tokens))
            print(f"round {n + 1}: local {here[-1]:.1f} tok/s, on one RPC worker {there[-1]:.1f} tok/s")
    ratios = [b / a for a, b in zip(here, there, strict=True)]
    print(
        f"\ndecode tok/s, median of {rounds}: local {statistics.median(here):.1f}, one loopback RPC worker "
        f"{statistics.median(there):.1f}"
    )
    print(
        f"RPC worker / local: {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rpc-only", action="store_true", help="skip the remote Lemon Desk half")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lemon-desk-rpc-bench-") as home:
        os.environ["LEMON_DESK_HOME"] = home
        os.environ["LEMON_DESK_MOCK_HARDWARE"] = str(profile_path("cpu_only_x86"))
        asyncio.run(measure(args.rounds, args.tokens, args.threads))
    if not args.rpc_only:
        print("\n--- a remote Lemon Desk (tests/bench/remote_overhead.py) ---", flush=True)
        remote = Path(__file__).with_name("remote_overhead.py")
        options = ["--rounds", str(args.rounds), "--tokens", str(args.tokens)]
        subprocess.run([sys.executable, str(remote), *options], check=True)


if __name__ == "__main__":
    main()
