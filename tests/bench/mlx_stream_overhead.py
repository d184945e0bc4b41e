"""Streaming overhead of the app's client on the lemon-mlx recipe (request adaptation, ``<think>``
splitting, [TPS] telemetry source) against talking to the engine directly with raw httpx.

The engine is mlx-lm (the ``mlx-lm`` backend, from the cached test venv) serving the tiny MLX model of
tests/support/mlx_model.py, at temperature 0 with the end-of-turn token banned so every reply has the
same length. Timing and alternation as in stream_overhead.py. Targets: decode ratio >= 0.99, TTFT
within +2 ms.

    .venv/bin/python tests/bench/mlx_stream_overhead.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.client.events import ChatDelta
from app.core.launch import LaunchRequest
from app.supervisor.engine import Engine
from tests.bench.stream_overhead import Timing, compare, run_bench, timing
from tests.support.mlx_env import build_mlx, mlx_python
from tests.support.mlx_model import SPECIAL


def params(tokens: int) -> dict[str, object]:
    end_of_turn = SPECIAL.index("<|im_end|>")
    return {"max_tokens": tokens, "temperature": 0, "logit_bias": {str(end_of_turn): -100}}


async def through_app(engine: Engine, prompt: str, tokens: int) -> Timing:
    async with engine.chat_client() as client:
        first: float | None = None
        last = 0.0
        count = 0
        sent = time.perf_counter()
        cpu = time.process_time()
        async for event in client.stream_chat([{"role": "user", "content": prompt}], **params(tokens)):
            if isinstance(event, ChatDelta) and (event.content or event.reasoning):
                last = time.perf_counter()
                first = first or last
                count += 1
    return timing(sent, first, last, count, time.process_time() - cpu)


async def direct(engine: Engine, prompt: str, tokens: int) -> Timing:
    payload = {
        "messages": [{"role": "user", "content": prompt}],
        **params(tokens),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(base_url=engine.base_url, trust_env=False) as client:
        first: float | None = None
        last = 0.0
        count = 0
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
                    count += 1
    return timing(sent, first, last, count, time.process_time() - cpu)


async def bench(rounds: int, tokens: int) -> None:
    model = build_mlx(print)
    python = mlx_python()
    request = LaunchRequest(
        "lemon-mlx", "mlx-lm", str(python), "", str(model), hf_hub_cache=str(model.parent)
    )
    label = "mlx-lm (lemon-mlx recipe), tiny MLX model"
    await compare(request, label, through_app, direct, rounds, tokens)


if __name__ == "__main__":
    run_bench(__doc__, bench)
