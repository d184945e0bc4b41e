"""Streaming overhead of the app's client on the lemon-mlx recipe (request adaptation, ``<think>``
splitting, [TPS] telemetry source) against talking to the engine directly with raw httpx.

The engine is mlx-lm (the ``mlx-lm`` backend, from the cached test venv) serving the tiny MLX model of
tests/support/mlx_model.py, at temperature 0 with the end-of-turn token banned so every reply has the
same length. Both paths and how they are counted: tests/bench/mlx_paths.py; timing and alternation as
in stream_overhead.py. Targets: decode ratio >= 0.99, TTFT within +2 ms.

    .venv/bin/python tests/bench/mlx_stream_overhead.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.launch import LaunchRequest
from tests.bench.mlx_paths import paths
from tests.bench.stream_overhead import compare, run_bench
from tests.support.mlx_env import build_mlx, mlx_python
from tests.support.mlx_model import SPECIAL


def params(tokens: int) -> dict[str, object]:
    end_of_turn = SPECIAL.index("<|im_end|>")
    return {"max_tokens": tokens, "temperature": 0, "logit_bias": {str(end_of_turn): -100}}


async def bench(rounds: int, tokens: int) -> None:
    model = build_mlx(print)
    python = mlx_python()
    request = LaunchRequest(
        "lemon-mlx", "mlx-lm", str(python), "", str(model), hf_hub_cache=str(model.parent)
    )
    label = "mlx-lm (lemon-mlx recipe), tiny MLX model"
    await compare(request, label, *paths(params), rounds, tokens)


if __name__ == "__main__":
    run_bench(__doc__, bench)
