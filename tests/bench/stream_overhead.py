"""Streaming overhead of the app's chat client against talking to llama-server directly with raw httpx.

Both paths send the same request to the same real llama-server (SmolLM2-135M, prompt cache off, fixed
seed, temperature 0, a fixed number of tokens) and time it the same way on the client: time to the
first content token, and decode speed from the first to the last token. Runs alternate between the
paths so drift in the machine's load hits both. Targets: decode ratio >= 0.99, TTFT within +2 ms.

An engine that prints its own speed after each reply (lemon-mlx's stderr lines) is read for both paths
too, and each reply's decode speed on the client is also given over the engine's own for that reply:
two replies back to back differ in the engine's speed by several percent on these machines, which a
plain ratio of 10-20 pairs cannot tell from the client's cost.

With ``--loop app`` both paths run on the window's own event loop (``DesktopLoop``, offscreen), as the
chat pane's client does; ``--loop qasync`` on qasync's own, for comparison.

    .venv/bin/python tests/bench/stream_overhead.py [--rounds N] [--tokens N] [--loop asyncio|app|qasync]
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.client.events import ChatDelta, ChatDone
from app.client.pacing import FRAME_S
from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest
from app.core.telemetry import Telemetry
from app.supervisor.engine import Engine
from tests.conftest import profile_path
from tests.support.llama import build_llama_server, fetch_smollm_gguf

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain how a bicycle works.",
    "Describe a busy market in the morning.",
    "Tell me about the history of tea.",
    "What makes a good friend?",
]


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    decode_tps: float
    cpu_per_token_s: float  # this process's CPU time for the request, per token: the client's own cost
    engine_tps: float = 0.0  # the engine's own decode speed for the reply, where it prints it (else 0)


def timing(sent: float, first: float | None, last: float, tokens: int, cpu_s: float) -> Timing:
    assert first is not None and tokens > 1, "the reply had no tokens"
    return Timing(first - sent, (tokens - 1) / (last - first), cpu_s / tokens)


def params(tokens: int) -> dict[str, object]:
    return {
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "seed": 42,
        "cache_prompt": False,
    }


async def through_app(engine: Engine, prompt: str, tokens: int) -> Timing:
    async with engine.chat_client() as client:
        first: float | None = None
        last = 0.0
        count = 0
        cpu = time.process_time()
        sent = time.perf_counter()
        async for event in client.stream_chat([{"role": "user", "content": prompt}], **params(tokens)):
            if isinstance(event, ChatDelta) and event.content:
                last = time.perf_counter()
                first = first or last
                count += 1
            elif isinstance(event, ChatDone):  # a delta holds a read's tokens: the end says how many
                count = event.telemetry.completion_tokens or count
    return timing(sent, first, last, count, time.process_time() - cpu)


async def direct(engine: Engine, prompt: str, tokens: int) -> Timing:
    headers = {"Authorization": f"Bearer {engine.api_key}"}
    payload = {
        "messages": [{"role": "user", "content": prompt}],
        **params(tokens),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(base_url=engine.base_url, headers=headers, trust_env=False) as client:
        first: float | None = None
        last = 0.0
        count = 0
        cpu = time.process_time()
        sent = time.perf_counter()
        async with client.stream("POST", "/v1/chat/completions", json=payload, timeout=None) as response:
            rest = b""
            async for chunk in response.aiter_bytes():  # the least a client can do: split lines, parse JSON
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    if not line.startswith(b"data: {"):
                        continue
                    event = json.loads(line[6:])
                    if ((event.get("choices") or [{}])[0].get("delta") or {}).get("content"):
                        last = time.perf_counter()
                        first = first or last
                        count += 1
                    told = (event.get("usage") or {}).get("completion_tokens")
                    count = told or count  # as the app's client counts
    return timing(sent, first, last, count, time.process_time() - cpu)


PathFn = Callable[[Engine, str, int], Awaitable[Timing]]


async def compare(
    request: LaunchRequest, label: str, through_app: PathFn, direct: PathFn, rounds: int, tokens: int
) -> None:
    """Start the engine, run both paths in alternating order for ``rounds`` rounds, print the figures."""
    hardware = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    engine = Engine("bench", request, hardware)

    async def timed(path: PathFn, prompt: str, tokens: int) -> Timing:
        said = engine.telemetry
        if said is None:
            return await path(engine, prompt, tokens)
        said.request_started()
        result = await path(engine, prompt, tokens)
        figures = await said.refine(Telemetry(0.0, 0, 0.0, 0, 0.0))  # waits for the line, at most 1 s
        return replace(result, engine_tps=figures.decode_tps)

    await engine.start()
    try:
        await through_app(engine, PROMPTS[0], 8)  # warm-up, not counted
        await direct(engine, PROMPTS[0], 8)
        app: list[Timing] = []
        raw: list[Timing] = []
        for i in range(rounds):
            prompt = PROMPTS[i % len(PROMPTS)]
            pair = [(app, through_app), (raw, direct)]
            for results, path in pair if i % 2 == 0 else reversed(pair):
                results.append(await timed(path, prompt, tokens))
    finally:
        await engine.stop()

    def median(values: list[Timing], field: str) -> float:
        return float(statistics.median(getattr(t, field) for t in values))

    # Paired figures: each round's two runs ran back to back, so load on the machine hits both alike.
    pair_ratio = statistics.median(a.decode_tps / r.decode_tps for a, r in zip(app, raw, strict=True))
    pair_ttft = statistics.median(a.ttft_s - r.ttft_s for a, r in zip(app, raw, strict=True))
    print(
        f"rounds: {rounds} per path, {tokens} tokens per reply, {label}; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"decode tok/s (median): app {median(app, 'decode_tps'):.2f}  direct {median(raw, 'decode_tps'):.2f}"
        f"  paired ratio {pair_ratio:.4f}"
    )
    share_ratio = None
    if all(t.engine_tps > 0 for t in app + raw):
        pairs = list(zip(app, raw, strict=True))
        engine_ratio = statistics.median(a.engine_tps / r.engine_tps for a, r in pairs)
        share_ratio = statistics.median(
            (a.decode_tps / a.engine_tps) / (r.decode_tps / r.engine_tps) for a, r in pairs
        )
        print(
            f"the engine's own decode speed, paired: app / direct {engine_ratio:.4f};"
            f" decode each over the engine's own, paired ratio {share_ratio:.4f}"
        )
    print(
        f"TTFT (median): app {median(app, 'ttft_s') * 1000:.2f} ms"
        f"  direct {median(raw, 'ttft_s') * 1000:.2f} ms  paired difference {pair_ttft * 1000:+.2f} ms"
    )
    print(
        f"client CPU per token (median): app {median(app, 'cpu_per_token_s') * 1e6:.1f} us"
        f"  direct {median(raw, 'cpu_per_token_s') * 1e6:.1f} us"
    )
    # The app's client reads once a frame after the first token, so it may see a reply's last tokens up
    # to a frame late: on a short, fast reply that frame weighs in the ratio whatever the relay costs.
    decode_s = statistics.median((tokens - 1) / r.decode_tps for r in raw)
    print(
        f"a reply's decode lasts {decode_s * 1000:.0f} ms (median, direct);"
        f" one frame ({FRAME_S * 1000:.0f} ms) is {FRAME_S / decode_s:.1%} of it"
    )
    ratio = pair_ratio if share_ratio is None else share_ratio
    print(
        f"targets: decode ratio >= 0.99: {'met' if ratio >= 0.99 else 'NOT met'}; "
        f"TTFT within +2 ms: {'met' if pair_ttft <= 0.002 else 'NOT met'}"
    )


def run_bench(doc: str | None, make: Callable[[int, int], Awaitable[None]]) -> None:
    """Parse --rounds/--tokens and run ``make(rounds, tokens)`` with a throwaway app folder."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument(
        "--loop",
        choices=("asyncio", "app", "qasync"),
        default="asyncio",
        help="the event loop both paths run on: asyncio's (as serve and run), the window's (app:"
        " DesktopLoop, offscreen) or qasync's own, the window's before DesktopLoop",
    )
    args = parser.parse_args()
    # The engine's key file and log go to a throwaway app folder, not the user's.
    with tempfile.TemporaryDirectory(prefix="lemon-desk-bench-") as home:
        os.environ["LEMON_DESK_HOME"] = home
        if args.loop == "asyncio":
            asyncio.run(make(args.rounds, args.tokens))
        else:
            on_qt_loop(args.loop == "app", make(args.rounds, args.tokens))


def on_qt_loop(desktop: bool, work: Awaitable[None]) -> None:
    """Run ``work`` on the window's event loop (``DesktopLoop``), or qasync's own."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.ui.event_loop import DesktopLoop

    app = QApplication.instance() or QApplication([])
    loop = DesktopLoop(app) if desktop else qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(work)
    finally:
        loop.close()
        asyncio.set_event_loop(None)


async def bench(rounds: int, tokens: int) -> None:
    server_dir, model = build_llama_server(print), fetch_smollm_gguf(print)
    request = LaunchRequest(
        "llamacpp", "cpu", str(server_dir / "llama-server"), str(server_dir), str(model), 2048
    )
    label = f"llama-server {server_dir.name}, SmolLM2-135M"
    await compare(request, label, through_app, direct, rounds, tokens)


if __name__ == "__main__":
    run_bench(__doc__, bench)
