"""The fit estimate: KV cache arithmetic, where the model lives on each kind of machine, and verdicts."""

from __future__ import annotations

import json

import pytest

from app.core.errors import ModelError
from app.core.fit import (
    GB,
    MIB,
    UBATCH,
    MemoryKind,
    ModelShape,
    Verdict,
    estimate,
    memory_budget,
    shape_from_config,
    shape_from_gguf,
)
from app.core.hardware import Hardware, hardware_from_json
from tests.conftest import profile_path

# Llama-3-8B's published shape: 32 layers, 8 KV heads of 128 dims -> 128 KiB of f16 K+V per token.
LLAMA3_8B = {
    "general.architecture": "llama",
    "llama.block_count": 32,
    "llama.embedding_length": 4096,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.context_length": 8192,
}
Q4_WEIGHTS = int(4.92 * GB)


def hw(name: str) -> Hardware:
    return hardware_from_json(json.loads(profile_path(name).read_text()))


def test_kv_cache_per_token_matches_the_published_figure() -> None:
    shape = shape_from_gguf(LLAMA3_8B)
    assert shape.kv_bytes_per_token == 128 * 1024
    assert shape.context_train == 8192
    fit = estimate(Q4_WEIGHTS, shape, hw("cpu_only_x86"), "llamacpp", 8192)
    assert fit.kv_cache == 1024 * MIB  # 1 GiB at 8k tokens, as llama.cpp prints for this model
    assert fit.need == fit.weights + fit.kv_cache + fit.overhead


def test_explicit_head_dims_and_per_layer_kv_heads() -> None:
    hybrid = {
        "general.architecture": "hyb",
        "hyb.block_count": 4,
        "hyb.embedding_length": 1024,
        "hyb.attention.head_count": 16,
        "hyb.attention.head_count_kv": [4, 0, 4, 0],  # recurrent layers keep no KV cache
        "hyb.attention.key_length": 128,
        "hyb.attention.value_length": 64,
    }
    assert shape_from_gguf(hybrid).kv_elements_per_token == 8 * (128 + 64)
    with pytest.raises(ModelError, match="3 entries for 4 layers"):
        shape_from_gguf({**hybrid, "hyb.attention.head_count_kv": [1, 2, 3]})
    with pytest.raises(ModelError, match="names no architecture"):
        shape_from_gguf({})


def test_shape_from_an_mlx_config_including_vision_language_ones() -> None:
    config = {
        "model_type": "qwen3",
        "num_hidden_layers": 28,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
    }
    shape = shape_from_config(config)
    assert shape.kv_elements_per_token == 28 * 8 * 256
    assert shape_from_config({"model_type": "vlm", "text_config": config}) == ModelShape(
        "qwen3", 28, 1024, 28 * 8 * 256, 40960
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("llama.block_count", float("nan")),  # int() raised ValueError
        ("llama.block_count", float("inf")),  # ... OverflowError
        ("llama.block_count", 1 << 62),  # [x] * layers raised MemoryError
        ("llama.block_count", 0),  # max() of no layers raised ValueError
        ("llama.embedding_length", float("-inf")),
        ("llama.context_length", 1e300),
        ("llama.attention.head_count", [float("nan")] * 32),
    ],
)
def test_a_damaged_header_number_is_a_model_error(key: str, value: object) -> None:
    with pytest.raises(ModelError, match="The fit cannot be estimated"):
        shape_from_gguf({**LLAMA3_8B, key: value})


def test_a_damaged_config_is_a_model_error() -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
    for bad in [
        [config],  # not a JSON object: AttributeError before
        {**config, "num_hidden_layers": float("inf")},  # json.loads reads Infinity
        {**config, "num_hidden_layers": 0},
        {**config, "num_hidden_layers": 10_001},
        {**config, "hidden_size": float("nan")},
    ]:
        with pytest.raises(ModelError, match="The fit cannot be estimated"):
            shape_from_config(bad)  # type: ignore[arg-type]
    assert shape_from_config({**config, "num_hidden_layers": 10_000}).layers == 10_000


def test_memory_budget_per_kind_of_machine() -> None:
    mac = memory_budget(hw("apple_silicon"), "lemon-mlx")  # 64 GB: GPU may wire three quarters
    assert (mac.kind, mac.usable) == (MemoryKind.UNIFIED, int(64 * GB * 0.75))
    apu = memory_budget(hw("strix_halo"), "llamacpp")  # 96 GB carve-out
    assert (apu.kind, apu.usable) == (MemoryKind.UNIFIED, int(96 * GB))
    card = memory_budget(hw("igpu_plus_rdna4"), "llamacpp")  # the discrete card, not the iGPU
    assert (card.kind, card.usable, card.device) == (MemoryKind.VRAM, int(16 * GB), "Radeon RX 9070 XT")
    assert card.spill == int(64 * GB * 0.8)
    nv = memory_budget(hw("nvidia"), "llamacpp")
    assert (nv.usable, nv.device) == (int(24 * GB), "NVIDIA GeForce RTX 4090")
    # lemon-mlx does not run on NVIDIA: system RAM it is.
    assert memory_budget(hw("nvidia"), "lemon-mlx").kind is MemoryKind.RAM
    assert memory_budget(hw("cpu_only_x86"), "llamacpp") == memory_budget(hw("cpu_only_x86"), "lemon-mlx")


def test_verdicts_and_the_largest_context() -> None:
    shape = shape_from_gguf(LLAMA3_8B)
    roomy = estimate(Q4_WEIGHTS, shape, hw("rdna3_radeon_7900"), "llamacpp", 8192)
    assert roomy.verdict is Verdict.FITS and roomy.max_context == 8192  # capped at the trained context
    assert "fits: needs" in roomy.summary() and "VRAM (Radeon RX 7900 XTX)" in roomy.summary()

    def card(vram_gb: float) -> Hardware:
        gpu = {"name": "RX 7600", "gfx": "gfx1102", "vram_gb": vram_gb, "integrated": False}
        return hardware_from_json(
            {**json.loads(profile_path("rdna3_radeon_7900").read_text()), "amd_gpu": [gpu]}
        )

    spill = estimate(Q4_WEIGHTS, shape, card(6), "llamacpp", 8192)
    assert spill.verdict is Verdict.TIGHT and "spills into system RAM" in spill.summary()
    # With 7 GB, weights and overhead leave 0.8 x 7 GB minus themselves for the KV cache and mask.
    some = estimate(Q4_WEIGHTS, shape, card(7), "llamacpp", 8192)
    room = int(7 * GB * 0.8) - some.weights - (some.overhead - UBATCH * 2 * 8192)
    assert some.max_context == room // (shape.kv_bytes_per_token + 2 * UBATCH) // 256 * 256
    assert some.max_context is not None and 0 < some.max_context < 8192

    laptop = hardware_from_json({**json.loads(profile_path("cpu_only_x86").read_text()), "memory_gb": 4})
    no = estimate(Q4_WEIGHTS, shape, laptop, "llamacpp", 8192)
    assert no.verdict is Verdict.WONT_FIT and no.max_context is None
    assert no.summary().startswith("won't fit") and "no context size fits" in no.summary()
    tight = estimate(int(3.0 * GB), shape, laptop, "llamacpp", 4096)
    assert tight.verdict is Verdict.TIGHT  # within 4 GB but not within 80% of it
    assert tight.to_json()["verdict"] == "tight" and tight.to_json()["need_bytes"] == tight.need
