"""Load-to-ready through the router against starting llama-server by hand, on the same binary and model.

The router path is the one-click load every front end uses: ``Router.load`` of an imported GGUF with the
``system`` backend pointed at the cached llama-server (``Settings.llama_server_path``), timed from the
call until the task returns a READY engine, then unloaded (not timed). The raw path spawns the same
binary with ``-m GGUF --ctx-size 4096 --port P --host 127.0.0.1`` and ``LD_LIBRARY_PATH`` on its folder,
polls ``/health`` every 10 ms with httpx until it answers 200, then terminates and reaps it. The two
alternate in each round so drift in the machine's load hits both; one uncounted warm-up of each comes
first (disk cache, the router's one-time hardware probe, numpy for the first GGUF header).
Target: router / raw <= 1.1.

``--ctx-size`` is the app's default (``DEFAULT_CTX_SIZE``): without it llama-server sizes its KV cache
from the model's training context (four 8192-token slots for SmolLM2), more work than the app's engine
does, which would hide the router's overhead. The app's engine also gets ``--jinja --metrics
--api-key-file``, as every app load does.

    .venv/bin/python tests/bench/load_ready.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.launch import DEFAULT_CTX_SIZE
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.llama import build_llama_server, fetch_smollm_gguf

RAW_POLL_S = 0.01
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 5.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def raw_ready(binary: Path, gguf: Path) -> float:
    """Seconds from spawning llama-server to its first /health 200; the process is reaped after."""
    port = _free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": str(binary.parent)}
    argv = [str(binary), "-m", str(gguf), "--ctx-size", str(DEFAULT_CTX_SIZE), "--port", str(port)]
    argv += ["--host", "127.0.0.1"]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", trust_env=False) as client:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/health", timeout=2.0)).status_code == 200:
                        return time.perf_counter() - start
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited with {proc.returncode} before it was ready")
                if time.perf_counter() - start > READY_TIMEOUT_S:
                    raise RuntimeError(f"llama-server was not ready within {READY_TIMEOUT_S:g} s")
                await asyncio.sleep(RAW_POLL_S)
        finally:
            # A llama-server now and then ignores SIGTERM here (seen once in 30 runs): kill it after a grace.
            proc.terminate()
            try:
                proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def router_ready(router: Router, name: str) -> float:
    """Seconds from ``Router.load`` to a READY engine; unloaded after (not timed)."""
    start = time.perf_counter()
    await router.load(name, ModelOptions(backend="system"))
    took = time.perf_counter() - start
    await router.unload(name)
    return took


async def bench(rounds: int) -> None:
    server_dir, gguf = build_llama_server(print), fetch_smollm_gguf(print)
    binary = server_dir / "llama-server"
    async with Router(Settings(llama_server_path=str(binary))) as router:
        name = router.library.import_path(gguf).name
        await router_ready(router, name)  # warm-ups, not counted
        await raw_ready(binary, gguf)
        via_router: list[float] = []
        raw: list[float] = []
        for i in range(rounds):
            pair = [(via_router, lambda: router_ready(router, name)), (raw, lambda: raw_ready(binary, gguf))]
            for results, run in pair if i % 2 == 0 else reversed(pair):
                results.append(await run())
    router_s, raw_s = statistics.median(via_router), statistics.median(raw)
    ratio = router_s / raw_s
    # Each round's two runs ran back to back, so a burst of load on the machine hits both alike.
    paired = statistics.median(r / w for r, w in zip(via_router, raw, strict=True))
    print(f"rounds: {rounds} per path, llama-server {server_dir.name}, SmolLM2-135M, load average {_load()}")
    print(f"raw spawn to /health 200 : median {raw_s * 1000:.1f} ms  (runs: {_runs(raw)})")
    print(f"router load to ready     : median {router_s * 1000:.1f} ms  (runs: {_runs(via_router)})")
    print(f"ratio router / raw       : {ratio:.3f}  (target <= 1.1: {'met' if ratio <= 1.1 else 'NOT met'})")
    print(f"paired ratio (median)    : {paired:.3f}")


def _runs(values: list[float]) -> str:
    return " ".join(f"{v * 1000:.0f}" for v in values)


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    # The library, options, engine key files and logs go to a throwaway app folder, not the user's.
    with tempfile.TemporaryDirectory(prefix="lemon-desk-bench-") as home:
        os.environ["LEMON_DESK_HOME"] = home
        asyncio.run(bench(args.rounds))


if __name__ == "__main__":
    main()
