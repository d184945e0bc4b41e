"""lemon-mlx launch rules: argv, model argument, library path, HF cache, extra args, device, [TPS]."""

from __future__ import annotations

import json

import pytest

from app.core.errors import ConfigError
from app.core.hardware import Hardware, hardware_from_json
from app.core.launch import LaunchPlan, LaunchRequest, child_environment, plan_launch, split_args
from app.core.lemon_mlx import (
    DeviceType,
    TpsCollector,
    TpsKind,
    TpsLine,
    device_type,
    hf_cache_env,
    parse_tps_line,
)
from app.core.telemetry import Telemetry
from tests.conftest import profile_path

HUB = "/home/u/.local/share/lemon-desk/hf/hub"
ENGINES = "/home/u/.local/share/lemon-desk/engines/lemon-mlx"
REPO = "mlx-community/Qwen3-0.6B-4bit"


def hw(profile: str) -> Hardware:
    return hardware_from_json(json.loads(profile_path(profile).read_text()))


def plan(
    backend: str = "rocm",
    profile: str = "strix_halo",
    extra: str = "",
    parent_env: dict[str, str] | None = None,
    **kw: object,
) -> LaunchPlan:
    folder = f"{ENGINES}/{backend}"
    values: dict[str, object] = {
        "recipe": "lemon-mlx",
        "backend": backend,
        "binary": f"{folder}/bin/python" if backend == "mlx-lm" else f"{folder}/server",
        "library_dir": "" if backend == "mlx-lm" else folder,
        "model": REPO,
        "user_args": split_args(extra),
        "hf_hub_cache": HUB,
        **kw,
    }
    return plan_launch(LaunchRequest(**values), hw(profile), "8123", "<unused>", parent_env or {})  # type: ignore[arg-type]


def test_argv_is_model_first_then_host_port_ctx_then_user_args() -> None:
    p = plan(ctx_size=8192, extra="--max-tokens 512 --no-think")
    assert p.argv == (
        f"{ENGINES}/rocm/server",
        REPO,
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
    assert p.api_key_file is None  # the engine takes no key; it listens on loopback only


def test_no_ctx_size_flag_without_a_context_size() -> None:
    assert "--ctx-size" not in plan().argv


@pytest.mark.parametrize("backend", ["rocm", "cpu"])
def test_every_linux_variant_gets_the_unpacked_folder_on_ld_library_path(backend: str) -> None:
    p = plan(backend=backend)
    assert p.env["LD_LIBRARY_PATH"] == f"{ENGINES}/{backend}"
    assert "DYLD_LIBRARY_PATH" not in p.env


def test_existing_library_path_is_kept_after_the_unpacked_folder() -> None:
    p = plan(parent_env={"LD_LIBRARY_PATH": "/opt/rocm/lib"})
    assert p.env["LD_LIBRARY_PATH"] == f"{ENGINES}/rocm:/opt/rocm/lib"
    assert (
        child_environment({"LD_LIBRARY_PATH": "/opt/rocm/lib"}, p)["LD_LIBRARY_PATH"]
        == p.env["LD_LIBRARY_PATH"]
    )


@pytest.mark.parametrize("backend", ["metal", "cpu"])
def test_macos_uses_dyld_library_path(backend: str) -> None:
    p = plan(backend=backend, profile="apple_silicon", parent_env={"DYLD_LIBRARY_PATH": "/x"})
    assert p.env["DYLD_LIBRARY_PATH"] == f"{ENGINES}/{backend}:/x"
    assert "LD_LIBRARY_PATH" not in p.env


def test_hf_home_points_at_the_apps_cache() -> None:
    env = child_environment({"HF_HOME": "/elsewhere", "HF_TOKEN": "secret"}, plan())
    assert env["HF_HOME"] == "/home/u/.local/share/lemon-desk/hf"
    assert env["HF_HUB_CACHE"] == HUB
    assert "HF_TOKEN" not in env
    # A cache folder not named "hub" is still the cache; HF_HOME is then not guessed.
    assert hf_cache_env("/models") == {"HF_HUB_CACHE": "/models"}


def test_extra_args_are_split_like_a_shell() -> None:
    p = plan(extra="--memory-limit 4096   --kv-bits=8 --temperature '0.7'")
    assert p.argv[6:] == ("--memory-limit", "4096", "--kv-bits=8", "--temperature", "0.7")


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
    with pytest.raises(ConfigError, match=f"argument {flag} is set by Lemon Desk"):
        plan(extra=extra)


def test_a_second_model_in_extra_args_is_refused() -> None:
    with pytest.raises(ConfigError, match="'other/model' would be read as the model"):
        plan(extra="--no-think other/model")
    assert plan(extra="--max-loaded 2").argv[-2:] == ("--max-loaded", "2")  # a flag's value is no model


def test_device_type_gpu_by_default_cpu_for_cpu_backend() -> None:
    assert device_type("rocm", "linux") is DeviceType.GPU
    assert device_type("metal", "macos") is DeviceType.GPU
    assert device_type("cpu", "linux") is DeviceType.CPU
    assert device_type("cpu", "macos") is DeviceType.CPU
    assert device_type("mlx-lm", "linux") is DeviceType.CPU  # mlx[cpu]
    assert device_type("mlx-lm", "macos") is DeviceType.GPU  # Metal


def test_mlx_lm_command() -> None:
    p = plan(backend="mlx-lm", profile="linux_arm64", extra="--temp 0.2 --trust-remote-code", ctx_size=4096)
    assert p.argv == (
        f"{ENGINES}/mlx-lm/bin/python",
        "-m",
        "mlx_lm",
        "server",
        "--model",
        REPO,
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--temp",
        "0.2",
        "--trust-remote-code",
    )
    assert p.env == {
        "HF_HUB_CACHE": HUB,
        "HF_HOME": "/home/u/.local/share/lemon-desk/hf",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    with pytest.raises(ConfigError, match="argument --model is set by Lemon Desk"):
        plan(backend="mlx-lm", extra="--model x")
    with pytest.raises(ConfigError, match="'x' would be read as the model"):
        plan(backend="mlx-lm", extra="--trust-remote-code x")


def test_tps_lines() -> None:
    assert parse_tps_line("[TPS] Prompt: 12 tokens, 340.5 tokens/s, 0.035s") == TpsLine(
        TpsKind.PROMPT, 12, 340.5, 0.035
    )
    assert parse_tps_line("2026-05-01 [info] [TPS] Generation: 64 tokens, 41 tokens/s, 1.55s") == TpsLine(
        TpsKind.GENERATION, 64, 41.0, 1.55
    )
    # b1050-stable prints its summary after one "[TPS] ": the generation line comes without the prefix.
    assert parse_tps_line("[TPS] Prompt:     17 tokens, 1234.56 tokens/s, 0.0137706s") == TpsLine(
        TpsKind.PROMPT, 17, 1234.56, 0.0137706
    )
    assert parse_tps_line("Generation: 9 tokens, 8.5e+03 tokens/s, 1.05e-03s") == TpsLine(
        TpsKind.GENERATION, 9, 8500.0, 0.00105
    )
    assert parse_tps_line("Generation: 0 tokens, inf tokens/s, 0s") is None  # no speed to read
    assert parse_tps_line("a reply said Generation: 9 tokens, 5 tokens/s, 1s") is None  # mid-line, no prefix
    assert parse_tps_line("Loading model mlx-community/Qwen3-0.6B-4bit") is None
    assert parse_tps_line("[TPS] Generation: tokens") is None


def test_tps_lines_replace_the_client_estimates_but_not_ttft() -> None:
    client = Telemetry(ttft_s=0.25, prompt_tokens=0, prompt_tps=0.0, completion_tokens=30, decode_tps=20.0)
    tps = TpsCollector()
    assert tps.apply(client) == client and not tps.complete
    for line in [
        "loading...",
        "[TPS] Prompt: 12 tokens, 340.5 tokens/s, 0.035s",
        "[TPS] Generation: 31 tokens, 41.5 tokens/s, 0.75s",
    ]:
        tps.feed(line)
    assert tps.complete
    assert tps.apply(client) == Telemetry(0.25, 12, 340.5, 31, 41.5)
    tps.reset()
    assert tps.apply(client) == client
