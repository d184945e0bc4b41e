"""The local API as other apps use it: the official `openai` client against `lemon-desk serve` (a real
child process) on the real llama-server and SmolLM2."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest

from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.conftest import profile_path
from tests.integration.conftest import OpenAIs, engines_of, lemon_desk
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.serve import Serving, serving

pytestmark = pytest.mark.integration

MODEL = "user.smol"
KEY = "test-key-0123456789"
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
GGUF_FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
HELLO = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture
def smol_home(llama_dir: Path, smol_gguf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 imported as "user.smol", run by the real llama-server as the `system` backend, 4 slots."""
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(llama_dir))
    settings = Settings(llama_server_path=str(llama_dir / "llama-server"))
    save_settings(settings)
    Library(settings).import_path(smol_gguf, name=MODEL)
    save_model_options({MODEL: ModelOptions(backend="system", ctx_size=4096, args="--parallel 4")})


@pytest.fixture
def served(smol_home: None, lemon_home: Path) -> Iterator[Serving]:
    with serving() as running:
        yield running
    assert engines_of(lemon_home) == []  # SIGTERM stopped every engine


def test_list_chat_stream_completions_stop_and_unknown_model(served: Serving, openai_api: OpenAIs) -> None:
    api = openai_api(served.url)
    assert [m.id for m in api.models.list()] == [MODEL]

    reply = api.chat.completions.create(model=MODEL, messages=HELLO, temperature=0, max_tokens=16, seed=1)
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.model == MODEL  # llama-server answers under the model's name, not its file's path
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.prompt_tokens + usage.completion_tokens == usage.total_tokens

    chunks = list(
        api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Count from one to twenty in words."}],
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) > 2 and text
    final = chunks[-1].usage
    assert final is not None and final.completion_tokens > 2
    assert final.prompt_tokens + final.completion_tokens == final.total_tokens

    completion = api.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=8, temperature=0)
    assert completion.choices[0].text

    stopped = api.completions.create(
        model=MODEL, prompt="1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=40, temperature=0, stop=["12"]
    )
    assert stopped.choices[0].finish_reason == "stop" and "12" not in stopped.choices[0].text

    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="no-such-model", messages=HELLO)

    stats = httpx.get(f"{served.url}/api/v1/stats", trust_env=False).json()
    assert stats["source"] == "api" and stats["output_tokens"] > 0 and stats["time_to_first_token"] > 0
    assert stats["request_count_total"] == 4 and stats["output_tokens_total"] >= stats["output_tokens"]


def test_stats_count_what_llama_servers_prompt_cache_served(served: Serving, openai_api: OpenAIs) -> None:
    api = openai_api(served.url)
    question = [{"role": "user", "content": "Name the largest planet of the solar system in one word."}]
    first = api.chat.completions.create(model=MODEL, messages=question, max_tokens=4, temperature=0)
    follow_up = [
        *question,
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And the smallest?"},
    ]
    api.chat.completions.create(model=MODEL, messages=follow_up, max_tokens=4, temperature=0)
    stats = httpx.get(f"{served.url}/api/v1/stats", trust_env=False).json()
    # The second prompt starts as the first did: llama-server took that part from its cache.
    assert stats["cache_tokens"] > 0
    assert stats["input_tokens"] + stats["cache_tokens"] == stats["prompt_tokens"]
    assert stats["request_count_total"] == 2 and stats["cache_tokens_total"] == stats["cache_tokens"]
    assert stats["prompt_tokens_total"] > stats["prompt_tokens"]


def test_stats_count_responses_whole_and_streamed(served: Serving, openai_api: OpenAIs) -> None:
    """The Responses API names its usage input_tokens/output_tokens, and a streamed reply carries it inside
    its response.completed event's response (llama-server puts its timings beside it)."""
    api = openai_api(served.url)

    def stats() -> dict[str, Any]:
        return dict(httpx.get(f"{served.url}/api/v1/stats", trust_env=False).json())

    chat = api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
    reply = api.responses.create(model=MODEL, input="Hello", max_output_tokens=6, temperature=0)
    whole = stats()
    counting = "Count from one to ten in words."
    events = list(api.responses.create(model=MODEL, input=counting, max_output_tokens=8, stream=True))
    streamed = stats()

    assert reply.usage is not None and reply.usage.output_tokens > 0
    assert whole["prompt_tokens"] == reply.usage.input_tokens > 0
    assert whole["output_tokens"] == reply.usage.output_tokens
    # No timings come with a whole reply: its decode speed is not measured (not tokens over the few
    # microseconds between its arrival and its figures being read).
    assert whole["tokens_per_second"] == 0.0 and whole["time_to_first_token"] > 0
    assert chat.usage is not None and whole["request_count_total"] == 2
    assert whole["output_tokens_total"] == chat.usage.completion_tokens + reply.usage.output_tokens
    completed = events[-1]
    assert completed.type == "response.completed" and completed.response.usage is not None
    usage = completed.response.usage
    assert streamed["prompt_tokens"] == usage.input_tokens
    assert streamed["output_tokens"] == usage.output_tokens
    assert streamed["tokens_per_second"] > 0 and streamed["request_count_total"] == 3
    assert streamed["output_tokens_total"] == whole["output_tokens_total"] + usage.output_tokens


def test_five_concurrent_requests_are_all_answered(served: Serving, openai_api: OpenAIs) -> None:
    api = openai_api(served.url)

    def ask(i: int) -> str:
        reply = api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Say the number {i}."}],
            max_tokens=12,
            temperature=0,
        )
        return reply.choices[0].message.content or ""

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        answers = list(pool.map(ask, range(5)))
    assert len(answers) == 5 and all(answers)
    health = httpx.get(f"{served.url}/api/v1/health", trust_env=False).json()
    assert [m["model_name"] for m in health["all_models_loaded"]] == [MODEL]


async def _paced_reply(http: httpx.AsyncClient, i: int, tokens: int) -> int:
    """One streamed reply through serve, in OpenAI's, Anthropic's or Ollama's words (by ``i``), read to
    its end; the tokens it brought."""
    messages = [{"role": "user", "content": f"Count from {i} upwards, one number a line."}]
    dialect = ("openai", "openai", "anthropic", "ollama")[i % 4]
    if dialect == "anthropic":
        body: dict[str, Any] = {"model": MODEL, "messages": messages, "max_tokens": tokens, "stream": True}
        path = "/v1/messages"
    elif dialect == "ollama":
        body = {"model": MODEL, "messages": messages, "options": {"num_predict": tokens}}
        path = "/api/chat"
    else:
        body = {"model": MODEL, "messages": messages, "max_tokens": tokens, "stream": True}
        body |= {"ignore_eos": True, "stream_options": {"include_usage": True}}
        path = "/v1/chat/completions"
    raw = b""
    async with http.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for chunk in response.aiter_bytes():
            raw += chunk
    lines = [line for line in raw.decode().split("\n") if line.strip()]
    if dialect == "ollama":
        last = json.loads(lines[-1])
        assert last["done"] is True, lines[-1]
        return int(last["eval_count"])
    events = [line[6:] for line in lines if line.startswith("data: ")]
    if dialect == "anthropic":
        assert json.loads(events[-1])["type"] == "message_stop", events[-1]
        return int(json.loads(events[-2])["usage"]["output_tokens"])
    assert events[-1] == "[DONE]", events[-3:]
    texts = [e for e in events[:-1] if (json.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content")]
    usage = json.loads(events[-2])["usage"]
    assert usage["completion_tokens"] == tokens and len(texts) >= tokens - 1  # nothing lost on the way
    return int(usage["completion_tokens"])


def test_eight_concurrent_paced_streams_all_finish_round_after_round(
    smol_home: None, lemon_home: Path
) -> None:
    """The relay reads each stream a frame at a time after its first token (``app.client.pacing``) with
    its connection's transport held between frames; under 8 concurrent streams on the real engine one
    was once left waiting for good. Every reply must come whole, in every round."""
    options = ModelOptions(backend="system", ctx_size=8192, args="--parallel 8")
    save_model_options({MODEL: options})

    async def rounds(url: str) -> list[list[int]]:
        timeout = httpx.Timeout(10.0, read=180.0)  # a stream left waiting fails here, not the suite
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=timeout, limits=limits) as http:
            return [await asyncio.gather(*(_paced_reply(http, i, 48) for i in range(8))) for _ in range(3)]

    with serving() as served:
        got = asyncio.run(rounds(served.url))
    assert all(len(r) == 8 and all(n > 0 for n in r) for r in got), got
    assert engines_of(lemon_home) == []


def test_a_key_set_and_missing_is_an_authentication_error(smol_home: None, openai_api: OpenAIs) -> None:
    with serving(env={"LEMON_DESK_API_KEY": KEY}) as served:
        with pytest.raises(openai.AuthenticationError):
            openai_api(served.url, "wrong").models.list()
        assert [m.id for m in openai_api(served.url, KEY).models.list()] == [MODEL]
        missing = httpx.get(f"{served.url}/v1/models", trust_env=False)
        assert missing.status_code == 401 and json.loads(missing.text)["error"]["type"]
        # The key reaches no engine's command line.
        reply = openai_api(served.url, KEY).completions.create(model=MODEL, prompt="Hi", max_tokens=2)
        assert reply.choices
        engine = httpx.get(f"{served.url}/api/v1/health", headers={"Authorization": f"Bearer {KEY}"})
        pid = engine.json()["all_models_loaded"][0]["pid"]
        assert KEY not in " ".join(psutil.Process(pid).cmdline())
        assert KEY not in json.dumps(psutil.Process(pid).environ())
    assert served.proc.returncode == 0


def test_serve_refuses_a_public_host_without_a_key(smol_home: None) -> None:
    result = lemon_desk("serve", "--host", "0.0.0.0", "--port", "0", timeout=60)
    assert result.returncode == 1 and "API key" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture
def hub(smol_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    """A loopback Hub serving SmolLM2 as a GGUF repo, for ``serve`` (a child) through HF_ENDPOINT."""
    hub = LoopbackHub()
    hub.add(HubRepo(REPO, {GGUF_FILE: smol_gguf.read_bytes()}, tags=("gguf",)))
    with hub.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        for var in ("HF_HOME", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield hub


def test_pull_registers_a_user_model_that_the_real_engine_then_serves(
    smol_home: None, hub: LoopbackHub, lemon_home: Path, openai_api: OpenAIs
) -> None:
    definition = {"model_name": "user.Smol", "checkpoint": f"{REPO}:Q4_1", "recipe": "llamacpp"}
    with serving() as served:
        api = httpx.Client(base_url=f"{served.url}/api/v1", trust_env=False, timeout=120)
        with api:
            refused = api.post("/pull", json={**definition, "recipe": "sd-cpp"})
            pulled = api.post("/pull", json={**definition, "reasoning": True})
            loaded = api.post(
                "/load",
                json={"model_name": "user.Smol", "llamacpp_backend": "system", "ctx_size": 2048},
            )
            listed = {m["id"]: m for m in api.get("/models").json()["data"]}
            chat = openai_api(served.url).chat.completions
            reply = chat.create(model="user.Smol", messages=HELLO, max_tokens=8)
            health = api.get("/health").json()
    assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
    assert pulled.json() == {"status": "success", "message": "Installed model: user.Smol"}
    assert loaded.status_code == 200, loaded.text
    smol = listed["user.Smol"]
    assert smol["labels"] == ["reasoning"] and smol["downloaded"] is True
    assert smol["max_context_window"] == 8192 and smol["context_length"] == 2048  # SmolLM2's, the engine's
    assert reply.model == "user.Smol" and reply.choices[0].message.content
    (model,) = health["all_models_loaded"]
    assert model["model_name"] == "user.Smol" and model["recipe_options"]["ctx_size"] == 2048
    assert engines_of(lemon_home) == []
