"""The next turn of a long chat after an unload and a reload: time to first token with instant resume
(the chat's slot saved at the unload, restored before the turn) against without (the same prompt on a
freshly loaded engine, which processes all of it). Target: with ÷ without <= 0.05.
Then a follow-up turn with a warm cache (the engine loaded, the chat's prompt in its slot): time to
first token through the router (the window's client: its slot, pacing and relay) against the same
request sent straight to the engine with ``cache_prompt``. Target: through ÷ direct <= 1.1.

Each round, through the router on the real llama-server and SmolLM2-135M (the ``system`` backend
pointed at the test cache's build): load, one turn of a ~3,000-token conversation as a window chat
(not timed), unload (the slot is saved); then, in alternating order so drifts in the machine's load hit
both, "resume": load, the chat's next turn; and "prefill": load, the same messages sent without a
conversation (no slot, nothing restored). Each is timed from the router's ``stream_chat`` call to its
first content, so the restore (which happens before the request goes out) counts; the loads do not.

    .venv/bin/python tests/bench/resume.py [--rounds N] [--facts N] [--follow-ups N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.client.events import ChatDone
from app.core.telemetry import Telemetry
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.llama import llama_server_dir, smollm_gguf

SAMPLING = {"max_tokens": 8, "temperature": 0.0}
OPTIONS = ModelOptions(backend="system", ctx_size=4096)


def conversation(facts: int) -> list[dict[str, str]]:
    colours = ("red", "green", "blue", "yellow", "white")
    text = " ".join(f"Fact {n}: the {colours[n % 5]} box holds {n * 7} marbles." for n in range(facts))
    return [
        {"role": "system", "content": "You answer questions about boxes in a few words."},
        {"role": "user", "content": f"Remember these facts. {text}"},
    ]


async def turn(
    router: Router, name: str, messages: list[dict[str, str]], chat: str | None
) -> tuple[float, str, Telemetry]:
    """Seconds from the call to the first content, the reply, and the engine's figures."""
    start, first, reply = time.perf_counter(), None, ""
    telemetry = None
    async for event in router.stream_chat(name, messages, conversation=chat, **SAMPLING):
        if isinstance(event, ChatDone):
            telemetry = event.telemetry
        else:
            first = first or time.perf_counter()
            reply += event.content
    assert telemetry is not None and first is not None
    return first - start, reply, telemetry


async def direct(base_url: str, key: str | None, messages: list[dict[str, str]]) -> float:
    """Seconds to the first content of the same request sent straight to the engine (its prompt cache
    on: llama-server takes the slot whose cached prompt is most like it).

    The reply is read to its end, as ``turn`` reads the window's. Left at its first token, the request
    went on generating until the engine saw the client gone, on the chat's own slot (its prompt matches
    the chat's, and llama-server takes the lowest slot of those that match best), and the window's next
    turn, which keeps to that slot, waited for it: that wait was the whole gap this ratio showed (10
    turns each way: through after through 26.9 ms, after a direct that hung up 79.6 ms)."""
    body = {"messages": messages, "stream": True, "cache_prompt": True, **SAMPLING}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    first: float | None = None
    seen = []
    async with httpx.AsyncClient(timeout=600, headers=headers) as client:
        start = time.perf_counter()
        async with client.stream("POST", f"{base_url}/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if len(seen) < 5:
                    seen.append(line)
                if first is None and line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("delta", {}).get("content"):
                        first = time.perf_counter() - start
    if first is None:
        raise RuntimeError(f"the engine sent no content: HTTP {response.status_code} {seen}")
    return first


async def follow_ups(router: Router, name: str, facts: int, count: int) -> None:
    """A warm chat's next turn, through the router and straight to the engine, alternating."""
    chat, messages = "bench-follow-up", conversation(facts)
    # Room for the prompt twice: the direct requests may take another slot than the chat's, whose
    # cache then holds a copy of its own (the slots share one KV cache).
    await router.load(name, dataclasses.replace(OPTIONS, ctx_size=2 * OPTIONS.ctx_size))
    _, reply, _ = await turn(router, name, messages, chat)
    messages += [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Which box holds 14 marbles?"},
    ]
    engine = router.supervisor.engines.get(name)  # the live engine: its per-launch key
    assert engine is not None and engine.base_url
    await turn(router, name, messages, chat)  # the chat's slot now holds this very prompt
    await direct(engine.base_url, engine.api_key, messages)  # and the slot the direct ones take
    through: list[float] = []
    straight: list[float] = []
    for n in range(count):
        for way in ("through", "direct") if n % 2 == 0 else ("direct", "through"):
            if way == "through":
                through.append((await turn(router, name, messages, chat))[0])
            else:
                straight.append(await direct(engine.base_url, engine.api_key, messages))
    await router.unload(name)
    ratio = statistics.median(through) / statistics.median(straight)
    print(
        f"follow-up, direct      : median TTFT {statistics.median(straight) * 1000:.1f} ms  ({ms(straight)})"
    )
    print(f"follow-up, through app : median TTFT {statistics.median(through) * 1000:.1f} ms  ({ms(through)})")
    print(f"ratio through / direct : {ratio:.3f}  (target <= 1.1: {'met' if ratio <= 1.1 else 'NOT met'})")


async def bench(rounds: int, facts: int, follow: int) -> None:
    server_dir, gguf = llama_server_dir(), smollm_gguf()
    async with Router(Settings(llama_server_path=str(server_dir / "llama-server"))) as router:
        name = router.library.import_path(gguf).name
        resumed: list[tuple[float, Telemetry]] = []
        prefilled: list[tuple[float, Telemetry]] = []
        for n in range(rounds):
            chat, messages = f"bench-{n}", conversation(facts)
            await router.load(name, OPTIONS)
            _, reply, first = await turn(router, name, messages, chat)
            await router.unload(name)
            messages += [
                {"role": "assistant", "content": reply},
                {"role": "user", "content": "Which box holds 14 marbles?"},
            ]

            async def with_resume(chat: str = chat, messages: list[dict[str, str]] = messages) -> None:
                await router.load(name, OPTIONS)
                ttft, _, telemetry = await turn(router, name, messages, chat)
                resumed.append((ttft, telemetry))
                await router.unload(name)

            async def without(messages: list[dict[str, str]] = messages) -> None:
                await router.load(name, OPTIONS)
                ttft, _, telemetry = await turn(router, name, messages, None)
                prefilled.append((ttft, telemetry))
                await router.unload(name)

            for run in (with_resume, without) if n % 2 == 0 else (without, with_resume):
                await run()
            print(f"round {n + 1}: conversation {first.prompt_tokens} tokens, load average {_load()}")
        if follow:
            await follow_ups(router, name, facts, follow)
    with_s = statistics.median(t for t, _ in resumed)
    without_s = statistics.median(t for t, _ in prefilled)
    ratio = with_s / without_s
    paired = statistics.median(r / w for (r, _), (w, _) in zip(resumed, prefilled, strict=True))
    print(f"rounds: {rounds}, llama-server {server_dir.name}, SmolLM2-135M, load average {_load()}")
    print(f"next turn, prefilled : median TTFT {without_s * 1000:.0f} ms  (runs: {_runs(prefilled)})")
    print(f"next turn, resumed   : median TTFT {with_s * 1000:.0f} ms  (runs: {_runs(resumed)})")
    print(
        f"ratio resumed / prefilled : {ratio:.4f}  (target <= 0.05: {'met' if ratio <= 0.05 else 'NOT met'})"
    )
    print(f"paired ratio (median)     : {paired:.4f}")


def ms(seconds: list[float]) -> str:
    return " ".join(f"{s * 1000:.1f}" for s in seconds)


def _runs(results: list[tuple[float, Telemetry]]) -> str:
    """Each run's TTFT in ms with the prompt tokens the engine processed (``prompt_n``)."""
    return " ".join(f"{t * 1000:.0f}[n={m.prompt_tokens - m.cached_tokens}]" for t, m in results)


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--facts", type=int, default=185, help="about 16 tokens each (185: about 3,000 tokens)"
    )
    parser.add_argument("--follow-ups", type=int, default=10, help="warm follow-up turns each way")
    args = parser.parse_args()
    # The library, options, saved KV caches and logs go to a throwaway app folder, not the user's.
    with tempfile.TemporaryDirectory(prefix="lemon-desk-bench-") as home:
        os.environ["LEMON_DESK_HOME"] = home
        asyncio.run(bench(args.rounds, args.facts, args.follow_ups))


if __name__ == "__main__":
    main()
