"""The pure part of bench: medians and spread, pairing by base, the Markdown table, stored runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.core.bench import BenchResult, BenchRun, BenchSpec, Sample, pair, summarize, to_markdown
from app.core.errors import ConfigError
from app.store.bench_results import bench_path, load_runs, save_run

HARDWARE = {"cpu": {"name": "Test CPU", "threads": 8}, "memory_gb": 32, "amd_gpu": [], "nvidia_gpu": []}


def result() -> BenchResult:
    samples = [Sample(500.0, 150.0, 0.3), Sample(520.0, 160.0, 0.2), Sample(480.0, 140.0, 0.4)]
    return summarize("m", "llamacpp", "cpu", "b1", 512, 128, samples)


def test_summary_is_median_and_sample_stdev() -> None:
    r = result()
    assert (r.pp_tps, r.pp_tps_stdev, r.tg_tps, r.tg_tps_stdev, r.ttft_s) == (500.0, 20.0, 150.0, 10.0, 0.3)
    assert r.repetitions == 3


def test_pair_finds_the_models_sharing_a_base() -> None:
    names = ["Qwen3-0.6B-GGUF", "Qwen3-0.6B-MLX", "Qwen3-4B-MLX", "Qwen3-0.6B-GGUF-extra"]
    assert pair(names, "Qwen3-0.6B") == ["Qwen3-0.6B-GGUF", "Qwen3-0.6B-MLX"]
    with pytest.raises(ConfigError, match="No two catalog models"):
        pair(names, "Qwen3-4B")


def test_spec_refuses_nonsense() -> None:
    with pytest.raises(ConfigError):
        BenchSpec(("m",), repetitions=0).check()
    with pytest.raises(ConfigError):
        BenchSpec(()).check()
    # The context a load asks for keeps the local API's limit: llama-server's usage text came out.
    with pytest.raises(
        ConfigError, match="need a context of 100,000,000,000,383 tokens; a load takes at most"
    ):
        BenchSpec(("m",), prompt_tokens=99_999_999_999_999).check()
    BenchSpec(("m",), prompt_tokens=(1 << 24) - 128 - 256).check()


def test_markdown_is_llama_bench_table() -> None:
    text = to_markdown(BenchRun("r", 0.0, HARDWARE, (result(),)))
    assert "| model | backend | engine | test | t/s |" in text
    assert "| m | llamacpp:cpu | b1 | pp512 | 500.00 ± 20.00 |" in text
    assert "| m | llamacpp:cpu | b1 | tg128 | 150.00 ± 10.00 |" in text
    assert text.startswith("Hardware: Test CPU (8 threads), 32 GB RAM")


def test_runs_are_kept_and_a_corrupt_file_is_set_aside(lemon_home: Path) -> None:
    run = BenchRun("r1", 1.0, HARDWARE, (result(),))
    save_run(run)
    save_run(BenchRun("r2", 2.0, HARDWARE, ()))
    assert [r.id for r in load_runs().runs] == ["r1", "r2"]
    assert load_runs().runs[0] == run
    bench_path().write_text("{not json")
    loaded = load_runs()
    assert loaded.runs == [] and "unreadable" in loaded.warning
    assert [p.name for p in lemon_home.glob("bench.json.corrupt-*")]
    save_run(run)
    assert json.loads(bench_path().read_text())["runs"][0]["id"] == "r1"
