"""lemon-mlx launch rules: argv, model argument, library path, HF cache, extra args, device, [TPS]."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.errors import ConfigError, ModelError
from app.core.lemon_mlx import (
    DeviceType,
    TpsKind,
    TpsLine,
    device_type,
    hf_cache_env,
    lemon_mlx_command,
    mlx_lm_command,
    model_argument,
    parse_tps_line,
)
from app.core.models import Model

HUB = "/home/u/.local/share/lemon-desk/hf/hub"


def command(**kw: Any) -> Any:
    args: dict[str, Any] = {
        "server": "/e/lemon-mlx/rocm/server",
        "folder": "/e/lemon-mlx/rocm",
        "backend": "rocm",
        "os_name": "linux",
        "model_arg": "mlx-community/Qwen3-0.6B-4bit",
        "port": 8123,
        "ctx_size": None,
        "extra_args": "",
        "hub_cache": HUB,
        "environ": {},
    }
    return lemon_mlx_command(**{**args, **kw})


def test_argv_is_model_first_then_host_port_ctx_then_user_args() -> None:
    cmd = command(ctx_size=8192, extra_args="--max-tokens 512 --no-think")
    assert cmd.argv == (
        "/e/lemon-mlx/rocm/server",
        "mlx-community/Qwen3-0.6B-4bit",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--ctx-size",
        "8192",
        "--max-tokens",
        "512",
        "--no-think",
    )
    assert cmd.model_arg == "mlx-community/Qwen3-0.6B-4bit"


def test_no_ctx_size_flag_without_a_context_size() -> None:
    assert "--ctx-size" not in command().argv


def test_model_argument_prefers_the_repo_id_over_a_local_folder() -> None:
    catalog = Model("Qwen3-0.6B-MLX", "lemon-mlx", "mlx-community/Qwen3-0.6B-4bit")
    assert model_argument(
        catalog.repo_id, "/hf/hub/models--mlx-community--Qwen3-0.6B-4bit/snapshots/abc"
    ) == ("mlx-community/Qwen3-0.6B-4bit")
    imported = Model("mine", "lemon-mlx", "/data/my-mlx-model", user=True)
    assert model_argument(imported.repo_id, "/data/my-mlx-model") == "/data/my-mlx-model"
    with pytest.raises(ModelError):
        model_argument(None, None)


@pytest.mark.parametrize("backend", ["rocm", "cpu"])
def test_every_linux_variant_gets_the_unpacked_folder_on_ld_library_path(backend: str) -> None:
    cmd = command(backend=backend, folder=f"/e/lemon-mlx/{backend}", environ={})
    assert cmd.env["LD_LIBRARY_PATH"] == f"/e/lemon-mlx/{backend}"
    assert "DYLD_LIBRARY_PATH" not in cmd.env


def test_existing_library_path_is_kept_after_the_unpacked_folder() -> None:
    cmd = command(environ={"LD_LIBRARY_PATH": "/opt/rocm/lib"})
    assert cmd.env["LD_LIBRARY_PATH"] == "/e/lemon-mlx/rocm:/opt/rocm/lib"


def test_macos_uses_dyld_library_path() -> None:
    cmd = command(
        os_name="macos", backend="metal", folder="/e/lemon-mlx/metal", environ={"DYLD_LIBRARY_PATH": "/x"}
    )
    assert cmd.env["DYLD_LIBRARY_PATH"] == "/e/lemon-mlx/metal:/x"
    assert "LD_LIBRARY_PATH" not in cmd.env


def test_hf_home_points_at_the_apps_cache() -> None:
    assert command().env["HF_HOME"] == "/home/u/.local/share/lemon-desk/hf"
    assert command().env["HF_HUB_CACHE"] == HUB
    # A hub folder not named "hub" is still the cache; HF_HOME is then left to the user.
    assert hf_cache_env("/models") == {"HF_HUB_CACHE": "/models"}


def test_extra_args_are_split_like_a_shell() -> None:
    cmd = command(extra_args="--memory-limit 4096   --kv-bits=8 --temperature '0.7'")
    assert cmd.argv[6:] == ("--memory-limit", "4096", "--kv-bits=8", "--temperature", "0.7")


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        ("--port 9000", "--port"),
        ("--host 0.0.0.0", "--host"),
        ("--host=0.0.0.0", "--host"),
        ("--ctx-size 4096", "--ctx-size"),
        ("--no-think --port=1", "--port"),
    ],
)
def test_app_owned_flags_are_refused_by_name(extra: str, flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        command(extra_args=extra)
    assert f"lemon_mlx_args may not set {flag}" in str(err.value)


def test_a_second_model_in_extra_args_is_refused() -> None:
    with pytest.raises(ConfigError, match="would read as the model"):
        command(extra_args="--no-think other/model")
    # A flag's value is not a model.
    assert command(extra_args="--max-loaded 2").argv[-2:] == ("--max-loaded", "2")


def test_unbalanced_quotes_say_so() -> None:
    with pytest.raises(ConfigError, match="cannot be split"):
        command(extra_args="--temperature '0.7")


def test_device_type_gpu_by_default_cpu_for_cpu_backend() -> None:
    assert command(backend="rocm").device is DeviceType.GPU
    assert command(os_name="macos", backend="metal").device is DeviceType.GPU
    assert command(backend="cpu").device is DeviceType.CPU
    assert device_type("mlx-lm", "linux") is DeviceType.CPU  # mlx[cpu]
    assert device_type("mlx-lm", "macos") is DeviceType.GPU  # Metal


def test_mlx_lm_command() -> None:
    cmd = mlx_lm_command(
        python="/e/lemon-mlx/mlx-lm/bin/python",
        os_name="linux",
        model_arg="mlx-community/Qwen3-0.6B-4bit",
        port=8200,
        extra_args="--temp 0.2 --trust-remote-code",
        hub_cache=HUB,
    )
    assert cmd.argv == (
        "/e/lemon-mlx/mlx-lm/bin/python",
        "-m",
        "mlx_lm",
        "server",
        "--model",
        "mlx-community/Qwen3-0.6B-4bit",
        "--host",
        "127.0.0.1",
        "--port",
        "8200",
        "--temp",
        "0.2",
        "--trust-remote-code",
    )
    assert cmd.env["HF_HUB_CACHE"] == HUB and cmd.env["HF_HUB_OFFLINE"] == "1"
    with pytest.raises(ConfigError, match="may not set --model"):
        mlx_lm_command(
            python="p", os_name="linux", model_arg="m", port=1, extra_args="--model x", hub_cache=HUB
        )


def test_tps_lines() -> None:
    assert parse_tps_line("[TPS] Prompt: 12 tokens, 340.5 tokens/s, 0.035s") == TpsLine(
        TpsKind.PROMPT, 12, 340.5, 0.035
    )
    assert parse_tps_line("2026-05-01 [info] [TPS] Generation: 64 tokens, 41 tokens/s, 1.55s") == TpsLine(
        TpsKind.GENERATION, 64, 41.0, 1.55
    )
    assert parse_tps_line("Loading model mlx-community/Qwen3-0.6B-4bit") is None
    assert parse_tps_line("[TPS] Generation: tokens") is None
