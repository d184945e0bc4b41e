"""How the lemon-mlx recipe is launched and what its engines print: pure rules, no I/O.

Two engines serve the recipe: lemon-mlx's release ``server`` binary (backends metal, rocm, cpu) and
PyPI's mlx-lm server in a virtual environment the app manages (backend ``mlx-lm``). Facts behind each
rule are in reference/lemon-mlx-engine.md and the seed change (reference/seed-lemon-mlx-pr.txt).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import PurePath

from app.core.errors import ConfigError
from app.core.telemetry import Telemetry

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
# mlx-lm's switches; every other flag of its server takes a value.
MLX_LM_SWITCHES = frozenset(
    {"--trust-remote-code", "--use-default-chat-template", "--pipeline", "-h", "--help"}
)


class DeviceType(Enum):
    GPU = "gpu"  # the engine computes on a GPU (Metal, ROCm)
    CPU = "cpu"  # the engine computes on the CPU


def device_type(backend: str, os_name: str) -> DeviceType:
    """GPU by default; CPU for the ``cpu`` backend and for mlx-lm on Linux (``mlx[cpu]``)."""
    if backend == "cpu" or (backend == MLX_LM and os_name != "macos"):
        return DeviceType.CPU
    return DeviceType.GPU


def check_no_model_argument(args: Sequence[str], takes_value: Callable[[str], bool]) -> None:
    """Refuse a bare word in the extra args: the engine would take it for a second model."""
    expects_value = False
    for arg in args:
        if expects_value:
            expects_value = False
        elif not arg.startswith("-"):
            raise ConfigError(
                f"The extra engine argument '{arg}' would be read as the model.",
                "Lemon Desk passes the model itself; remove it.",
            )
        else:
            expects_value = "=" not in arg and takes_value(arg)


def server_takes_value(flag: str) -> bool:
    return flag in SERVER_VALUE_FLAGS


def mlx_lm_takes_value(flag: str) -> bool:
    return flag not in MLX_LM_SWITCHES


def library_path_env(os_name: str, folder: str, parent_env: Mapping[str, str]) -> dict[str, str]:
    """The unpacked folder first on the loader path: the binaries have no RUNPATH.

    Every Linux variant needs it (the cpu asset bundles libopenblas, liblapacke, libgfortran and
    exits 127 without it); macOS's loader reads ``DYLD_LIBRARY_PATH``.
    """
    var = "DYLD_LIBRARY_PATH" if os_name == "macos" else "LD_LIBRARY_PATH"
    existing = parent_env.get(var, "")
    return {var: f"{folder}:{existing}" if existing else folder}


def hf_cache_env(hub_cache: str) -> dict[str, str]:
    """Point the engine at the app's Hugging Face cache (the ``hub`` folder)."""
    env = {"HF_HUB_CACHE": hub_cache}
    path = PurePath(hub_cache)
    if path.name == "hub":  # the usual layout: $HF_HOME/hub, so tools that read only HF_HOME agree
        env["HF_HOME"] = str(path.parent)
    return env


# lemon-mlx prints per-request speed to stderr only, as one block of two lines whose first alone has
# the prefix (b1050-stable: "[TPS] " + a summary holding a newline):
#   "[TPS] Prompt:     12 tokens, 340.5 tokens/s, 0.035s"
#   "Generation: 64 tokens, 41.2 tokens/s, 1.55s"
# Either line may come with the prefix (after anything, such as a log's timestamp) or start without it.
# C++ streams print a tiny double as "1.2e-05": read too. A speed divided by zero prints "inf": such a
# line is not read (the client's own figures stay).
_NUMBER = r"\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
_TPS = re.compile(
    r"(?:^\s*|\[TPS\]\s*)(?P<kind>Prompt|Generation):\s*(?P<tokens>\d+)\s*tokens,\s*"
    rf"(?P<tps>{_NUMBER})\s*tokens/s,\s*(?P<secs>{_NUMBER})\s*s\s*$"
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
    """A speed line of lemon-mlx's stderr (``[TPS] Prompt: ...`` or ``Generation: ...``), or None for
    any other line."""
    match = _TPS.search(line)
    if match is None:
        return None
    return TpsLine(TpsKind(match["kind"]), int(match["tokens"]), float(match["tps"]), float(match["secs"]))


class TpsCollector:
    """The ``[TPS]`` lines of one request, fed from the engine's stderr as they come.

    lemon-mlx sends no usage or timings in its stream; these lines are its own measurements, so they
    replace the client's estimates. Time to first token stays the client's.
    """

    def __init__(self) -> None:
        self.prompt: TpsLine | None = None
        self.generation: TpsLine | None = None

    def reset(self) -> None:
        """Forget the previous request's lines (call as a request starts)."""
        self.prompt = self.generation = None

    def feed(self, line: str) -> None:
        tps = parse_tps_line(line)
        if tps is None:
            return
        if tps.kind is TpsKind.PROMPT:
            self.prompt = tps
        else:
            self.generation = tps

    @property
    def complete(self) -> bool:
        return self.generation is not None

    def apply(self, telemetry: Telemetry) -> Telemetry:
        if self.prompt is not None:
            telemetry = replace(
                telemetry, prompt_tokens=self.prompt.tokens, prompt_tps=self.prompt.tokens_per_s
            )
        if self.generation is not None:
            telemetry = replace(
                telemetry,
                completion_tokens=self.generation.tokens,
                decode_tps=self.generation.tokens_per_s,
            )
        return telemetry
