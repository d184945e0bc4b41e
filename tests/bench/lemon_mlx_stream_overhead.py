"""Streaming overhead of the app's client on the REAL lemon-mlx engine (b1050-stable's Linux CPU
``server``, tests/support/lemon_mlx_engine.py) against talking to it directly with raw httpx.

The app's path adapts the request, splits ``<think>`` out of the content and waits for the engine's
stderr speed lines; the direct path reads the SSE lines itself. The model is the endless variant of the
tiny Qwen3 (tests/support/qwen3_model.py): every reply runs to the token limit, so both paths see the
same number of tokens, and decode speed is that count over the time from first to last piece of text.
Timing and alternation as in stream_overhead.py. Targets: decode ratio >= 0.99, TTFT within +2 ms.
Needs the engine built (``python -m tests.support.prepare``).

    .venv/bin/python tests/bench/lemon_mlx_stream_overhead.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.client.events import ChatDelta
from app.core.launch import LaunchRequest
from app.supervisor.engine import Engine
from tests.bench.stream_overhead import Timing, compare, run_bench, timing
from tests.support.lemon_mlx_engine import ASSET, engine_folder
from tests.support.lemon_mlx_release import lay_out_hf_cache
from tests.support.mlx_env import qwen3_mlx_model

REPO = "tests/qwen3-endless"


async def through_app(engine: Engine, prompt: str, tokens: int) -> Timing:
    async with engine.chat_client() as client:
        first: float | None = None
        last = 0.0
        sent = time.perf_counter()
        cpu = time.process_time()
        async for event in client.stream_chat([{"role": "user", "content": prompt}], max_tokens=tokens):
            if isinstance(event, ChatDelta) and (event.content or event.reasoning):
                last = time.perf_counter()
                first = first or last
    return timing(sent, first, last, tokens, time.process_time() - cpu)


async def direct(engine: Engine, prompt: str, tokens: int) -> Timing:
    payload = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens, "stream": True}
    async with httpx.AsyncClient(base_url=engine.base_url, trust_env=False) as client:
        first: float | None = None
        last = 0.0
        sent = time.perf_counter()
        cpu = time.process_time()
        async with client.stream("POST", "/v1/chat/completions", json=payload, timeout=None) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                if (choices[0].get("delta") or {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
    return timing(sent, first, last, tokens, time.process_time() - cpu)


async def bench(rounds: int, tokens: int) -> None:
    packed = engine_folder() / ASSET
    if not packed.is_file():
        raise SystemExit(f"{packed} is not built: run python -m tests.support.prepare")
    with tempfile.TemporaryDirectory(prefix="lemon-mlx-bench-") as tmp:
        folder = Path(tmp) / "engine"
        with zipfile.ZipFile(packed) as zf:
            zf.extractall(folder)
        (folder / "server").chmod(0o755)
        hub = Path(tmp) / "hf" / "hub"
        lay_out_hf_cache(hub, REPO, qwen3_mlx_model(endless=True))
        request = LaunchRequest(
            "lemon-mlx", "cpu", str(folder / "server"), str(folder), REPO, hf_hub_cache=str(hub)
        )
        label = "lemon-mlx-engine b1050-stable (cpu), tiny endless Qwen3"
        await compare(request, label, through_app, direct, rounds, tokens)


if __name__ == "__main__":
    run_bench(__doc__, bench)
