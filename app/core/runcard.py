"""A reply's run card: everything needed to read its figures or make it again. The model (checkpoint
and quant), recipe, backend and engine version, context size, extra engine arguments, sampling values,
a hardware summary, and the figures (time to first token, prompt and completion tokens with their
speeds, cached prompt tokens). Stored with the message; shown when its telemetry footer is clicked."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from app.core.numbers import finite
from app.core.telemetry import Telemetry

_QUANT = re.compile(
    r"(?i)(?<![A-Za-z0-9])(IQ\d[A-Z0-9_]*|Q\d(?:_[A-Z0-9]+)*|BF16|F16|F32|\d+bit)(?![A-Za-z0-9])"
)


def figures(telemetry: Telemetry) -> dict[str, Any]:
    """A reply's figures, as the run card's fields."""
    return {
        "ttft_s": telemetry.ttft_s,
        "prompt_tokens": telemetry.prompt_tokens,
        "prompt_tps": telemetry.prompt_tps,
        "completion_tokens": telemetry.completion_tokens,
        "decode_tps": telemetry.decode_tps,
        "cached_tokens": telemetry.cached_tokens,
    }


def quant_of(checkpoint: str) -> str:
    """``Q4_K_M`` from ``org/repo:Q4_K_M`` or a file name, ``4bit`` from an MLX repo; "" when unknown."""
    variant = (
        checkpoint.rsplit(":", 1)[1] if ":" in checkpoint and "/" not in checkpoint.rsplit(":", 1)[1] else ""
    )
    if variant:
        return variant
    found = _QUANT.findall(checkpoint.rsplit("/", 1)[-1])
    return found[-1] if found else ""


# The local API's dialects as people read them (the router's ``Dialect`` values).
DIALECT_NAMES = {"openai": "OpenAI", "lemonade": "Lemonade", "anthropic": "Anthropic", "ollama": "Ollama"}


def dialect_label(dialect: str) -> str:
    """``ollama`` as people read it: "Ollama API"."""
    return f"{DIALECT_NAMES.get(dialect, dialect)} API"


@dataclass(frozen=True)
class RunCard:
    model: str
    checkpoint: str
    quant: str
    recipe: str
    backend: str
    engine_version: str
    ctx_size: int | None  # None: the engine's default
    extra_args: str
    sampling: dict[str, Any] = field(default_factory=dict)
    hardware: str = ""
    ttft_s: float = 0.0
    prompt_tokens: int = 0
    prompt_tps: float = 0.0
    completion_tokens: int = 0
    decode_tps: float = 0.0
    cached_tokens: int = 0
    dialect: str = ""  # the local API's dialect the reply was asked in; "": this app's own chat
    restored_tokens: int = 0  # of the prompt, restored from a saved KV cache on disk before the reply
    resumes: bool | None = None  # whether the engine resumes chats from disk (None: a card kept from before)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> RunCard:
        """The card from its stored fields; a ValueError when one is missing or not of its type (the
        chat history that keeps them can be damaged or edited by hand)."""
        known = RunCard.__dataclass_fields__
        try:
            card = RunCard(**{k: v for k, v in data.items() if k in known})
        except TypeError as err:  # a field missing
            raise ValueError(f"a run card field is missing ({err})") from None
        texts = (
            card.model,
            card.checkpoint,
            card.quant,
            card.recipe,
            card.backend,
            card.engine_version,
            card.dialect,
        )
        counts = (
            card.prompt_tokens,
            card.completion_tokens,
            card.cached_tokens,
            card.restored_tokens,
            card.ctx_size or 0,
        )
        if not (
            all(isinstance(text, str) for text in (*texts, card.extra_args, card.hardware))
            and all(isinstance(count, int) and not isinstance(count, bool) for count in counts)
            and all(finite(figure) is not None for figure in (card.ttft_s, card.prompt_tps, card.decode_tps))
            and isinstance(card.sampling, dict)
            and card.resumes in (True, False, None)
        ):
            raise ValueError("a run card field is not of its type")
        return card

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) rows, as the card shows them and the Markdown export writes them."""
        sampling = ", ".join(
            f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.sampling.items()
        )
        asked = [("Asked through", dialect_label(self.dialect))] if self.dialect else []
        if self.dialect and not sampling:
            sampling = "as the request asked"  # the request's own, not recorded here
        return [
            ("Model", self.model),
            *asked,
            ("Checkpoint", f"{self.checkpoint}" + (f" ({self.quant})" if self.quant else "")),
            ("Engine", f"{self.recipe}:{self.backend} {self.engine_version}".rstrip()),
            ("Context", f"{self.ctx_size:,} tokens" if self.ctx_size else "engine default"),
            ("Extra args", self.extra_args or "none"),
            ("Sampling", sampling or "engine defaults"),
            ("Hardware", self.hardware or "unknown"),
            ("Time to first token", f"{self.ttft_s:.3f} s"),
            ("Prompt", f"{self.prompt_tokens:,} tokens at {self.prompt_tps:,.1f} tok/s"),
            ("Cached prompt", f"{self.cached_tokens:,} tokens"),
            ("Completion", f"{self.completion_tokens:,} tokens at {self.decode_tps:,.1f} tok/s"),
            *([("Resume", self.resume_line())] if self.resumes is not None else []),
        ]

    def resume_line(self) -> str:
        if not self.resumes:
            return "this chat does not resume from disk on this engine"
        if self.restored_tokens:
            return f"resumed {self.restored_tokens:,} tokens from disk"
        return "nothing resumed from disk for this reply"

    def markdown(self) -> str:
        return "\n".join(f"> **{label}:** {value}  " for label, value in self.lines()).rstrip() + "\n"
