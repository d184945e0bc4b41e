"""Telemetry: the engine's own numbers when it sends them, the client's measurements otherwise."""

from __future__ import annotations

from app.core.chat import format_telemetry
from app.core.telemetry import ClientTimes, Telemetry, telemetry_from

# Taken from a real llama-server reply (SmolLM2-135M, 2 cores).
TIMINGS = {
    "cache_n": 0,
    "prompt_n": 36,
    "prompt_ms": 1144.003,
    "prompt_per_second": 31.46844894637514,
    "predicted_n": 10,
    "predicted_ms": 72.39,
    "predicted_per_second": 124.32656444260256,
}
USAGE = {"completion_tokens": 10, "prompt_tokens": 36, "total_tokens": 46}


def test_engine_numbers_win_but_ttft_is_the_clients() -> None:
    t = telemetry_from(ClientTimes(sent=100.0, first_token=101.25, end=103.0, deltas=10), TIMINGS, USAGE)
    assert t == Telemetry(
        ttft_s=1.25, prompt_tokens=36, prompt_tps=31.468, completion_tokens=10, decode_tps=124.327
    )


def test_cached_prompt_tokens_count_when_usage_is_missing() -> None:
    t = telemetry_from(ClientTimes(0.0, 0.5, 1.0, 3), {**TIMINGS, "prompt_n": 4, "cache_n": 32})
    assert t.prompt_tokens == 36
    assert t.completion_tokens == 10
    assert t.cached_tokens == 32


def test_measured_on_the_client_without_engine_numbers() -> None:
    # lemon-mlx sends neither timings nor usage: 21 deltas, the first after 0.5 s, the last 2 s later.
    t = telemetry_from(ClientTimes(sent=10.0, first_token=10.5, end=12.5, deltas=21))
    assert t.ttft_s == 0.5
    assert t.completion_tokens == 21
    assert t.decode_tps == 10.0  # 20 tokens after the first, over 2 s
    assert t.prompt_tokens == 0 and t.prompt_tps == 0.0


def test_usage_only_gives_prompt_speed_from_ttft() -> None:
    t = telemetry_from(ClientTimes(0.0, 0.25, 1.0, 5), usage={"prompt_tokens": 50, "completion_tokens": 5})
    assert t.prompt_tps == 200.0
    assert t.decode_tps == round(4 / 0.75, 3)


def test_the_responses_apis_usage_counts_under_its_own_names() -> None:
    # A whole reply of llama-server's /v1/responses: usage without timings, its first token at its end.
    usage = {"input_tokens": 31, "output_tokens": 6, "input_tokens_details": {"cached_tokens": 24}}
    t = telemetry_from(ClientTimes(0.0, 0.5, 0.5, 1), usage=usage)
    assert (t.prompt_tokens, t.completion_tokens, t.cached_tokens) == (31, 6, 24)
    assert t.decode_tps == 0.0  # not measured


def test_empty_reply_has_zeros_not_errors() -> None:
    t = telemetry_from(ClientTimes(0.0, None, 1.0, 0))
    assert t == Telemetry(0.0, 0, 0.0, 0, 0.0)
    assert t.to_json() == {
        "ttft_s": 0.0,
        "prompt_tokens": 0,
        "prompt_tps": 0.0,
        "completion_tokens": 0,
        "decode_tps": 0.0,
        "cached_tokens": 0,
    }


def test_stored_figures_that_are_no_finite_number_are_left_out() -> None:
    # A reply's telemetry as a damaged or hand-edited history gives it back: shown where it is a number,
    # left out where it is none (an integer past a float raised OverflowError; Infinity read "inf").
    stored = {"ttft_s": float("inf"), "prompt_tps": "fast", "decode_tps": 31.25, "completion_tokens": 10**400}
    assert format_telemetry(stored) == "decode 31.2 tok/s"
    assert format_telemetry({"ttft_s": 0.214, "completion_tokens": 420}) == "TTFT 0.21 s · 420 tokens"
