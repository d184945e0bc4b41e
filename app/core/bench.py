"""Engine benchmarks, the pure part: what a run measures, its summary (median and spread) and how it
reads as a table, as Markdown and as JSON.

A measurement is llama-bench's: a prompt of exactly ``prompt_tokens`` tokens processed with the prompt
cache off (pp, tokens per second), then exactly ``gen_tokens`` tokens generated (tg), each repeated
``repetitions`` times; the figures are the engine's own timings. The table shows medians with their
standard deviation, the Markdown export follows llama-bench's ``| model | backend | test | t/s |`` layout.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from app.core.errors import ConfigError
from app.core.launch import MAX_CTX_SIZE

DEFAULT_PROMPT_TOKENS = 512
DEFAULT_GEN_TOKENS = 128
DEFAULT_REPETITIONS = 3
BENCH_SEED = 42
CONTEXT_MARGIN = 256  # tokens a load holds beyond the prompt and the reply (a chat template's)


@dataclass(frozen=True)
class BenchSpec:
    """What to measure: every model on every backend given for its recipe (none: its default)."""

    models: tuple[str, ...]
    backends: tuple[str, ...] = ()  # "recipe:backend" keys
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS
    gen_tokens: int = DEFAULT_GEN_TOKENS
    repetitions: int = DEFAULT_REPETITIONS
    args: str = ""  # extra engine arguments for every load (e.g. "-t 2")
    rpc: str = ""  # llama.cpp RPC workers for every llama.cpp load ("": the Settings' list; "local": none)
    force: bool = False  # load even when a model needs more memory than is free now (as run's --force)

    @property
    def context(self) -> int:
        """The context size each load asks for: the prompt, the reply and a margin."""
        return self.prompt_tokens + self.gen_tokens + CONTEXT_MARGIN

    def check(self) -> None:
        if not self.models:
            raise ConfigError("Name at least one model to benchmark.")
        if self.prompt_tokens < 1 or self.gen_tokens < 1:
            raise ConfigError("--prompt-tokens and --gen-tokens must be at least 1.")
        if self.repetitions < 1:
            raise ConfigError("--repetitions must be at least 1.")
        if self.context > MAX_CTX_SIZE:
            raise ConfigError(
                f"--prompt-tokens and --gen-tokens need a context of {self.context:,} tokens; a load "
                f"takes at most {MAX_CTX_SIZE:,}.",
                "Measure a shorter prompt or reply.",
            )


@dataclass(frozen=True)
class Sample:
    """One repetition, from the engine's timings."""

    pp_tps: float
    tg_tps: float
    ttft_s: float  # prompt processing plus the first generated token, as the engine timed them


@dataclass(frozen=True)
class BenchResult:
    model: str
    recipe: str
    backend: str
    engine_version: str
    prompt_tokens: int
    gen_tokens: int
    repetitions: int
    pp_tps: float  # median
    pp_tps_stdev: float
    tg_tps: float
    tg_tps_stdev: float
    ttft_s: float  # median

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> BenchResult:
        return BenchResult(**{k: data[k] for k in BenchResult.__dataclass_fields__})

    @property
    def key(self) -> str:
        return f"{self.model} · {self.recipe}:{self.backend}"


def _stdev(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(
    model: str,
    recipe: str,
    backend: str,
    engine_version: str,
    prompt_tokens: int,
    gen_tokens: int,
    samples: Sequence[Sample],
) -> BenchResult:
    """Medians and sample standard deviations of the repetitions."""
    pp = [s.pp_tps for s in samples]
    tg = [s.tg_tps for s in samples]
    return BenchResult(
        model=model,
        recipe=recipe,
        backend=backend,
        engine_version=engine_version,
        prompt_tokens=prompt_tokens,
        gen_tokens=gen_tokens,
        repetitions=len(samples),
        pp_tps=round(statistics.median(pp), 2),
        pp_tps_stdev=round(_stdev(pp), 2),
        tg_tps=round(statistics.median(tg), 2),
        tg_tps_stdev=round(_stdev(tg), 2),
        ttft_s=round(statistics.median(s.ttft_s for s in samples), 4),
    )


@dataclass(frozen=True)
class BenchRun:
    """One ``bench`` invocation: its results with the hardware and versions that produced them."""

    id: str
    created_at: float  # seconds since the epoch
    hardware: dict[str, Any]
    results: tuple[BenchResult, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """PRODUCT.md's document: ``{"hardware": {...}, "results": [...]}`` (plus the run's id and time
        where it is stored)."""
        return {"hardware": self.hardware, "results": [r.to_json() for r in self.results]}

    def to_record(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at, **self.to_json()}

    @staticmethod
    def from_record(data: Mapping[str, Any]) -> BenchRun:
        return BenchRun(
            str(data["id"]),
            float(data["created_at"]),
            dict(data["hardware"]),
            tuple(BenchResult.from_json(r) for r in data["results"]),
        )


def hardware_summary(hardware: Mapping[str, Any]) -> str:
    """``Intel Xeon (2 cores), 24 GB, Radeon RX 7900 XTX 24 GB``: one line for tables and cards."""
    cpu = hardware.get("cpu") or {}
    parts = [f"{cpu.get('name', 'CPU')} ({cpu.get('threads', '?')} threads)"]
    if hardware.get("memory_gb"):
        parts.append(f"{hardware['memory_gb']:g} GB RAM")
    parts += [f"{g['name']} {g.get('vram_gb', 0):g} GB" for g in hardware.get("amd_gpu") or ()]
    parts += [f"{g['name']} {g.get('vram_gb', 0):g} GB" for g in hardware.get("nvidia_gpu") or ()]
    metal = hardware.get("metal") or {}
    if metal.get("available"):
        parts.append(str(metal.get("name") or "Metal"))
    return ", ".join(parts)


def known_version(version: str) -> str:
    """An engine version, or "version unknown" for a build that does not know its own ("b0", "b0-unknown")."""
    return "version unknown" if not version or version == "b0" or version.startswith("b0-") else version


def figure(median: float, stdev: float) -> str:
    return f"{median:.2f} ± {stdev:.2f}"


def table_rows(results: Iterable[BenchResult]) -> list[list[str]]:
    rows = [["model", "recipe:backend", "engine", "test", "t/s", "TTFT s"]]
    for r in results:
        backend = f"{r.recipe}:{r.backend}"
        rows.append(
            [
                r.model,
                backend,
                r.engine_version,
                f"pp{r.prompt_tokens}",
                figure(r.pp_tps, r.pp_tps_stdev),
                f"{r.ttft_s:.3f}",
            ]
        )
        rows.append(
            [r.model, backend, r.engine_version, f"tg{r.gen_tokens}", figure(r.tg_tps, r.tg_tps_stdev), ""]
        )
    return rows


def to_markdown(run: BenchRun) -> str:
    """llama-bench's Markdown table, one pp and one tg row per model and backend, under the hardware."""
    lines = [f"Hardware: {hardware_summary(run.hardware)}", ""]
    lines.append("| model | backend | engine | test | t/s |")
    lines.append("| --- | --- | --- | ---: | ---: |")
    for r in run.results:
        backend = f"{r.recipe}:{r.backend}"
        head = f"| {r.model} | {backend} | {r.engine_version}"
        lines.append(f"{head} | pp{r.prompt_tokens} | {figure(r.pp_tps, r.pp_tps_stdev)} |")
        lines.append(f"{head} | tg{r.gen_tokens} | {figure(r.tg_tps, r.tg_tps_stdev)} |")
    return "\n".join(lines) + "\n"


def pair(names: Iterable[str], base: str) -> list[str]:
    """Catalog models that share ``base``: ``Qwen3-0.6B`` gives ``Qwen3-0.6B-GGUF`` and ``Qwen3-0.6B-MLX``."""
    found = sorted(
        n for n in names if n.lower().startswith(base.lower() + "-") and "-" not in n[len(base) + 1 :]
    )
    if len(found) < 2:
        raise ConfigError(
            f"No two catalog models share the base {base!r} (found: {', '.join(found) or 'none'}).",
            "Pair a base such as Qwen3-0.6B, whose -GGUF and -MLX models are both in the catalog.",
        )
    return found
