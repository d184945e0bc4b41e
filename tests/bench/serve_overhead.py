"""The local API's overhead: requests through the API (``lemon-desk serve``'s server and router, in a
process of their own) against the same requests sent straight to the same llama-server behind it, on
the real llama-server and SmolLM2-135M started with ``--parallel 8``. The two paths alternate, so the
machine's load hits both; one engine serves both, so no difference between two engine processes (their
memory, their threads) passes for the API's.

- time to first token: the paired difference over many short replies (target <= +2 ms), with a 95%
  bootstrap interval of its median, since one reply's TTFT varies by several milliseconds;
- one stream at a time: decode tok/s through serve / direct (target >= 0.99), paired per round, with
  a 95% interval of the median too;
- 8 concurrent streams: aggregate tok/s through serve / direct (target >= 0.95), paired per round, with a
  95% interval of the median: one round differs from the next by several percent either way (6 rounds
  of the API against the same API with a relay that did nothing but read and write could not tell them
  apart), so it takes 8 rounds by default; and the API's CPU per token over them: each stream gets an
  eighth of the engine, under one token a frame, where a relay that woke every frame regardless would
  wake more often than one per token;
- the CPU time the API's process spent per token it passed on, over the decode pairs (target <= 60 us):
  on a machine whose cores the engine uses, that time is taken from the engine. It is read from the
  process's Linux CPU clock (``process_cpu_s``: every thread's, ended ones too, to the nanosecond):
  psutil's 10 ms ticks, over ten replies of 200 tokens, moved the figure by several us either way;
- that figure taken apart: what a reply costs the API however long it is (its CPU time over the
  short replies of the TTFT pairs), spread over the decode replies' tokens, and the rest, a token;
- the floor under that figure: the same replies passed on by a bare paced TCP relay
  (``tests.support.paced_relay``: one blocking read a frame and one write, no HTTP, no events), its CPU
  per token read the same way. Paced at one wake a frame, a relay costs this machine at least that per
  token at the engine's speed (fewer tokens a frame, more per token); the API's figure over it is what
  the API's own work adds. Beside it the native floor: the same relay in C (``paced_relay.c``, built with
  the system's ``cc``), what a relay costs here with no interpreter in it;
- the engine's own decode speed (its ``timings``) through serve / direct: what the API's CPU took from
  the engine, apart from when the client saw the tokens.

Both paths are timed the same way on the client (raw httpx, lines split, JSON parsed).

Then one line per dialect (``--dialect``; all four unless named): the same replies asked through serve
in OpenAI's (``/v1/``), Lemonade's (``/api/v1/``), Anthropic's (``/v1/messages``: SSE events of its own)
and Ollama's (``/api/chat``: NDJSON) words, against the same request sent straight to the engine in
OpenAI's, paired as above: decode tok/s through / direct, the TTFT difference over short replies, and
the API process's CPU time per token it passed on in that dialect (over the decode replies), beside the
engine's speed direct: the lines come after the 8 streams, and the engine's speed drifts over a run
(95 to 64 tok/s in one run here, none in the next), which moves the CPU a token with it.
Anthropic's and Ollama's requests cannot say ``ignore_eos`` or ``cache_prompt``, so their pairs leave
both out on both paths (the replies, greedy, are the same on both).

    .venv/bin/python tests/bench/serve_overhead.py [--ttft-rounds N] [--rounds N] [--tokens N]
        [--concurrent-rounds N] [--threads N] [--dialect openai|lemonade|anthropic|ollama ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.client.pacing import FRAME_S
from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.conftest import profile_path
from tests.support.llama import build_llama_server, fetch_smollm_gguf
from tests.support.paced_relay import native_argv, native_relay

MODEL = "user.smol"
CTX = 8192
ARGS = ("--parallel", "8")
PROMPTS = [
    "Write a short poem about the sea.",
    "Explain how a bicycle works.",
    "Describe a busy market in the morning.",
    "Tell me about the history of tea.",
    "What makes a good friend?",
]


DIALECTS = ("openai", "lemonade", "anthropic", "ollama")


@dataclass(frozen=True)
class Target:
    """Where a request goes: a base URL, its headers, the model name to send, and how it is asked."""

    base: str
    headers: dict[str, str]
    model: str | None
    dialect: str = "openai"  # one of DIALECTS
    plain: bool = False  # only what every dialect can say (no ignore_eos, cache_prompt, seed)


@dataclass(frozen=True)
class Timing:
    ttft_s: float
    decode_tps: float
    tokens: int
    engine_tps: float | None = None  # the engine's own figure (its timings), when it sent them


def request(path: Target, prompt: str, tokens: int) -> tuple[str, dict[str, Any]]:
    """The URL and body of one streamed reply of ``tokens`` tokens, in ``path``'s dialect."""
    messages = [{"role": "user", "content": prompt}]
    if path.dialect == "anthropic":
        body = {"model": path.model, "messages": messages, "max_tokens": tokens, "temperature": 0}
        return f"{path.base}/v1/messages", {**body, "stream": True}
    if path.dialect == "ollama":
        options = {"num_predict": tokens, "temperature": 0}
        return f"{path.base}/api/chat", {"model": path.model, "messages": messages, "options": options}
    prefix = "/api/v1" if path.dialect == "lemonade" else "/v1"
    body = payload(prompt, tokens, path.model)
    if path.plain:
        body = {k: v for k, v in body.items() if k not in ("ignore_eos", "cache_prompt", "seed")}
    return f"{path.base}{prefix}/chat/completions", body


@dataclass(frozen=True)
class Line:
    """What one line of a stream says: whether it brings text, the engine's decode speed and the reply's
    output tokens, where it says them (the API's dialects give a read's tokens as one event, so their
    lines are not its tokens: the end's usage says how many came)."""

    text: bool = False
    engine_tps: float | None = None
    tokens: int | None = None


def line_of(dialect: str, line: bytes) -> Line:
    """What a line of a stream in ``dialect`` says."""
    if dialect == "ollama":
        if not line.startswith(b"{"):
            return Line()
        event = json.loads(line)
        return Line(bool((event.get("message") or {}).get("content")), None, event.get("eval_count"))
    if not line.startswith(b"data: {"):
        return Line()
    event = json.loads(line[6:])
    if dialect == "anthropic":
        delta, usage = event.get("delta") or {}, event.get("usage") or {}
        text = event.get("type") == "content_block_delta" and bool(delta.get("text"))
        return Line(text, None, usage.get("output_tokens") if event.get("type") == "message_delta" else None)
    choices = event.get("choices") or [{}]
    timings = event.get("timings")
    engine_tps, told = None, None
    if isinstance(timings, dict):
        engine_tps = float(timings["predicted_per_second"]) if timings.get("predicted_per_second") else None
        told = timings.get("predicted_n")
    return Line(bool((choices[0].get("delta") or {}).get("content")), engine_tps, told)


def payload(prompt: str, tokens: int, model: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
        "seed": 42,
        "cache_prompt": False,
        "stream": True,
    }
    if model:
        body["model"] = model
    return body


async def stream(client: httpx.AsyncClient, path: Target, prompt: str, tokens: int) -> Timing:
    try:
        return await _stream(client, path, prompt, tokens)
    except httpx.RemoteProtocolError:
        # llama-server closes kept-alive connections on its own; the app sends such a request again
        # (ChatClient.forward_stream), and so does the bench, on either path.
        return await _stream(client, path, prompt, tokens)


async def _stream(client: httpx.AsyncClient, path: Target, prompt: str, tokens: int) -> Timing:
    first: float | None = None
    last = 0.0
    count = 0  # lines with text
    told: int | None = None  # the tokens the reply's end says came
    engine_tps: float | None = None
    sent = time.perf_counter()
    url, body = request(path, prompt, tokens)
    async with client.stream("POST", url, json=body, headers=path.headers, timeout=None) as response:
        if response.status_code != 200:
            raise SystemExit(f"{url}: HTTP {response.status_code}: {(await response.aread()).decode()}")
        rest = b""
        async for chunk in response.aiter_bytes():
            *lines, rest = (rest + chunk).split(b"\n")
            for raw in lines:
                line = line_of(path.dialect, raw)
                if line.text:
                    last = time.perf_counter()
                    first = first or last
                    count += 1
                engine_tps = line.engine_tps or engine_tps
                told = line.tokens or told
    tokens = told or count
    assert first is not None, "the reply had no tokens"
    decode_tps = (tokens - 1) / (last - first) if last > first else 0.0  # 0: all its text came at once
    return Timing(first - sent, decode_tps, tokens, engine_tps)


async def concurrent(
    client: httpx.AsyncClient, path: Target, streams: int, tokens: int, cpu: CpuUse | None = None
) -> float:
    """Aggregate tok/s of ``streams`` streams at once: every token over the wall time; ``cpu`` adds up
    the API process's CPU time over them."""
    jobs = [stream(client, path, PROMPTS[i % len(PROMPTS)], tokens) for i in range(streams)]
    before = process_cpu_s(cpu.pid) if cpu is not None else 0.0
    started = time.perf_counter()
    results = await asyncio.gather(*jobs)
    took = time.perf_counter() - started
    if cpu is not None:
        cpu.seconds += process_cpu_s(cpu.pid) - before
        cpu.tokens += sum(r.tokens for r in results)
        cpu.replies += len(results)
    return sum(r.tokens for r in results) / took


def median_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95% bootstrap interval of the median of ``values`` (seeded: the same figures give the same)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(draws * 0.025)], medians[int(draws * 0.975) - 1]


def process_cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has spent, every thread's (ended ones too), read from outside it to
    the nanosecond: its Linux CPU clock (what clock_getcpuclockid gives: the pid, inverted, shifted past
    the clock's kind, CPUCLOCK_SCHED)."""
    return time.clock_gettime(((~pid) << 3) | 2)


@dataclass
class CpuUse:
    """The CPU time a process (``pid``: the API's, or the floor's relay) spent over the replies that went
    through it, and their tokens."""

    pid: int
    seconds: float = 0.0
    tokens: int = 0
    replies: int = 0

    async def over(self, reply: Awaitable[Timing]) -> Timing:
        before = process_cpu_s(self.pid)
        timing = await reply
        self.seconds += process_cpu_s(self.pid) - before
        self.tokens += timing.tokens
        self.replies += 1
        return timing

    def per_token_us(self) -> float:
        return self.seconds / max(self.tokens, 1) * 1e6

    def per_reply_ms(self) -> float:
        return self.seconds / max(self.replies, 1) * 1e3


def split(cpu: CpuUse, short: CpuUse) -> str:
    """``cpu``'s figure a token, taken apart: what a reply costs however long it is (a short reply's cost,
    ``short``: its two tokens' reads are in it too) spread over the tokens of ``cpu``'s replies, and the
    rest, a token passed on. The first is the request's handling (HTTP, routing, the engine's connection,
    the relay's start and end); the second the paced reads and writes."""
    own = short.seconds * cpu.replies / max(short.replies, 1)
    each = own / max(cpu.tokens, 1) * 1e6
    rest = (cpu.seconds - own) / max(cpu.tokens, 1) * 1e6
    return (
        f"a reply's own {short.per_reply_ms():.2f} ms (over {short.replies} replies of 2 tokens),"
        f" {each:.0f} us a token over these replies, and {rest:.0f} us a token passed on"
    )


async def paired(
    client: httpx.AsyncClient,
    through: Target,
    direct: Target,
    rounds: int,
    tokens: int,
    cpu: CpuUse | None = None,
) -> list[tuple[Timing, Timing]]:
    """``rounds`` pairs (through serve, direct) of the same request, the order alternating; ``cpu``
    adds up the API process's CPU time over the replies through it."""

    async def reply(path: Target, prompt: str) -> Timing:
        timing = stream(client, path, prompt, tokens)
        return await (cpu.over(timing) if cpu is not None and path is through else timing)

    pairs = []
    for i in range(rounds):
        prompt = PROMPTS[i % len(PROMPTS)]
        first, second = (through, direct) if i % 2 == 0 else (direct, through)
        a = await reply(first, prompt)
        b = await reply(second, prompt)
        pairs.append((a, b) if i % 2 == 0 else (b, a))
    return pairs


async def bench(args: argparse.Namespace, served: Served, native_binary: Path | None) -> None:
    through = Target(served.api_url, {}, MODEL)
    direct = Target(served.engine_url, {"Authorization": f"Bearer {served.engine_key}"}, None)
    # Idle connections go before llama-server's 5 s keep-alive ends (else a request can meet a closing one).
    limits = httpx.Limits(max_connections=None, keepalive_expiry=2.0)
    async with httpx.AsyncClient(trust_env=False, limits=limits) as client:
        for path in (through, direct):  # warm-up, not counted
            await stream(client, path, PROMPTS[0], 8)
        short = CpuUse(served.child.pid)
        first_pairs = await paired(client, through, direct, args.ttft_rounds, 2, short)
        cpu = CpuUse(served.child.pid)
        decode_pairs = await paired(client, through, direct, args.rounds, args.tokens, cpu)
        engine = urlsplit(served.engine_url)
        host, port = str(engine.hostname), int(engine.port or 80)
        python_relay = [sys.executable, "-m", "tests.support.paced_relay", host, str(port)]
        floor = await floor_use(client, served, python_relay, args.rounds, args.tokens)
        native = None
        if native_binary is not None:
            argv = native_argv(native_binary, host, port)
            native = await floor_use(client, served, argv, args.rounds, args.tokens)
        serve_agg: list[float] = []
        direct_agg: list[float] = []
        many = CpuUse(served.child.pid)
        for i in range(args.concurrent_rounds):
            pair2 = [(serve_agg, through), (direct_agg, direct)]
            for totals, path in pair2 if i % 2 == 0 else reversed(pair2):
                totals.append(
                    await concurrent(client, path, 8, args.tokens, many if path is through else None)
                )

    gaps = [s.ttft_s - d.ttft_s for s, d in first_pairs]
    ttft = statistics.median(gaps)
    low, high = median_interval(gaps)
    ratios = [s.decode_tps / d.decode_tps for s, d in decode_pairs]
    ratio = statistics.median(ratios)
    ratio_low, ratio_high = median_interval(ratios)
    decode_gap = statistics.median(s.ttft_s - d.ttft_s for s, d in decode_pairs)
    engine_ratios = [s.engine_tps / d.engine_tps for s, d in decode_pairs if s.engine_tps and d.engine_tps]
    agg_ratios = [s / d for s, d in zip(serve_agg, direct_agg, strict=True)]
    agg = statistics.median(agg_ratios)
    agg_low, agg_high = median_interval(agg_ratios)
    threads = f", --threads {args.threads}" if args.threads else ""
    print(
        f"llama-server, SmolLM2-135M, --parallel 8{threads}; one engine, through serve and directly; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"TTFT over {args.ttft_rounds} pairs of short replies (median): "
        f"serve {statistics.median(s.ttft_s for s, _ in first_pairs) * 1000:.2f} ms"
        f"  direct {statistics.median(d.ttft_s for _, d in first_pairs) * 1000:.2f} ms"
        f"  paired difference {ttft * 1000:+.2f} ms (95% interval {low * 1000:+.2f} to {high * 1000:+.2f})"
    )
    print(
        f"decode tok/s over {args.rounds} pairs of {args.tokens} tokens (median): "
        f"serve {statistics.median(s.decode_tps for s, _ in decode_pairs):.2f}"
        f"  direct {statistics.median(d.decode_tps for _, d in decode_pairs):.2f}  paired ratio {ratio:.4f}"
        f" (95% interval {ratio_low:.4f} to {ratio_high:.4f};"
        f" their TTFT difference {decode_gap * 1000:+.2f} ms)"
    )
    if engine_ratios:
        low_e, high_e = median_interval(engine_ratios)
        print(
            f"the engine's own decode tok/s (its timings), paired ratio serve / direct: "
            f"{statistics.median(engine_ratios):.4f} (95% interval {low_e:.4f} to {high_e:.4f})"
        )
    per_token = cpu.per_token_us()
    print(
        f"the API process's CPU time per token it passed on: {per_token:.0f} us"
        f" (over {cpu.tokens} tokens); the floor, a bare relay paced the same: {floor.per_token_us():.0f} us"
        f" (over {floor.tokens} tokens); the API over the floor: {over_floor(cpu, floor)}"
    )
    if native is not None:
        print(
            f"the native floor, the same relay in C: {native.per_token_us():.0f} us"
            f" (over {native.tokens} tokens); the Python floor over it: {over_floor(floor, native)},"
            f" the API over it: {over_floor(cpu, native)}"
        )
    else:
        print("the native floor: not measured (no C compiler, cc, on the PATH)")
    print(f"the API's CPU per token taken apart: {split(cpu, short)}")
    print(
        f"8 concurrent streams, aggregate tok/s (median of {args.concurrent_rounds}): "
        f"serve {statistics.median(serve_agg):.1f}  direct {statistics.median(direct_agg):.1f}"
        f"  paired ratio {agg:.4f} (95% interval {agg_low:.4f} to {agg_high:.4f});"
        f" the API's CPU per token {many.per_token_us():.0f} us"
        f" ({statistics.median(serve_agg) / 8 * FRAME_S:.1f} tokens a stream a frame)"
    )
    print(
        f"targets: TTFT within +2 ms: {'met' if ttft <= 0.002 else 'NOT met'}; "
        f"decode ratio >= 0.99: {'met' if ratio >= 0.99 else 'NOT met'}; "
        f"CPU per token <= 60 us: {'met' if per_token <= 60 else 'NOT met'}; "
        f"8 streams >= 0.95: {'met' if agg >= 0.95 else 'NOT met'}"
    )
    async with httpx.AsyncClient(trust_env=False, limits=limits) as client:
        for dialect in args.dialect or DIALECTS:
            await by_dialect(client, served, dialect, args, floor)


async def floor_use(
    client: httpx.AsyncClient, served: Served, argv: list[str], rounds: int, tokens: int
) -> CpuUse:
    """The CPU a bare paced relay (``argv``: ``tests.support.paced_relay`` or its C twin, to the engine)
    spends on ``rounds`` replies."""
    root = Path(__file__).resolve().parents[2]
    relay = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
    assert relay.stdin is not None and relay.stdout is not None
    try:
        # A connection a reply: the relay closes the client's with the engine's (a kept one could
        # meet the next request closed).
        path = Target(
            f"http://127.0.0.1:{int(relay.stdout.readline())}",
            {"Authorization": f"Bearer {served.engine_key}", "Connection": "close"},
            None,
        )
        await stream(client, path, PROMPTS[0], 8)  # warm-up, not counted
        floor = CpuUse(relay.pid)
        for i in range(rounds):
            await floor.over(stream(client, path, PROMPTS[i % len(PROMPTS)], tokens))
        return floor
    finally:
        relay.stdin.close()
        relay.wait(timeout=30)


def over_floor(cpu: CpuUse, floor: CpuUse) -> str:
    return f"{cpu.per_token_us() / floor.per_token_us():.2f}x"


async def by_dialect(
    client: httpx.AsyncClient, served: Served, dialect: str, args: argparse.Namespace, floor: CpuUse
) -> None:
    """One line: replies asked through serve in ``dialect`` against the same sent straight to the engine."""
    plain = dialect in ("anthropic", "ollama")
    through = Target(served.api_url, {}, MODEL, dialect, plain)
    direct = Target(
        served.engine_url, {"Authorization": f"Bearer {served.engine_key}"}, None, "openai", plain
    )
    for path in (through, direct):  # warm-up, not counted
        await stream(client, path, PROMPTS[0], 8)
    short = CpuUse(served.child.pid)
    gaps = [s.ttft_s - d.ttft_s for s, d in await paired(client, through, direct, args.ttft_rounds, 2, short)]
    cpu = CpuUse(served.child.pid)
    pairs = await paired(client, through, direct, args.rounds, args.tokens, cpu)
    ratios = [s.decode_tps / d.decode_tps for s, d in pairs]
    low, high = median_interval(ratios)
    gap_low, gap_high = median_interval(gaps)
    print(
        f"dialect {dialect:<9} decode through / direct {statistics.median(ratios):.4f}"
        f" (95% interval {low:.4f} to {high:.4f}; {args.rounds} pairs, median"
        f" {statistics.median(p.tokens for p, _ in pairs)} tokens, the engine direct at"
        f" {statistics.median(d.decode_tps for _, d in pairs):.1f} tok/s)"
        f"  TTFT difference {statistics.median(gaps) * 1000:+.2f} ms"
        f" (95% interval {gap_low * 1000:+.2f} to {gap_high * 1000:+.2f}; {args.ttft_rounds} pairs)"
        f"  the API's CPU per token {cpu.per_token_us():.0f} us ({over_floor(cpu, floor)} the floor:"
        f" {split(cpu, short)})"
    )


@dataclass(frozen=True)
class Served:
    api_url: str
    engine_url: str
    engine_key: str
    child: subprocess.Popen[str]


@contextlib.contextmanager
def served_engine(model: str) -> Iterator[Served]:
    """The API in a child process (tests.support.served_engine) with ``model`` loaded behind it."""
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.served_engine", model],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        line = child.stdout.readline().split()
        if len(line) != 3:
            raise SystemExit(f"the served engine did not start (exit code {child.wait()})")
        yield Served(line[0], line[1], line[2], child)
    finally:
        child.stdin.close()  # it stops its engine and exits
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            raise


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--ttft-rounds", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--concurrent-rounds", type=int, default=8)
    parser.add_argument(
        "--threads", type=int, help="the engine's threads (default: llama-server's own, one per core)"
    )
    parser.add_argument(
        "--dialect",
        action="append",
        choices=DIALECTS,
        help="a dialect to compare line by line (again for more; default: all four)",
    )
    args = parser.parse_args()
    server_dir, model = build_llama_server(print), fetch_smollm_gguf(print)
    native_binary = native_relay(print)
    with tempfile.TemporaryDirectory(prefix="lemon-desk-bench-") as home:
        # The API's state (settings, the imported model, its options) goes to a throwaway app folder.
        os.environ["LEMON_DESK_HOME"] = home
        os.environ["LEMON_DESK_MOCK_HARDWARE"] = str(profile_path("cpu_only_x86"))
        os.environ["LD_LIBRARY_PATH"] = str(server_dir)
        settings = Settings(llama_server_path=str(server_dir / "llama-server"))
        save_settings(settings)
        Library(settings).import_path(model, name=MODEL)
        engine_args = [*ARGS, *(["--threads", str(args.threads)] if args.threads else [])]
        save_model_options({MODEL: ModelOptions(backend="system", ctx_size=CTX, args=" ".join(engine_args))})
        with served_engine(MODEL) as served:
            asyncio.run(bench(args, served, native_binary))


if __name__ == "__main__":
    main()
