"""Engine command lines and environments: order, reserved flags, what is set and what stays out."""

from __future__ import annotations

import json

import pytest

from app.core.errors import ConfigError, UnsupportedError
from app.core.hardware import Hardware, hardware_from_json
from app.core.launch import (
    DEFAULT_CTX_SIZE,
    ENGINE_THREADS,
    LLAMACPP_RESERVED,
    QUIET_ABORT,
    LaunchRequest,
    child_environment,
    plan_launch,
    split_args,
)
from app.core.lemon_mlx import DeviceType
from tests.conftest import profile_path

ENGINE_DIR = "/home/u/.local/share/lemon-desk/engines/llamacpp/cpu"


def hw(profile: str) -> Hardware:
    return hardware_from_json(json.loads(profile_path(profile).read_text()))


def request(backend: str = "cpu", **kw: object) -> LaunchRequest:
    values: dict[str, object] = {
        "recipe": "llamacpp",
        "backend": backend,
        "binary": f"{ENGINE_DIR}/llama-server",
        "library_dir": ENGINE_DIR,
        "model": "/models/smol.gguf",
        **kw,
    }
    return LaunchRequest(**values)  # type: ignore[arg-type]


def test_llamacpp_arguments_in_order_with_user_args_last() -> None:
    req = request(ctx_size=8192, user_args=("--threads", "2", "-ngl", "99"))
    plan = plan_launch(req, hw("cpu_only_x86"), "41234", "/run/key", {})
    assert plan.argv == (
        f"{ENGINE_DIR}/llama-server",
        "-m",
        "/models/smol.gguf",
        "--ctx-size",
        "8192",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "--jinja",
        "--metrics",
        "--api-key-file",
        "/run/key",
        "--threads",
        "2",
        "-ngl",
        "99",
    )
    assert plan.api_key_file == "/run/key"


def test_the_environments_engine_threads_come_before_the_models_own() -> None:
    env = {ENGINE_THREADS: "1"}
    argv = plan_launch(request(), hw("cpu_only_x86"), "1", "k", env).argv
    assert argv[-2:] == ("--threads", "1")
    own = plan_launch(request(user_args=("--threads", "2")), hw("cpu_only_x86"), "1", "k", env).argv
    assert own[-4:] == ("--threads", "1", "--threads", "2")  # llama-server takes the last one
    assert "--threads" not in plan_launch(request(), hw("cpu_only_x86"), "1", "k", {ENGINE_THREADS: " "}).argv


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5", "\u00b2", "9" * 30])
def test_engine_threads_that_are_no_number_of_threads_are_refused_saying_so(value: str) -> None:
    with pytest.raises(ConfigError, match=f"{ENGINE_THREADS} is '{value}'") as caught:
        plan_launch(request(), hw("cpu_only_x86"), "1", "k", {ENGINE_THREADS: value})
    assert "whole number" in str(caught.value.hint)


def test_default_context_size_and_vulkan_cap() -> None:
    plan = plan_launch(request(), hw("cpu_only_x86"), "1", "k", {})
    assert plan.argv[plan.argv.index("--ctx-size") + 1] == str(DEFAULT_CTX_SIZE)
    vulkan = plan_launch(request("vulkan", ctx_size=131072), hw("rdna3_radeon_7900"), "1", "k", {})
    assert vulkan.argv[vulkan.argv.index("--ctx-size") + 1] == "65536"
    rocm = plan_launch(request("rocm", ctx_size=131072), hw("rdna3_radeon_7900"), "1", "k", {})
    assert rocm.argv[rocm.argv.index("--ctx-size") + 1] == "131072"


def test_the_model_name_and_projector_come_before_the_user_args() -> None:
    req = request(mmproj="/models/mmproj-f16.gguf", alias="user.Vision-GGUF", user_args=("-t", "2"))
    argv = plan_launch(req, hw("cpu_only_x86"), "1", "k", {}).argv
    assert argv[argv.index("--api-key-file") + 2 :] == (
        "--mmproj",
        "/models/mmproj-f16.gguf",
        "--alias",
        "user.Vision-GGUF",
        "-t",
        "2",
    )
    # llama-server reads commas as several aliases: such a name keeps llama-server's default.
    assert "--alias" not in plan_launch(request(alias="a,b"), hw("cpu_only_x86"), "1", "k", {}).argv


def test_the_slot_save_folder_follows_the_apps_flags_and_only_when_asked() -> None:
    req = request(slot_save_path="/home/u/.local/share/lemon-desk/kvcache", user_args=("-t", "2"))
    argv = plan_launch(req, hw("cpu_only_x86"), "1", "k", {}).argv
    at = argv.index("--slot-save-path")
    assert argv[at - 1 : at + 3] == ("--metrics", "--slot-save-path", req.slot_save_path, "--api-key-file")
    assert argv[-2:] == ("-t", "2")
    assert "--slot-save-path" not in plan_launch(request(), hw("cpu_only_x86"), "1", "k", {}).argv


@pytest.mark.parametrize(
    ("user_args", "flag"),
    [
        (("-m", "/other.gguf"), "-m"),
        (("--model=/other.gguf",), "--model"),
        (("-c", "2048"), "-c"),
        (("--ctx-size", "2048"), "--ctx-size"),
        (("--port", "80"), "--port"),
        (("--host", "0.0.0.0"), "--host"),
        (("--api-key", "x"), "--api-key"),
        (("--api-key-file=/tmp/k",), "--api-key-file"),
        (("--threads", "4", "--no-jinja"), "--no-jinja"),
        (("-hf", "org/repo"), "-hf"),
        (("-dev", "Vulkan0"), "-dev"),
        (("--mmproj", "x.gguf"), "--mmproj"),
        (("--alias", "other"), "--alias"),
        (("--metrics",), "--metrics"),
        (("--slot-save-path", "/tmp"), "--slot-save-path"),
    ],
)
def test_reserved_flags_are_refused_by_name(user_args: tuple[str, ...], flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan_launch(request(user_args=user_args), hw("cpu_only_x86"), "1", "k", {})
    assert f"argument {flag} is set by Lemon Desk" in str(err.value)
    assert err.value.hint == LLAMACPP_RESERVED[flag]


def test_flags_that_only_look_alike_pass() -> None:
    args = ("--ctx-checkpoints", "2", "--port-file", "x", "--model-draft", "d.gguf", "--host-buffer")
    plan = plan_launch(request(user_args=args), hw("cpu_only_x86"), "1", "k", {})
    assert plan.argv[-len(args) :] == args


def test_split_args_like_a_shell() -> None:
    assert split_args("--threads 4 --chat-template-kwargs '{\"a\": 1}'") == (
        "--threads",
        "4",
        "--chat-template-kwargs",
        '{"a": 1}',
    )
    with pytest.raises(ConfigError, match="cannot be read"):
        split_args("--alias 'unclosed")


def test_library_path_on_linux_prepends_the_engine_folder() -> None:
    alone = plan_launch(request(), hw("cpu_only_x86"), "1", "k", {})
    assert alone.env == {"LD_LIBRARY_PATH": ENGINE_DIR, **QUIET_ABORT}
    joined = plan_launch(request(), hw("cpu_only_x86"), "1", "k", {"LD_LIBRARY_PATH": "/opt/rocm/lib"})
    assert joined.env == {"LD_LIBRARY_PATH": f"{ENGINE_DIR}:/opt/rocm/lib", **QUIET_ABORT}


def test_no_library_path_for_a_system_binary_or_on_macos() -> None:
    system = request("system", binary="/usr/bin/llama-server", library_dir="")
    assert plan_launch(system, hw("cpu_only_x86"), "1", "k", {}).env == QUIET_ABORT
    assert plan_launch(request("metal"), hw("apple_silicon"), "1", "k", {}).env == QUIET_ABORT


def test_rocm_on_a_hybrid_host_hides_the_nvidia_gpu() -> None:
    plan = plan_launch(request("rocm"), hw("amd_nvidia_hybrid"), "1", "k", {"CUDA_VISIBLE_DEVICES": "0"})
    assert plan.env["CUDA_VISIBLE_DEVICES"] == ""
    assert child_environment({"CUDA_VISIBLE_DEVICES": "0"}, plan)["CUDA_VISIBLE_DEVICES"] == ""


def test_cuda_visibility_untouched_elsewhere() -> None:
    cases = (("rocm", "strix_halo"), ("cuda", "amd_nvidia_hybrid"), ("cpu", "amd_nvidia_hybrid"))
    for backend, profile in cases:
        assert "CUDA_VISIBLE_DEVICES" not in plan_launch(request(backend), hw(profile), "1", "k", {}).env


def test_child_environment_lets_nothing_else_leak_in() -> None:
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HSA_OVERRIDE_GFX_VERSION": "11.0.0",
        "HIP_VISIBLE_DEVICES": "1",
        "GGML_VK_VISIBLE_DEVICES": "0",
        "XDG_DATA_DIRS": "/usr/share",
        "HF_TOKEN": "hf_secret",
        "OPENAI_API_KEY": "sk-secret",
        "LLAMA_API_KEY": "other-key",
        "LLAMA_ARG_HOST": "0.0.0.0",
        "LEMON_DESK_HOME": "/home/u/lemon",
        "AWS_SECRET_ACCESS_KEY": "x",
        "PYTHONPATH": "/src",
        "QT_QPA_PLATFORM": "offscreen",
    }
    plan = plan_launch(request(), hw("cpu_only_x86"), "1", "k", parent)
    assert child_environment(parent, plan) == {
        "PATH": "/usr/bin",
        "HOME": "/home/u",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HSA_OVERRIDE_GFX_VERSION": "11.0.0",
        "HIP_VISIBLE_DEVICES": "1",
        "GGML_VK_VISIBLE_DEVICES": "0",
        "XDG_DATA_DIRS": "/usr/share",
        "LD_LIBRARY_PATH": ENGINE_DIR,
        **QUIET_ABORT,
    }


def test_a_recipe_without_a_launcher_is_refused_clearly() -> None:
    req = request(recipe="no-such-engine")
    with pytest.raises(UnsupportedError, match="cannot launch no-such-engine engines"):
        plan_launch(req, hw("cpu_only_x86"), "1", "k", {})


def test_rpc_workers_get_every_layer_and_a_log_that_says_where_memory_went() -> None:
    plan = plan_launch(request(rpc=("10.0.0.2:50052", "10.0.0.3:50052")), hw("cpu_only_x86"), "1", "k", {})
    rpc_at = plan.argv.index("--rpc")
    assert plan.argv[rpc_at : rpc_at + 6] == (
        "--rpc",
        "10.0.0.2:50052,10.0.0.3:50052",
        "-ngl",
        "999",
        "-lv",
        "4",
    )


def test_the_users_gpu_layers_and_verbosity_win_over_the_rpc_defaults() -> None:
    req = request(rpc=("10.0.0.2:50052",), user_args=("--n-gpu-layers=20", "-lv", "3"))
    argv = plan_launch(req, hw("cpu_only_x86"), "1", "k", {}).argv
    assert "-ngl" not in argv and argv.count("-lv") == 1 and "--n-gpu-layers=20" in argv


def test_no_rpc_arguments_without_workers() -> None:
    argv = plan_launch(request(), hw("cpu_only_x86"), "1", "k", {}).argv
    assert "--rpc" not in argv and "-ngl" not in argv and "-lv" not in argv


def test_rpc_in_the_extra_arguments_is_refused() -> None:
    with pytest.raises(ConfigError, match="rpc option"):
        plan_launch(request(user_args=("--rpc", "1.2.3.4:5")), hw("cpu_only_x86"), "1", "k", {})


@pytest.mark.parametrize(
    ("backend", "profile", "extra", "device"),
    [
        ("cpu", "nvidia", "", DeviceType.CPU),
        ("vulkan", "rdna3_radeon_7900", "", DeviceType.GPU),
        ("vulkan", "rdna3_radeon_7900", "-ngl 0", DeviceType.CPU),
        ("cuda", "nvidia", "--n-gpu-layers=0", DeviceType.CPU),
        ("cuda", "nvidia", "-ngl 0 -ngl 99", DeviceType.GPU),  # the last one given wins, as in llama.cpp
        ("system", "cpu_only_x86", "", DeviceType.CPU),  # nothing else it could compute on
        ("system", "nvidia", "", DeviceType.GPU),
    ],
)
def test_the_device_a_load_limit_counts(backend: str, profile: str, extra: str, device: DeviceType) -> None:
    req = request(backend, user_args=split_args(extra))
    assert plan_launch(req, hw(profile), "8080", "/k", {}).device is device
