"""The support matrix across a dozen hardware profiles: states, messages, defaults, asset names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.core.backends import BackendKey, BackendState, parse_backend_versions
from app.core.errors import ConfigError
from app.core.hardware import AmdGpu, hardware_from_json
from app.core.matrix import RecipeSupport, SystemBinary, best_amd_gpu, support_matrix
from app.store.catalog import backend_versions_path, load_backend_versions
from tests.conftest import profile_path

NO, CAN = "unsupported", "installable"
GH = "https://github.com"


def matrix(profile: str, **kw: Any) -> dict[str, RecipeSupport]:
    hw = hardware_from_json(json.loads(profile_path(profile).read_text()))
    return support_matrix(hw, load_backend_versions(), **kw)


def states(support: RecipeSupport) -> dict[str, str]:
    return {name: s.state.value for name, s in support.backends.items()}


def test_apple_silicon() -> None:
    m = matrix("apple_silicon")
    assert states(m["llamacpp"]) == {
        "metal": CAN,
        "cuda": NO,
        "rocm": NO,
        "vulkan": NO,
        "cpu": NO,
        "system": NO,
    }
    assert m["llamacpp"].default_backend == "metal"
    assert m["llamacpp"].backends["metal"].asset == "llama-b10375-bin-macos-arm64.tar.gz"
    assert m["llamacpp"].backends["metal"].url == (
        f"{GH}/ggml-org/llama.cpp/releases/download/b10375/llama-b10375-bin-macos-arm64.tar.gz"
    )
    assert states(m["lemon-mlx"]) == {"metal": CAN, "rocm": NO, "cpu": CAN, "mlx-lm": CAN}
    assert m["lemon-mlx"].default_backend == "metal"
    assert m["lemon-mlx"].backends["metal"].asset == "mlx-engine-b1050-stable-macos-arm64.zip"
    assert m["lemon-mlx"].backends["cpu"].asset == "mlx-engine-b1050-stable-macos-arm64.zip"


def test_intel_mac_refuses_every_lemon_mlx_backend_before_download() -> None:
    m = matrix("intel_mac")
    assert states(m["lemon-mlx"]) == {"metal": NO, "rocm": NO, "cpu": NO, "mlx-lm": NO}
    assert m["lemon-mlx"].default_backend is None
    for name in ("metal", "rocm", "cpu"):
        status = m["lemon-mlx"].backends[name]
        assert "No lemon-mlx build exists for Intel Macs" in status.message
        assert status.asset is None and status.url is None
    assert m["llamacpp"].backends["metal"].message == "Metal builds are for Macs with Apple Silicon."
    assert m["llamacpp"].default_backend is None


def test_strix_halo() -> None:
    m = matrix("strix_halo")
    assert states(m["llamacpp"]) == {
        "metal": NO,
        "cuda": NO,
        "rocm": CAN,
        "vulkan": CAN,
        "cpu": CAN,
        "system": NO,
    }
    assert m["llamacpp"].default_backend == "rocm"  # ROCm preferred over Vulkan on Linux AMD
    assert m["llamacpp"].backends["rocm"].asset == "llama-b10470-bin-ubuntu-rocm-7.2-x64.tar.gz"
    assert (
        m["llamacpp"]
        .backends["rocm"]
        .url.startswith(f"{GH}/lemonade-sdk/llama.cpp/releases/download/b10470/")
    )
    assert states(m["lemon-mlx"]) == {"metal": NO, "rocm": CAN, "cpu": CAN, "mlx-lm": CAN}
    assert m["lemon-mlx"].default_backend == "rocm"
    assert m["lemon-mlx"].backends["rocm"].asset == "mlx-engine-b1050-stable-ubuntu-rocm-x64.zip"
    assert m["lemon-mlx"].backends["cpu"].asset == "mlx-engine-b1050-stable-ubuntu-cpu-x64.zip"


def test_igpu_beside_rdna4_card_picks_the_card() -> None:
    m = matrix("igpu_plus_rdna4")
    assert m["llamacpp"].default_backend == "rocm"
    assert m["lemon-mlx"].default_backend == "rocm"
    assert states(m["lemon-mlx"])["rocm"] == CAN


def test_rdna2_is_not_a_rocm_family_and_falls_back_to_cpu() -> None:
    m = matrix("rdna2")
    rocm = m["lemon-mlx"].backends["rocm"]
    assert rocm.state is BackendState.UNSUPPORTED
    assert "Radeon RX 6800 XT, gfx1030" in rocm.message and "not supported by ROCm" in rocm.message
    assert m["lemon-mlx"].default_backend == "cpu"
    assert states(m["llamacpp"]) == {
        "metal": NO,
        "cuda": NO,
        "rocm": NO,
        "vulkan": CAN,
        "cpu": CAN,
        "system": NO,
    }
    assert m["llamacpp"].default_backend == "vulkan"


def test_linux_arm64() -> None:
    m = matrix("linux_arm64")
    for name in ("metal", "rocm", "cpu"):
        status = m["lemon-mlx"].backends[name]
        assert status.state is BackendState.UNSUPPORTED
        assert status.message == "No lemon-mlx build exists for Linux arm64. Use the mlx-lm backend instead."
    assert m["lemon-mlx"].default_backend == "mlx-lm"
    assert m["llamacpp"].default_backend == "cpu"
    assert m["llamacpp"].backends["cpu"].asset == "llama-b10375-bin-ubuntu-arm64.tar.gz"
    assert m["llamacpp"].backends["vulkan"].state is BackendState.UNSUPPORTED


def test_nvidia_uses_highest_compute_capability() -> None:
    m = matrix("nvidia")
    assert states(m["llamacpp"]) == {
        "metal": NO,
        "cuda": CAN,
        "rocm": NO,
        "vulkan": CAN,
        "cpu": CAN,
        "system": NO,
    }
    assert m["llamacpp"].default_backend == "cuda"
    assert m["llamacpp"].backends["cuda"].asset == "llama-b10397-ubuntu-cuda-sm_89-x64.tar.xz"
    assert m["lemon-mlx"].default_backend == "cpu"
    assert "ROCm needs an AMD GPU" in m["lemon-mlx"].backends["rocm"].message


def test_amd_nvidia_hybrid() -> None:
    m = matrix("amd_nvidia_hybrid")
    assert states(m["llamacpp"]) == {
        "metal": NO,
        "cuda": CAN,
        "rocm": CAN,
        "vulkan": CAN,
        "cpu": CAN,
        "system": NO,
    }
    assert m["llamacpp"].default_backend == "cuda"
    assert m["llamacpp"].backends["cuda"].asset == "llama-b10397-ubuntu-cuda-sm_86-x64.tar.xz"
    assert m["lemon-mlx"].default_backend == "rocm"


def test_cpu_only_x86() -> None:
    m = matrix("cpu_only_x86")
    assert states(m["llamacpp"]) == {
        "metal": NO,
        "cuda": NO,
        "rocm": NO,
        "vulkan": NO,
        "cpu": CAN,
        "system": NO,
    }
    assert m["llamacpp"].default_backend == "cpu"
    assert m["llamacpp"].backends["cpu"].asset == "llama-b10375-bin-ubuntu-x64.tar.gz"
    assert m["llamacpp"].backends["vulkan"].message == "Vulkan needs a GPU; none was found."
    assert m["lemon-mlx"].default_backend == "cpu"


def test_machine_without_probe_tools_still_gets_an_answer() -> None:
    m = matrix("no_probe_tools")
    assert m["llamacpp"].default_backend == "cpu"
    assert m["lemon-mlx"].default_backend == "cpu"
    assert "No llama-server was found on PATH" in m["llamacpp"].backends["system"].message


def test_rdna3_card_is_gfx110x() -> None:
    m = matrix("rdna3_radeon_7900")
    assert m["lemon-mlx"].backends["rocm"].state is BackendState.INSTALLABLE
    assert m["llamacpp"].default_backend == "rocm"


def test_render_node_alone_allows_vulkan() -> None:
    m = matrix("intel_igpu_render_only")
    assert m["llamacpp"].default_backend == "vulkan"
    assert m["llamacpp"].backends["rocm"].state is BackendState.UNSUPPORTED


def test_installed_beats_installable_and_pin_mismatch_is_update_required() -> None:
    m = matrix(
        "strix_halo",
        installed={
            BackendKey("llamacpp", "vulkan"): "b10375",
            BackendKey("lemon-mlx", "cpu"): "b1040-stable",
        },
    )
    assert m["llamacpp"].backends["vulkan"].state is BackendState.INSTALLED
    assert m["llamacpp"].default_backend == "vulkan"
    cpu = m["lemon-mlx"].backends["cpu"]
    assert cpu.state is BackendState.UPDATE_REQUIRED
    assert "b1040-stable" in cpu.message and "b1050-stable" in cpu.message
    assert m["lemon-mlx"].default_backend == "cpu"


def test_system_llama_server() -> None:
    m = matrix("cpu_only_x86", system_binary=SystemBinary("/usr/bin/llama-server", "b9000"))
    system = m["llamacpp"].backends["system"]
    assert (system.state, system.version) == (BackendState.INSTALLED, "b9000")
    assert system.asset is None
    assert m["llamacpp"].default_backend == "system"


def test_release_mirror_replaces_github() -> None:
    m = matrix("cpu_only_x86", release_base="http://127.0.0.1:9999/")
    assert m["llamacpp"].backends["cpu"].url == (
        "http://127.0.0.1:9999/ggml-org/llama.cpp/releases/download/b10375/llama-b10375-bin-ubuntu-x64.tar.gz"
    )


@pytest.mark.parametrize(
    ("tag", "profile", "asset"),
    [
        ("b1033-stable", "strix_halo", "mlx-engine-b1033-stable-ubuntu-rocm-stable-gfx1151-x64.zip"),
        ("b1020-preview", "igpu_plus_rdna4", "mlx-engine-b1020-preview-ubuntu-rocm-preview-gfx120X-x64.zip"),
        ("b1010-stable", "rdna3_radeon_7900", "mlx-engine-b1010-stable-ubuntu-rocm-stable-gfx110X-x64.zip"),
        ("b1034-stable", "strix_halo", "mlx-engine-b1034-stable-ubuntu-rocm-x64.zip"),
        ("b1050-stable", "igpu_plus_rdna4", "mlx-engine-b1050-stable-ubuntu-rocm-x64.zip"),
    ],
)
def test_lemon_mlx_rocm_asset_scheme_follows_the_tag(tag: str, profile: str, asset: str) -> None:
    raw = json.loads(backend_versions_path().read_text())
    raw["recipes"]["lemon-mlx"]["rocm"]["version"] = tag
    hw = hardware_from_json(json.loads(profile_path(profile).read_text()))
    m = support_matrix(hw, parse_backend_versions(raw))
    assert m["lemon-mlx"].backends["rocm"].asset == asset


def test_best_amd_gpu_tie_goes_to_discrete() -> None:
    igpu = AmdGpu("iGPU", "gfx1150", 8, True)
    dgpu = AmdGpu("dGPU", "gfx1201", 8, False)
    assert best_amd_gpu((igpu, dgpu)) == dgpu
    assert best_amd_gpu((dgpu, igpu)) == dgpu
    assert best_amd_gpu(()) is None


def test_backend_key_reads_and_writes_recipe_colon_backend() -> None:
    key = BackendKey.parse("llamacpp:vulkan")
    assert key == BackendKey("llamacpp", "vulkan") and str(key) == "llamacpp:vulkan"
    assert {key: 1}[BackendKey("llamacpp", "vulkan")] == 1  # frozen: usable as a dict key


@pytest.mark.parametrize("text", ["llamacpp", "llamacpp:", ":cpu", ""])
def test_a_malformed_backend_key_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ConfigError, match="does not name a backend") as err:
        BackendKey.parse(text)
    assert err.value.hint == "Write RECIPE:BACKEND, e.g. llamacpp:cpu."
