"""The local API's overhead: `lemon-desk serve` (a real child process) against talking to llama-server
directly, on the real llama-server and SmolLM2-135M, both engines started with the same options
(``--parallel 8``, same context).

- one stream at a time: decode tok/s through serve / direct (target >= 0.99) and the TTFT difference
  (target <= +2 ms), paired per round, the two paths alternating so the machine's load hits both;
- 8 concurrent streams: aggregate tok/s through serve / direct (target >= 0.95).

Both paths are timed the same way on the client (raw httpx, lines split, JSON parsed).

    .venv/bin/python tests/bench/serve_overhead.py [--rounds N] [--tokens N] [--concurrent-rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from app.supervisor.engine import Engine
from tests.conftest import profile_path
from tests.support.llama import llama_server_dir, smollm_gguf
from tests.support.serve import serving

MODEL = "smol"
CTX = 8192
ARGS = ("--parallel", "8")
PROMPTS = [
    "Write a short poem about the sea.",
    "Explain how a bicycle works.",
    "Describe a busy market in the morning.",
    "Tell me about the history of tea.",
    "What makes a good friend?",
]


@dataclass(frozen=True)
class Target:
    """Where a request goes: a base URL, its headers, and the model name to send."""

    base: str
    headers: dict[str, str]
    model: str | None


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    decode_tps: float
    tokens: int


def payload(prompt: str, tokens: int, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "seed": 42,
        "cache_prompt": False,
        "stream": True,
    }
    if model:
        body["model"] = model
    return body


async def stream(client: httpx.AsyncClient, path: Target, prompt: str, tokens: int) -> Timing:
    try:
        return await _stream(client, path, prompt, tokens)
    except httpx.RemoteProtocolError:
        # llama-server closes kept-alive connections on its own; the app sends such a request again
        # (ChatClient.forward_stream), and so does the bench, on either path.
        return await _stream(client, path, prompt, tokens)


async def _stream(client: httpx.AsyncClient, path: Target, prompt: str, tokens: int) -> Timing:
    first: float | None = None
    last = 0.0
    count = 0
    sent = time.perf_counter()
    body = payload(prompt, tokens, path.model)
    url = f"{path.base}/v1/chat/completions"
    async with client.stream("POST", url, json=body, headers=path.headers, timeout=None) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}: {(await response.aread()).decode()}")
        rest = b""
        async for chunk in response.aiter_bytes():
            *lines, rest = (rest + chunk).split(b"\n")
            for line in lines:
                if not line.startswith(b"data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
                    count += 1
    assert first is not None and count > 1, "the reply had no tokens"
    return Timing(first - sent, (count - 1) / (last - first), count)


async def concurrent(client: httpx.AsyncClient, path: Target, streams: int, tokens: int) -> float:
    """Aggregate tok/s of ``streams`` streams at once: every token over the wall time."""
    started = time.perf_counter()
    jobs = [stream(client, path, PROMPTS[i % len(PROMPTS)], tokens) for i in range(streams)]
    results = await asyncio.gather(*jobs)
    return sum(r.tokens for r in results) / (time.perf_counter() - started)


async def bench(args: argparse.Namespace, served_url: str, engine: Engine) -> None:
    through = Target(served_url, {}, MODEL)
    direct = Target(engine.base_url, {"Authorization": f"Bearer {engine.api_key}"}, None)
    # Idle connections go before llama-server's 5 s keep-alive ends (else a request can meet a closing one).
    limits = httpx.Limits(max_connections=None, keepalive_expiry=2.0)
    async with httpx.AsyncClient(trust_env=False, limits=limits) as client:
        for path in (through, direct):  # warm-up (serve loads its engine here), not counted
            await stream(client, path, PROMPTS[0], 8)
        serve_runs: list[Timing] = []
        direct_runs: list[Timing] = []
        for i in range(args.rounds):
            prompt = PROMPTS[i % len(PROMPTS)]
            pair = [(serve_runs, through), (direct_runs, direct)]
            for results, path in pair if i % 2 == 0 else reversed(pair):
                results.append(await stream(client, path, prompt, args.tokens))
        serve_agg: list[float] = []
        direct_agg: list[float] = []
        for i in range(args.concurrent_rounds):
            pair2 = [(serve_agg, through), (direct_agg, direct)]
            for totals, path in pair2 if i % 2 == 0 else reversed(pair2):
                totals.append(await concurrent(client, path, 8, args.tokens))

    pairs = list(zip(serve_runs, direct_runs, strict=True))
    ratio = statistics.median(s.decode_tps / d.decode_tps for s, d in pairs)
    ttft = statistics.median(s.ttft_s - d.ttft_s for s, d in pairs)
    agg = statistics.median(s / d for s, d in zip(serve_agg, direct_agg, strict=True))
    print(f"llama-server, SmolLM2-135M, --parallel 8; {args.rounds} rounds x {args.tokens} tokens per path")
    print(
        f"decode tok/s (median): serve {statistics.median(r.decode_tps for r in serve_runs):.2f}"
        f"  direct {statistics.median(r.decode_tps for r in direct_runs):.2f}  paired ratio {ratio:.4f}"
    )
    print(
        f"TTFT (median): serve {statistics.median(r.ttft_s for r in serve_runs) * 1000:.2f} ms"
        f"  direct {statistics.median(r.ttft_s for r in direct_runs) * 1000:.2f} ms"
        f"  paired difference {ttft * 1000:+.2f} ms"
    )
    print(
        f"8 concurrent streams, aggregate tok/s (median of {args.concurrent_rounds}): "
        f"serve {statistics.median(serve_agg):.1f}  direct {statistics.median(direct_agg):.1f}"
        f"  paired ratio {agg:.4f}"
    )
    print(
        f"targets: decode ratio >= 0.99: {'met' if ratio >= 0.99 else 'NOT met'}; "
        f"TTFT within +2 ms: {'met' if ttft <= 0.002 else 'NOT met'}; "
        f"8 streams >= 0.95: {'met' if agg >= 0.95 else 'NOT met'}"
    )


async def run(args: argparse.Namespace, served_url: str, server_dir: Path, model: Path) -> None:
    hardware = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    request = LaunchRequest(
        "llamacpp", "cpu", str(server_dir / "llama-server"), str(server_dir), str(model), CTX, ARGS
    )
    engine = Engine("bench-direct", request, hardware)
    await engine.start()
    try:
        await bench(args, served_url, engine)
    finally:
        await engine.stop()


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--concurrent-rounds", type=int, default=4)
    args = parser.parse_args()
    server_dir, model = llama_server_dir(print), smollm_gguf(print)
    with tempfile.TemporaryDirectory(prefix="lemon-desk-bench-") as home:
        # serve's state (settings, the imported model, its options) goes to a throwaway app folder.
        os.environ["LEMON_DESK_HOME"] = home
        os.environ["LEMON_DESK_MOCK_HARDWARE"] = str(profile_path("cpu_only_x86"))
        os.environ["LD_LIBRARY_PATH"] = str(server_dir)
        settings = Settings(llama_server_path=str(server_dir / "llama-server"))
        save_settings(settings)
        Library(settings).import_path(model, name=MODEL)
        save_model_options({MODEL: ModelOptions(backend="system", ctx_size=CTX, args=" ".join(ARGS))})
        with serving() as served:
            asyncio.run(run(args, served.url, server_dir, model))


if __name__ == "__main__":
    main()
