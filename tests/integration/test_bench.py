"""``lemon-desk bench`` on the real llama-server and SmolLM2: figures above zero with their spread, the
``--json`` document's shape, and the run kept in the app's home."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.store.bench_results import load_runs
from app.store.settings import Settings, save_settings
from tests.integration.conftest import lemon_desk

pytestmark = pytest.mark.integration

RESULT_KEYS = {
    "model",
    "recipe",
    "backend",
    "engine_version",
    "prompt_tokens",
    "gen_tokens",
    "repetitions",
    "pp_tps",
    "pp_tps_stdev",
    "tg_tps",
    "tg_tps_stdev",
    "ttft_s",
}
HARDWARE_KEYS = {"os", "arch", "cpu", "memory_gb", "amd_gpu", "nvidia_gpu", "metal"}


@pytest.fixture
def system_llama(llama_dir: Path) -> None:
    save_settings(Settings(llama_server_path=str(llama_dir / "llama-server")))


def test_bench_json_on_the_real_llama_server(system_llama: None, smol_gguf: Path) -> None:
    done = lemon_desk(
        "bench",
        str(smol_gguf),
        "--backend",
        "llamacpp:system",
        "--prompt-tokens",
        "64",
        "--gen-tokens",
        "16",
        "--repetitions",
        "3",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == {"hardware", "results"}
    assert set(document["hardware"]) >= HARDWARE_KEYS
    (result,) = document["results"]
    assert set(result) == RESULT_KEYS
    assert (result["recipe"], result["backend"]) == ("llamacpp", "system")
    assert (result["prompt_tokens"], result["gen_tokens"], result["repetitions"]) == (64, 16, 3)
    assert result["pp_tps"] > 0 and result["tg_tps"] > 0 and result["ttft_s"] > 0
    assert result["pp_tps_stdev"] > 0 and result["tg_tps_stdev"] > 0, "three repetitions have a spread"
    backends = json.loads(lemon_desk("backends", "--json").stdout)["recipes"]["llamacpp"]["backends"]
    # One source for one binary: bench said "version unknown" where `backends` said b0.
    assert result["engine_version"] == backends["system"]["version"] != ""
    (kept,) = load_runs().runs
    assert kept.results[0].pp_tps == result["pp_tps"] and kept.hardware == document["hardware"]


def test_bench_table_shows_medians_with_spread(system_llama: None, smol_gguf: Path) -> None:
    done = lemon_desk(
        "bench",
        str(smol_gguf),
        "--backend",
        "llamacpp:system",
        "--prompt-tokens",
        "32",
        "--gen-tokens",
        "8",
        "--repetitions",
        "2",
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("Hardware: ")
    pp = next(line for line in lines if " pp32 " in line)
    tg = next(line for line in lines if " tg8 " in line)
    for line in (pp, tg):
        median = float(line.split(" ± ")[0].split()[-1])
        assert median > 0 and " ± " in line
    assert "repetition 2 of 2" in done.stderr
    assert load_runs().runs, "the run is kept"


def test_bench_checks_memory_and_the_engines_context_as_run_does(system_llama: None, smol_gguf: Path) -> None:
    """A context past free memory is refused before any engine starts, as run refuses it (the bench
    loaded with --force and the engine failed its own way); a prompt past the context llama-server gives
    the model (SmolLM2 was trained for 8,192 tokens) gets the app's message, not the engine's JSON."""
    too_big = lemon_desk("bench", str(smol_gguf), "--prompt-tokens", "16000000", "--repetitions", "1")
    assert too_big.returncode == 1
    assert "KV cache" in too_big.stderr and "is free now" in too_big.stderr and "--force" in too_big.stderr
    past_context = lemon_desk("bench", str(smol_gguf), "--prompt-tokens", "9000", "--repetitions", "1")
    assert past_context.returncode == 1
    error = next(line for line in past_context.stderr.splitlines() if line.startswith("error: "))
    assert error.startswith("error: SmolLM2-135M-Instruct.Q4_1 runs with a context of 8,192 tokens"), error
    assert "a prompt of 9,000 tokens and a reply of 128 need 9,128" in error
    assert "exceed_context_size_error" not in past_context.stderr
