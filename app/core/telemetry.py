"""Per-reply telemetry: time to first token, prompt and decode speed, token counts.

Engine-measured numbers (llama-server's ``timings``, the OpenAI ``usage`` chunk) win; what the engine
does not report is measured on the client. Time to first token is always the client's: it is what the
user waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from app.core.numbers import finite


@dataclass(frozen=True)
class Telemetry:
    ttft_s: float  # request sent -> first content or reasoning token, on the client
    prompt_tokens: int
    prompt_tps: float  # prompt tokens processed per second
    completion_tokens: int
    decode_tps: float  # generated tokens per second after the first one
    cached_tokens: int = 0  # prompt tokens the engine took from its cache instead of processing

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TelemetryTotals:
    """Running totals over the replies since the app started (Lemonade's ``*_total`` figures)."""

    requests: int = 0
    input_tokens: int = 0  # prompt tokens the engines processed (not taken from their caches)
    output_tokens: int = 0
    prompt_tokens: int = 0  # cached ones included
    cache_tokens: int = 0

    def add(self, t: Telemetry) -> TelemetryTotals:
        return TelemetryTotals(
            self.requests + 1,
            self.input_tokens + max(t.prompt_tokens - t.cached_tokens, 0),
            self.output_tokens + t.completion_tokens,
            self.prompt_tokens + t.prompt_tokens,
            self.cache_tokens + t.cached_tokens,
        )


@dataclass(frozen=True)
class ClientTimes:
    """What the client saw, in seconds on one monotonic clock."""

    sent: float
    first_token: float | None  # None: the reply had no tokens
    end: float
    deltas: int  # content/reasoning deltas received (one token each on llama.cpp)


def _number(data: Any, key: str) -> float | None:
    """A finite number from an engine's figures; anything else there (a remote answers what it likes)
    counts as not given."""
    return finite(data.get(key)) if isinstance(data, Mapping) else None


# The Responses API's names for chat's usage figures.
RESPONSES_USAGE = {
    "input_tokens": "prompt_tokens",
    "output_tokens": "completion_tokens",
    "input_tokens_details": "prompt_tokens_details",
}


def telemetry_from(
    times: ClientTimes,
    timings: Mapping[str, Any] | None = None,
    usage: Mapping[str, Any] | None = None,
) -> Telemetry:
    """Combine the engine's ``timings``/``usage`` (either may be missing; ``usage`` in chat's names or
    the Responses API's) with the client's times."""
    ttft = (times.first_token - times.sent) if times.first_token is not None else 0.0
    if isinstance(usage, Mapping):
        usage = {RESPONSES_USAGE.get(key, key): value for key, value in usage.items()}

    prompt_tokens = _number(usage, "prompt_tokens")
    if prompt_tokens is None:
        processed, cached = _number(timings, "prompt_n"), _number(timings, "cache_n")
        prompt_tokens = (processed or 0.0) + (cached or 0.0) if processed is not None else 0.0
    prompt_tps = _number(timings, "prompt_per_second")
    if prompt_tps is None:
        prompt_tps = prompt_tokens / ttft if ttft > 0 else 0.0

    completion = _number(usage, "completion_tokens")
    if completion is None:
        completion = _number(timings, "predicted_n")
    if completion is None:
        completion = float(times.deltas)
    decode_tps = _number(timings, "predicted_per_second")
    if decode_tps is None:
        span = times.end - times.first_token if times.first_token is not None else 0.0
        decode_tps = (completion - 1) / span if completion > 1 and span > 0 else 0.0

    cached = _number(timings, "cache_n")
    if cached is None:
        details = usage.get("prompt_tokens_details") if isinstance(usage, Mapping) else None
        cached = _number(details, "cached_tokens")

    return Telemetry(
        ttft_s=round(ttft, 6),
        prompt_tokens=int(prompt_tokens),
        prompt_tps=round(prompt_tps, 3),
        completion_tokens=int(completion),
        decode_tps=round(decode_tps, 3),
        cached_tokens=int(cached or 0),
    )
