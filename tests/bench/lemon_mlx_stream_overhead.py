"""Streaming overhead of the app's client on the REAL lemon-mlx engine (b1050-stable's Linux CPU
``server``, tests/support/lemon_mlx_engine.py) against talking to it directly with raw httpx.

The app's path adapts the request, splits ``<think>`` out of the content and waits for the engine's
stderr speed lines; the direct path reads the SSE lines itself. The model is the endless variant of the
tiny Qwen3 (tests/support/qwen3_model.py): every reply runs to the token limit, so both paths get the
same reply. Both paths and how they are counted (pieces of text, reasoning included, the ``<think>``
tags not, on both sides): tests/bench/mlx_paths.py; timing and alternation as in stream_overhead.py.
Targets: decode ratio >= 0.99, TTFT within +2 ms. Needs the engine built
(``python -m tests.support.prepare``).

    .venv/bin/python tests/bench/lemon_mlx_stream_overhead.py [--rounds N] [--tokens N]
"""

from __future__ import annotations

import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.core.launch import LaunchRequest
from tests.bench.mlx_paths import paths
from tests.bench.stream_overhead import compare, run_bench
from tests.support.lemon_mlx_engine import ASSET, engine_folder
from tests.support.lemon_mlx_release import lay_out_hf_cache
from tests.support.mlx_env import qwen3_mlx_model

REPO = "tests/qwen3-endless"


def params(tokens: int) -> dict[str, object]:
    return {"max_tokens": tokens}


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
        await compare(request, label, *paths(params), rounds, tokens)


if __name__ == "__main__":
    run_bench(__doc__, bench)
