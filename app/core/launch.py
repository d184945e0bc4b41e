"""How an engine is launched: its command line and environment, per recipe. Pure: no processes here.

Each recipe has a ``Launcher`` in ``LAUNCHERS``; the supervisor calls ``plan_launch`` with a free port
and the path of the per-launch API key file, and runs what comes back.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from app.core.backends import BackendKey
from app.core.errors import ConfigError, UnsupportedError
from app.core.hardware import Hardware
from app.core.lemon_mlx import (
    MLX_LM,
    DeviceType,
    check_no_model_argument,
    device_type,
    hf_cache_env,
    library_path_env,
    mlx_lm_takes_value,
    server_takes_value,
)
from app.core.quirks import Quirk, check_quirk_args

DEFAULT_CTX_SIZE = 4096
MAX_CTX_SIZE = 1 << 24  # tokens: past any model's trained context, and far below where llama-server's
# own reading of --ctx-size (an int) fails with its usage text
AUTO_CTX_SIZE = -1  # Lemonade's "automatic": the engine's own default (a ModelOptions.ctx_size of None)
# amdgpu's 2 s scheduler timeout kills long prefills on Linux Vulkan.
VULKAN_CTX_CAP = 65536


def ctx_size_problem(size: int) -> str | None:
    """Why ``size`` is not a context size as Lemonade's ``ctx_size`` takes one (1 to MAX_CTX_SIZE
    tokens, or -1 for automatic), or None when it is one."""
    if size == AUTO_CTX_SIZE or 0 < size <= MAX_CTX_SIZE:
        return None
    return f"must be a positive number of tokens, at most {MAX_CTX_SIZE:,}, or -1 for automatic"


# What --dry-run shows in place of values that only exist at launch.
PORT_PLACEHOLDER = "<free port per launch>"
KEY_FILE_PLACEHOLDER = "<private key file, random per launch>"

# Variables of the app's environment an engine may need; everything else stays out (tokens, the app's
# own settings, LLAMA_ARG_* that would silently change the engine's arguments).
PASSTHROUGH = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "XDG_RUNTIME_DIR",
        "XDG_CONFIG_DIRS",
        "XDG_DATA_DIRS",  # the Vulkan loader finds its drivers through these
        "LD_LIBRARY_PATH",
    }
)
# On an abort llama.cpp attaches gdb to itself for a backtrace: seconds of delay, and last words that
# are a debugger's instead of llama.cpp's own line saying what failed (a lost RPC worker, say).
QUIET_ABORT = {"GGML_NO_BACKTRACE": "1"}
PASSTHROUGH_PREFIXES = ("LC_", "HIP_", "ROCR_", "HSA_", "ROCM_", "CUDA_", "VK_", "GGML_", "MESA_", "RADV_")


@dataclass(frozen=True)
class LaunchRequest:
    """What to run: an installed (or system) engine binary and a model, with the user's options."""

    recipe: str
    backend: str
    binary: str  # the executable
    library_dir: str  # the unpacked engine folder ("" for a system binary): goes on LD_LIBRARY_PATH
    model: str  # a model file or folder (or, for lemon-mlx, a repo id)
    ctx_size: int | None = None  # None: DEFAULT_CTX_SIZE (lemon-mlx: the engine's own default)
    user_args: tuple[str, ...] = ()
    hf_hub_cache: str = ""  # the app's Hugging Face cache (``hub`` folder), for engines that resolve repo ids
    architecture: str = ""  # the GGUF's general.architecture when known: model quirks key on it
    mmproj: str = ""  # llamacpp: the vision projector file to load beside the model ("" for none)
    alias: str = ""  # llamacpp: the name replies give as their "model" (else the file's path)
    quirks: tuple[Quirk, ...] = ()  # the quirk table (``resources/quirks.json``)
    rpc: tuple[str, ...] = ()  # llama.cpp RPC workers (``host:port``) that hold layers and KV cache
    slot_save_path: str = ""  # llamacpp: the folder slots' KV caches are saved in ("": no saving)

    @property
    def backend_key(self) -> BackendKey:
        return BackendKey(self.recipe, self.backend)


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)  # only the variables the app sets
    api_key_file: str | None = None  # where the engine reads its per-launch key; None: no key
    device: DeviceType = DeviceType.GPU  # where the engine computes (what a per-device load limit counts)


# No engine argument takes a control character, and one holding a NUL cannot even be passed to exec
# (a ValueError at launch). Tab, newline and carriage return are left: between arguments they are
# spaces, and a quoted value (a chat template, say) may hold them.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def split_args(text: str) -> tuple[str, ...]:
    """The user's extra engine arguments, split as a shell would."""
    if control := _CONTROL.search(text):
        raise ConfigError(
            f"The extra engine arguments hold a control character ({control.group()!r}).", "Remove it."
        )
    try:
        return tuple(shlex.split(text))
    except ValueError as err:
        raise ConfigError(
            f"The extra engine arguments cannot be read ({err}).", "Check their quotes."
        ) from None


def check_reserved(args: Sequence[str], reserved: Mapping[str, str]) -> None:
    """Refuse user arguments that repeat a flag the app owns; ``reserved`` maps flag -> what to do."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in reserved:
            raise ConfigError(f"The extra engine argument {flag} is set by Lemon Desk.", reserved[flag])


_REMOVE = "Remove it from the extra arguments."
LLAMACPP_RESERVED: dict[str, str] = {
    **dict.fromkeys(("-m", "--model", "-mu", "--model-url"), "Pick the model itself instead."),
    **dict.fromkeys(("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file"), "Pick the model itself instead."),
    **dict.fromkeys(("-c", "--ctx-size"), "Use the context size option instead."),
    **dict.fromkeys(("-dev", "--device"), _REMOVE),
    **dict.fromkeys(("--host", "--port", "--api-key", "--api-key-file"), _REMOVE),
    **dict.fromkeys(("--jinja", "--no-jinja", "--metrics", "--mmproj", "-mm", "-a", "--alias"), _REMOVE),
    "--rpc": "Use the rpc option (or --rpc on the command line) instead.",
    "--slot-save-path": "Lemon Desk saves conversations' KV caches itself. " + _REMOVE,
}
GPU_LAYERS_FLAGS = ("-ngl", "--gpu-layers", "--n-gpu-layers")
VERBOSITY_FLAGS = ("-lv", "--verbosity", "--log-verbosity", "-v", "--verbose", "--log-verbose")
# The CPU threads each llama-server computes with (unset: llama.cpp's own choice, the physical cores).
# llama.cpp's threads spin while they wait for each other, so when other work keeps the cores busy a
# thread per core can fall to almost nothing: on two cores beside two busy loops, SmolLM2 decoded at
# 0 tok/s with two threads and 26-31 with one. A model's own ``--threads`` still wins (it comes after).
ENGINE_THREADS = "LEMON_DESK_ENGINE_THREADS"


def _given(args: Sequence[str], flags: Sequence[str]) -> bool:
    return any(arg.split("=", 1)[0] in flags for arg in args)


def _value(args: Sequence[str], flags: Sequence[str]) -> str | None:
    """What the last of ``flags`` in ``args`` is given (``-ngl 0`` or ``-ngl=0``), or None."""
    value = None
    for at, arg in enumerate(args):
        flag, equals, rest = arg.partition("=")
        if flag in flags:
            value = rest if equals else (args[at + 1] if at + 1 < len(args) else None)
    return value


def engine_device(req: LaunchRequest, hw: Hardware) -> DeviceType:
    """Where an engine computes, as a per-device load limit counts it. The CPU for the ``cpu`` backend,
    for mlx-lm off macOS, for a llama.cpp told to offload no layer (``-ngl 0``), and for a llama-server of
    the user's own on a machine without a GPU (nothing else it could use); the GPU otherwise."""
    if req.recipe == "llamacpp" and (
        _value(req.user_args, GPU_LAYERS_FLAGS) == "0"
        or (req.backend == "system" and not hw.has_gpu and not req.rpc)
    ):
        return DeviceType.CPU
    return device_type(req.backend, hw.os)


def rpc_args(workers: Sequence[str], user_args: Sequence[str]) -> tuple[str, ...]:
    """``--rpc`` with every layer offloaded (the workers are devices like GPUs: without ``-ngl`` nothing
    would go to them), and a log verbose enough to say where each buffer went; the user's own ``-ngl``
    or verbosity wins."""
    if not workers:
        return ()
    args = ["--rpc", ",".join(workers)]
    if not _given(user_args, GPU_LAYERS_FLAGS):
        args += ["-ngl", "999"]
    if not _given(user_args, VERBOSITY_FLAGS):
        args += ["-lv", "4"]
    return tuple(args)


def library_env(os_name: str, library_dir: str, parent_env: Mapping[str, str]) -> dict[str, str]:
    """llama.cpp's libraries sit beside its programs; Linux needs to be told (macOS builds use rpath)."""
    if os_name != "linux" or not library_dir:
        return {}
    existing = parent_env.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": f"{library_dir}:{existing}" if existing else library_dir}


def engine_threads(parent_env: Mapping[str, str]) -> tuple[str, ...]:
    """``--threads N`` when the app's environment sets ``LEMON_DESK_ENGINE_THREADS``, else nothing."""
    value = parent_env.get(ENGINE_THREADS, "").strip()
    if not value:
        return ()
    if not re.fullmatch(r"[0-9]{1,4}", value) or int(value) < 1:
        raise ConfigError(
            f"{ENGINE_THREADS} is {value!r}, not a number of threads.",
            "Set it to a whole number from 1 to 9999, or unset it to let llama.cpp choose.",
        )
    return ("--threads", str(int(value)))


def llamacpp_plan(
    req: LaunchRequest, hw: Hardware, port: str, key_file: str, parent_env: Mapping[str, str]
) -> LaunchPlan:
    """llama-server's command line in Lemonade's order, then the user's arguments."""
    check_user_args(req.recipe, req.backend, req.user_args)
    ctx = req.ctx_size or DEFAULT_CTX_SIZE
    if req.backend == "vulkan" and hw.os == "linux":
        ctx = min(ctx, VULKAN_CTX_CAP)
    argv = (
        req.binary,
        "-m",
        req.model,
        "--ctx-size",
        str(ctx),
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--jinja",
        "--metrics",
        *(("--slot-save-path", req.slot_save_path) if req.slot_save_path else ()),
        "--api-key-file",
        key_file,
        *(("--mmproj", req.mmproj) if req.mmproj else ()),
        # llama-server splits its aliases at commas: a name with one keeps the default.
        *(("--alias", req.alias) if req.alias and "," not in req.alias else ()),
        *rpc_args(req.rpc, req.user_args),
        *engine_threads(parent_env),
        *req.user_args,
    )
    env = {**library_env(hw.os, req.library_dir, parent_env), **QUIET_ABORT}
    if req.backend == "rocm" and hw.nvidia_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # keep ggml from counting the NVIDIA card in its memory budget
    return LaunchPlan(argv, env, key_file)


LEMON_MLX_RESERVED: dict[str, str] = {
    "--ctx-size": "Use the context size option instead.",
    **dict.fromkeys(("--host", "--port"), _REMOVE),
}
MLX_LM_RESERVED: dict[str, str] = {
    "--model": "Pick the model itself instead.",
    **dict.fromkeys(("--host", "--port"), _REMOVE),
}


def lemon_mlx_plan(
    req: LaunchRequest, hw: Hardware, port: str, key_file: str, parent_env: Mapping[str, str]
) -> LaunchPlan:
    """``server <MODEL> --host 127.0.0.1 --port P [--ctx-size N] <user args>``, or for the mlx-lm
    backend ``python -m mlx_lm server --model MODEL --host 127.0.0.1 --port P <user args>``.

    MODEL is the repo id whenever the model has one, resolved by the engine in the app's HF cache.
    Neither engine takes an API key: like every engine, it listens on loopback only.
    """
    env = hf_cache_env(req.hf_hub_cache) if req.hf_hub_cache else {}
    check_user_args(req.recipe, req.backend, req.user_args)
    if req.backend == MLX_LM:
        argv = (req.binary, "-m", "mlx_lm", "server", "--model", req.model, "--host", "127.0.0.1")
        # The app owns downloads: the Hub client inside mlx-lm only reads the cache.
        env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
        return LaunchPlan((*argv, "--port", port, *req.user_args), env)
    ctx = ("--ctx-size", str(req.ctx_size)) if req.ctx_size else ()
    argv = (req.binary, req.model, "--host", "127.0.0.1", "--port", port, *ctx, *req.user_args)
    if req.library_dir:
        env.update(library_path_env(hw.os, req.library_dir, parent_env))
    return LaunchPlan(argv, env)


def check_user_args(recipe: str, backend: str, args: Sequence[str]) -> None:
    """Refuse extra engine arguments the app owns for this recipe and backend (as the user types them)."""
    if recipe == "llamacpp":
        check_reserved(args, LLAMACPP_RESERVED)
    elif recipe == "lemon-mlx" and backend == MLX_LM:
        check_reserved(args, MLX_LM_RESERVED)
        check_no_model_argument(args, mlx_lm_takes_value)
    elif recipe == "lemon-mlx":
        check_reserved(args, LEMON_MLX_RESERVED)
        check_no_model_argument(args, server_takes_value)


# (request, hardware, port, key file, the app's environment) -> plan
Launcher = Callable[[LaunchRequest, Hardware, str, str, Mapping[str, str]], LaunchPlan]

LAUNCHERS: dict[str, Launcher] = {"llamacpp": llamacpp_plan, "lemon-mlx": lemon_mlx_plan}

# The executable each recipe's release archive holds.
ENGINE_BINARY = {"llamacpp": "llama-server", "lemon-mlx": "server"}


def plan_launch(
    req: LaunchRequest,
    hw: Hardware,
    port: str,
    key_file: str,
    parent_env: Mapping[str, str],
) -> LaunchPlan:
    """The command line and the variables to set for ``req``; ``parent_env`` is the app's environment."""
    plan = LAUNCHERS.get(req.recipe)
    if plan is None:
        raise UnsupportedError(f"This build of Lemon Desk cannot launch {req.recipe} engines yet.")
    check_quirk_args(req.user_args, req.quirks, req.recipe, req.architecture)
    return replace(plan(req, hw, port, key_file, parent_env), device=engine_device(req, hw))


def child_environment(parent_env: Mapping[str, str], plan: LaunchPlan) -> dict[str, str]:
    """The engine's whole environment: what it may need from the app's, then what the app sets."""
    env = {
        name: value
        for name, value in parent_env.items()
        if name in PASSTHROUGH or name.startswith(PASSTHROUGH_PREFIXES)
    }
    env.update(plan.env)
    return env
