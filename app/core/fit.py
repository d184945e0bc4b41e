"""Will a model fit? Memory for weights plus KV cache at a context size, against what the machine has.

need = weights (the files' size)
     + KV cache: context x sum over layers of kv_heads x (key_dim + value_dim) x 2 bytes (f16 K and V)
     + compute buffers: n_ubatch x (2 bytes x context [attention mask] + COMPUTE_BYTES_PER_EMBD x n_embd)
     + a fixed runtime allowance per engine (the process, its libraries, the server's buffers)
The compute term follows what llama.cpp's scheduler reserves at its default micro-batch (512).
Sliding-window and latent-attention caches are counted as full ones: the estimate errs high there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from app.core.errors import FitError, ModelError
from app.core.hardware import Hardware
from app.core.matrix import best_amd_gpu
from app.core.numbers import finite
from app.core.refs import MLX_RECIPE, RepoFile
from app.core.units import GB

MIB = 1 << 20
DEFAULT_CONTEXT = 4096
KV_BYTES = 2  # f16 cache entries, the engines' default
UBATCH = 512  # llama.cpp's default micro-batch
COMPUTE_BYTES_PER_EMBD = 52
RUNTIME_BYTES = {"llamacpp": 32 * MIB, "lemon-mlx": 128 * MIB}
FITS_SHARE = 0.8  # leave a fifth of the memory to the system and other apps
UNIFIED_GPU_SHARE = 0.75  # what a GPU may take of unified memory (macOS's default wired limit)
SMALL_MAC_GPU_SHARE = 2 / 3  # ... on Macs with 36 GB or less
CONTEXT_STEP = 256
# Bounds for a header's or config's numbers, far past any real model (Llama 3.1 405B has 126 layers,
# contexts reach millions of tokens): past them a number is damaged or hostile, and a per-layer list of
# 2**62 entries would exhaust memory.
LAYERS_MAX = 10_000
DIM_MAX = 1 << 32


class Verdict(Enum):
    FITS = "fits"  # room to spare
    TIGHT = "tight"  # fits only by crowding other apps out, or by spilling from VRAM into RAM
    WONT_FIT = "won't fit"  # more than the machine has


class MemoryKind(Enum):
    RAM = "RAM"  # system memory, CPU inference
    VRAM = "VRAM"  # a discrete GPU's own memory
    UNIFIED = "unified memory"  # one pool shared by CPU and GPU (Apple Silicon, AMD APUs)


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache and the compute buffers depend on."""

    architecture: str
    layers: int
    embedding: int
    kv_elements_per_token: int  # sum over layers of kv_heads x (key_dim + value_dim)
    context_train: int

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_elements_per_token * KV_BYTES


# A model whose header has not been read: weights and runtime only, so its estimate is a lower bound.
SIZE_ONLY = ModelShape("unknown", 0, 0, 0, 0)


@dataclass(frozen=True)
class MemoryBudget:
    kind: MemoryKind
    usable: int  # bytes the engine may use
    spill: int = 0  # system RAM that can hold what does not fit in VRAM (partial offload)
    device: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "usable_bytes": self.usable,
            "spill_bytes": self.spill,
            "device": self.device,
        }


@dataclass(frozen=True)
class FitEstimate:
    verdict: Verdict
    context: int
    weights: int
    kv_cache: int
    overhead: int
    budget: MemoryBudget
    max_context: int | None  # the largest context that still "fits"; None if none does

    @property
    def need(self) -> int:
        return self.weights + self.kv_cache + self.overhead

    def summary(self) -> str:
        where = f"{self.budget.kind.value}" + (f" ({self.budget.device})" if self.budget.device else "")
        text = (
            f"{self.verdict.value}: needs {_gb(self.need)} (weights {_gb(self.weights)} + KV cache "
            f"{_gb(self.kv_cache)} at {self.context:,} tokens + overhead {_gb(self.overhead)}) "
            f"of {_gb(self.budget.usable)} {where}"
        )
        if self.verdict is Verdict.TIGHT and self.need > self.budget.usable:
            text += "; the rest spills into system RAM, which is slower"
        if self.max_context is None:
            return text + "; no context size fits"
        return text + f"; largest context that fits: {self.max_context:,}"

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "context": self.context,
            "need_bytes": self.need,
            "weights_bytes": self.weights,
            "kv_cache_bytes": self.kv_cache,
            "overhead_bytes": self.overhead,
            "memory": self.budget.to_json(),
            "max_context": self.max_context,
            "summary": self.summary(),
        }


def _gb(n: int) -> str:
    return f"{n / GB:.2f} GB"


def _int(value: Any, what: str, most: int = DIM_MAX) -> int:
    """A count from a header or config: a number from 0 to ``most`` (NaN and infinities refused, as
    ``int()`` of them raises ValueError or OverflowError)."""
    number = finite(value)
    if number is None or not 0 <= number <= most:
        raise ModelError(f"The model's {what} is missing or malformed.", "The fit cannot be estimated.")
    return int(value)


def _layers(value: Any) -> int:
    layers = _int(value, "layer count", LAYERS_MAX)
    if layers == 0:
        raise ModelError("The model's layer count is 0.", "The fit cannot be estimated.")
    return layers


def _per_layer(value: Any, layers: int, what: str) -> list[int]:
    """A per-layer list (hybrid models) or one number for every layer."""
    if isinstance(value, list | tuple):
        if len(value) != layers:
            raise ModelError(f"The model's {what} has {len(value)} entries for {layers} layers.")
        return [_int(v, what) for v in value]
    return [_int(value, what)] * layers


def _shape(
    arch: str, layers: int, embd: int, heads: Any, kv_heads: Any, k: Any, v: Any, ctx: int
) -> ModelShape:
    head_counts = _per_layer(heads, layers, "attention head count")
    kv_counts = _per_layer(heads if kv_heads is None else kv_heads, layers, "KV head count")
    widest = max(head_counts) or 1
    key_dim = _int(k, "key length") if k is not None else embd // widest
    value_dim = _int(v, "value length") if v is not None else key_dim
    return ModelShape(arch, layers, embd, sum(kv_counts) * (key_dim + value_dim), ctx)


def shape_from_gguf(fields: Mapping[str, Any]) -> ModelShape:
    """From GGUF metadata (``general.architecture``, ``{arch}.block_count``, ...) as plain values."""
    arch = fields.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError("The GGUF file names no architecture.", "The fit cannot be estimated.")
    layers = _layers(fields.get(f"{arch}.block_count"))
    return _shape(
        arch,
        layers,
        _int(fields.get(f"{arch}.embedding_length"), "embedding length"),
        fields.get(f"{arch}.attention.head_count"),
        fields.get(f"{arch}.attention.head_count_kv"),
        fields.get(f"{arch}.attention.key_length"),
        fields.get(f"{arch}.attention.value_length"),
        _int(fields.get(f"{arch}.context_length", 0), "context length"),
    )


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """From a Hugging Face ``config.json`` (vision-language models keep theirs under ``text_config``)."""
    if not isinstance(config, Mapping):
        raise ModelError("The model's config.json is not a JSON object.", "The fit cannot be estimated.")
    text = config.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    layers = _layers(cfg.get("num_hidden_layers"))
    heads = cfg.get("num_attention_heads")
    return _shape(
        str(cfg.get("model_type") or config.get("model_type") or "unknown"),
        layers,
        _int(cfg.get("hidden_size"), "hidden size"),
        heads,
        cfg.get("num_key_value_heads"),
        cfg.get("head_dim"),
        cfg.get("head_dim"),
        _int(cfg.get("max_position_embeddings", 0), "context length"),
    )


def memory_budget(hw: Hardware, recipe: str) -> MemoryBudget:
    """Where the model would live: a discrete GPU's VRAM, unified memory, or system RAM."""
    ram = int(hw.memory_gb * GB)
    if hw.metal.available:
        share = SMALL_MAC_GPU_SHARE if hw.memory_gb <= 36 else UNIFIED_GPU_SHARE
        return MemoryBudget(MemoryKind.UNIFIED, int(ram * share), device=hw.metal.name)
    amd = best_amd_gpu(hw.amd_gpu)
    nvidia = None if recipe == MLX_RECIPE else max(hw.nvidia_gpu, key=lambda g: g.vram_gb, default=None)
    discrete = [(g.vram_gb, g.name) for g in ([amd] if amd and not amd.integrated else [])]
    discrete += [(g.vram_gb, g.name) for g in ([nvidia] if nvidia else [])]
    if discrete:
        vram_gb, name = max(discrete)
        return MemoryBudget(MemoryKind.VRAM, int(vram_gb * GB), spill=int(ram * FITS_SHARE), device=name)
    if amd is not None:
        # An APU's GPU takes its carve-out or, through GTT, a share of system memory: whichever is more.
        usable = max(int(amd.vram_gb * GB), int(ram * UNIFIED_GPU_SHARE))
        return MemoryBudget(MemoryKind.UNIFIED, usable, device=amd.name)
    return MemoryBudget(MemoryKind.RAM, ram)


def weights_bytes(files: Iterable[RepoFile]) -> int:
    """What the engine loads: the GGUF or safetensors files (not tokenizers, configs or docs)."""
    return sum(f.size for f in files if f.path.lower().endswith((".gguf", ".safetensors")))


def _need(weights: int, shape: ModelShape, context: int, recipe: str) -> tuple[int, int]:
    kv = context * shape.kv_bytes_per_token
    compute = UBATCH * (2 * context + COMPUTE_BYTES_PER_EMBD * shape.embedding)
    return kv, compute + RUNTIME_BYTES.get(recipe, RUNTIME_BYTES["llamacpp"])


def largest_context(weights: int, shape: ModelShape, limit: int, recipe: str) -> int | None:
    """The largest context (a multiple of 256, at most the trained one) whose need is within ``limit``."""
    kv0, fixed = _need(weights, shape, 0, recipe)
    per_token = shape.kv_bytes_per_token + 2 * UBATCH
    room = limit - weights - fixed - kv0
    if room < per_token * CONTEXT_STEP:
        return None
    context = room // per_token // CONTEXT_STEP * CONTEXT_STEP
    return min(context, shape.context_train) if shape.context_train else context


def estimate(
    weights: int, shape: ModelShape, hw: Hardware, recipe: str, context: int = DEFAULT_CONTEXT
) -> FitEstimate:
    budget = memory_budget(hw, recipe)
    kv, overhead = _need(weights, shape, context, recipe)
    need = weights + kv + overhead
    if need <= budget.usable * FITS_SHARE:
        verdict = Verdict.FITS
    elif need <= budget.usable + budget.spill:
        verdict = Verdict.TIGHT
    else:
        verdict = Verdict.WONT_FIT
    max_context = largest_context(weights, shape, int(budget.usable * FITS_SHARE), recipe)
    return FitEstimate(verdict, context, weights, kv, overhead, budget, max_context)


def check_live_fit(
    name: str, fit: FitEstimate, free: int, max_context: int | None, unloadable: Sequence[tuple[str, int]]
) -> None:
    """Refuse a load that needs more than the memory free now, with the numbers and the ways out:
    a smaller context, a smaller quant, unloading another model (``unloadable``: name and bytes it
    holds), or loading anyway."""
    if fit.need <= free:
        return
    where = fit.budget.kind.value + (f" ({fit.budget.device})" if fit.budget.device else "")
    ways = []
    if max_context is not None and max_context < fit.context:
        ways.append(f"a context of {max_context:,} tokens or less")
    ways.append("a smaller quant of the model")
    biggest = max(unloadable, key=lambda item: item[1], default=None)
    if biggest is not None and biggest[1] > 0:
        ways.append(f"unload {biggest[0]} (it holds {_gb(biggest[1])})")
    ways.append("load it anyway (--force, or Load anyway in the window) if you know better")
    raise FitError(
        f"{name} needs {_gb(fit.need)} (weights {_gb(fit.weights)} + KV cache {_gb(fit.kv_cache)} at "
        f"{fit.context:,} tokens + overhead {_gb(fit.overhead)}), and {_gb(free)} of {where} is free now.",
        "Ways out: " + "; ".join(ways) + ".",
    )


# -- the download bandwidth cap (the seed's rule) -------------------------------------------------------

DOWNLOAD_CAP_BPS = 50e6  # the seed's value: 50 MB/s
DOWNLOAD_CAP_SHARE = 0.5  # capped when what is left to fetch exceeds this share of available memory


@dataclass(frozen=True)
class BandwidthCap:
    """A download throttled to ``bps``: on unified memory, its page cache would crowd out the GPU's
    buffers (the same pool), starving the engine or the driver."""

    bps: float
    reason: str

    def label(self) -> str:
        return f"capped at {self.bps / 1e6:g} MB/s: {self.reason}"


def download_cap(
    kind: MemoryKind, remaining: int, available: int | None, cap_bps: float = DOWNLOAD_CAP_BPS
) -> BandwidthCap | None:
    """The cap for a download with ``remaining`` bytes to fetch, or None. Only on unified memory, and
    only when the download is bigger than half of the memory available now (``available``; None:
    unknown, no cap)."""
    if kind is not MemoryKind.UNIFIED or available is None or remaining <= available * DOWNLOAD_CAP_SHARE:
        return None
    return BandwidthCap(
        cap_bps,
        f"{_gb(remaining)} to fetch is more than half of the {_gb(available)} of unified memory available",
    )
