"""How the lemon-mlx recipe is launched and what its engines print: pure rules, no I/O.

Two engines serve the recipe: lemon-mlx's release ``server`` binary (backends metal, rocm, cpu) and
PyPI's mlx-lm server in a virtual environment the app manages (backend ``mlx-lm``). Facts behind each
rule are in reference/lemon-mlx-engine.md and the seed change (reference/seed-lemon-mlx-pr.txt).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import PurePath

from app.core.errors import ConfigError, ModelError

HOST = "127.0.0.1"
MLX_LM = "mlx-lm"

# Flags of lemon-mlx's ``server`` that take a value; the others (--no-think, ...) are switches.
SERVER_VALUE_FLAGS = frozenset(
    {
        "--host",
        "--port",
        "--max-tokens",
        "--temperature",
        "--top-p",
        "--repetition-penalty",
        "--memory-limit",
        "--max-loaded",
        "--kv-bits",
        "--kv-group-size",
        "--ctx-size",
        "--n-draft-tokens",
    }
)
# What the app sets itself; a user's extra args may not: the app would lose track of its engine.
SERVER_OWNED_FLAGS = ("--host", "--port", "--ctx-size")
MLX_LM_OWNED_FLAGS = ("--model", "--host", "--port")
# mlx-lm's switches; every other flag of its server takes a value.
MLX_LM_SWITCHES = frozenset(
    {"--trust-remote-code", "--use-default-chat-template", "--pipeline", "-h", "--help"}
)


class DeviceType(Enum):
    GPU = "gpu"  # the engine computes on a GPU (Metal, ROCm)
    CPU = "cpu"  # the engine computes on the CPU


@dataclass(frozen=True)
class EngineCommand:
    """A ready-to-run engine: argv, the variables to set on top of the app's environment, device."""

    argv: tuple[str, ...]
    env: dict[str, str]
    device: DeviceType
    model_arg: str  # the model as the engine was given it; requests name it so


def device_type(backend: str, os_name: str) -> DeviceType:
    """GPU by default; CPU for the ``cpu`` backend and for mlx-lm on Linux (``mlx[cpu]``)."""
    if backend == "cpu" or (backend == MLX_LM and os_name != "macos"):
        return DeviceType.CPU
    return DeviceType.GPU


def model_argument(repo_id: str | None, local_dir: str | None) -> str:
    """The repo id whenever there is one (the engine resolves it in the HF cache), else the folder.

    lemon-mlx URL-joins its argument onto the Hub API, so a path that is not a model folder turns
    into a 404; a repo id resolves offline from the cache ``HF_HOME`` points at.
    """
    if repo_id:
        return repo_id
    if local_dir:
        return local_dir
    raise ModelError("This MLX model has neither a Hugging Face repo id nor a local folder.")


def split_extra_args(
    text: str,
    owned: Collection[str],
    takes_value: Callable[[str], bool],
    option: str = "lemon_mlx_args",
) -> list[str]:
    """Split extra engine args as a shell would; refuse flags the app owns and a stray model argument."""
    try:
        tokens = shlex.split(text)
    except ValueError as err:
        raise ConfigError(f"{option} cannot be split ({err}).", "Check its quotes.") from None
    expects_value = False
    for token in tokens:
        if expects_value:
            expects_value = False
            continue
        if not token.startswith("-"):
            raise ConfigError(
                f"{option} holds '{token}', which the engine would read as the model.",
                "The app passes the model itself; remove it.",
            )
        flag, has_inline_value = token.split("=", 1)[0], "=" in token
        if flag in owned:
            raise ConfigError(
                f"{option} may not set {flag}: the app sets it.",
                "Remove it; use the model's options (such as context size) where there is one.",
            )
        expects_value = takes_value(flag) and not has_inline_value
    return tokens


def _server_takes_value(flag: str) -> bool:
    return flag in SERVER_VALUE_FLAGS


def _mlx_lm_takes_value(flag: str) -> bool:
    return flag not in MLX_LM_SWITCHES


def library_path_env(os_name: str, folder: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The unpacked folder first on the loader path: the binaries have no RUNPATH.

    Every Linux variant needs it (the cpu asset bundles libopenblas, liblapacke, libgfortran and
    exits 127 without it); macOS's loader reads ``DYLD_LIBRARY_PATH``.
    """
    var = "DYLD_LIBRARY_PATH" if os_name == "macos" else "LD_LIBRARY_PATH"
    existing = environ.get(var, "")
    return {var: f"{folder}:{existing}" if existing else folder}


def hf_cache_env(hub_cache: str) -> dict[str, str]:
    """Point the engine at the app's Hugging Face cache (the ``hub`` folder)."""
    env = {"HF_HUB_CACHE": hub_cache}
    path = PurePath(hub_cache)
    if path.name == "hub":  # the usual layout: $HF_HOME/hub, so tools that read only HF_HOME agree
        env["HF_HOME"] = str(path.parent)
    return env


def lemon_mlx_command(
    *,
    server: str,
    folder: str,
    backend: str,
    os_name: str,
    model_arg: str,
    port: int,
    ctx_size: int | None,
    extra_args: str,
    hub_cache: str,
    environ: Mapping[str, str],
) -> EngineCommand:
    """``server <MODEL> --host 127.0.0.1 --port P [--ctx-size N] <user args>``."""
    argv = [server, model_arg, "--host", HOST, "--port", str(port)]
    if ctx_size:
        argv += ["--ctx-size", str(ctx_size)]
    argv += split_extra_args(extra_args, SERVER_OWNED_FLAGS, _server_takes_value)
    env = {**hf_cache_env(hub_cache), **library_path_env(os_name, folder, environ)}
    return EngineCommand(tuple(argv), env, device_type(backend, os_name), model_arg)


def mlx_lm_command(
    *,
    python: str,
    os_name: str,
    model_arg: str,
    port: int,
    extra_args: str,
    hub_cache: str,
) -> EngineCommand:
    """``python -m mlx_lm server --model MODEL --host 127.0.0.1 --port P <user args>``.

    mlx-lm has no context-size flag: it grows its cache as needed. The app owns downloads, so the
    Hub client inside mlx-lm works offline from the app's cache.
    """
    argv = [python, "-m", "mlx_lm", "server", "--model", model_arg, "--host", HOST, "--port", str(port)]
    argv += split_extra_args(extra_args, MLX_LM_OWNED_FLAGS, _mlx_lm_takes_value)
    env = {**hf_cache_env(hub_cache), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return EngineCommand(tuple(argv), env, device_type(MLX_LM, os_name), model_arg)


# lemon-mlx prints per-request speed to stderr only, e.g.
# "[TPS] Prompt: 12 tokens, 340.5 tokens/s, 0.035s" and "[TPS] Generation: 64 tokens, 41.2 tokens/s, 1.55s".
_TPS = re.compile(
    r"\[TPS\]\s*(?P<kind>Prompt|Generation):\s*(?P<tokens>\d+)\s*tokens,\s*"
    r"(?P<tps>\d+(?:\.\d+)?)\s*tokens/s,\s*(?P<secs>\d+(?:\.\d+)?)\s*s"
)


class TpsKind(Enum):
    PROMPT = "Prompt"  # prompt processing (prefill)
    GENERATION = "Generation"  # token generation (decode)


@dataclass(frozen=True)
class TpsLine:
    kind: TpsKind
    tokens: int
    tokens_per_s: float
    seconds: float


def parse_tps_line(line: str) -> TpsLine | None:
    """A ``[TPS]`` line of lemon-mlx's stderr, or None for any other line."""
    match = _TPS.search(line)
    if match is None:
        return None
    return TpsLine(TpsKind(match["kind"]), int(match["tokens"]), float(match["tps"]), float(match["secs"]))
