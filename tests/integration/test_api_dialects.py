"""The local API's other dialects as other apps use them: the official `anthropic` and `ollama` clients,
unchanged but for their base URL, against `lemon-desk serve` (a real child process) on the real
llama-server and SmolLM2; Ollama's pull from the loopback Hub, then copy and create, on the real
engine."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import ollama
import pytest

from app.store.library import Library
from app.store.model_options import ModelOptions, load_model_options, save_model_options
from app.store.settings import load_settings
from tests.integration.conftest import engines_of
from tests.integration.test_api_openai import GGUF_FILE, KEY, MODEL, REPO, hub, smol_home  # noqa: F401
from tests.support.hubserver import LoopbackHub
from tests.support.litellm_client import RESULT
from tests.support.serve import Serving, serving

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
COPY = "user.smol-copy"


@pytest.fixture
def dialects_home(smol_home: None, smol_gguf: Path) -> None:  # noqa: F811
    """Beside "user.smol": the same GGUF as "user.smol-copy", to delete (its file is left alone)."""
    Library(load_settings().settings).import_path(smol_gguf, name=COPY)
    options = load_model_options().items
    options[COPY] = ModelOptions(backend="system", ctx_size=2048)
    save_model_options(options)


@pytest.fixture
def served_with_key(dialects_home: None, lemon_home: Path) -> Iterator[Serving]:
    with serving("--api-key", KEY) as running:
        yield running
    assert engines_of(lemon_home) == []


@contextlib.contextmanager
def claude(served: Serving, key: str = KEY) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=served.url, api_key=key, max_retries=0, timeout=120) as client:
        yield client


def test_anthropic_create_stream_system_stop_usage_and_count_tokens(served_with_key: Serving) -> None:
    with claude(served_with_key) as api:
        reply = api.messages.create(
            model=MODEL, max_tokens=16, messages=QUESTION, extra_body={"temperature": 0}
        )
        assert reply.type == "message" and reply.role == "assistant" and reply.model == MODEL
        assert reply.content[0].type == "text" and "Paris" in reply.content[0].text
        assert reply.stop_reason in ("end_turn", "max_tokens")
        assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0

        # count_tokens counts the prompt as the engine's own usage does for the same request.
        counted = api.messages.count_tokens(model=MODEL, messages=QUESTION)
        assert counted.input_tokens == reply.usage.input_tokens

        with api.messages.stream(
            model=MODEL,
            max_tokens=40,
            extra_body={"temperature": 0},  # the client takes no sampling fields now
            system="You are a pirate. Always answer in the words of a pirate.",
            messages=[{"role": "user", "content": "Count from one to ten in words."}],
        ) as stream:
            pieces = list(stream.text_stream)
            final = stream.get_final_message()
        assert len(pieces) > 2 and "".join(pieces) == final.content[0].text
        assert final.usage.output_tokens > 2 and final.usage.input_tokens > 0
        with_system = api.messages.count_tokens(
            model=MODEL,
            system="You are a pirate. Always answer in the words of a pirate.",
            messages=[{"role": "user", "content": "Count from one to ten in words."}],
        )
        assert with_system.input_tokens == final.usage.input_tokens  # the system prompt was in it

        stopped = api.messages.create(
            model=MODEL,
            max_tokens=60,
            extra_body={"temperature": 0},  # the client takes no sampling fields now
            messages=[
                {"role": "user", "content": "Count from one to twenty, in digits, separated by commas."}
            ],
            stop_sequences=["7"],
        )
        assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "7"
        text = stopped.content[0].text
        assert "6" in text and "7" not in text

        stats = httpx.get(
            f"{served_with_key.url}/api/v1/stats", headers={"x-api-key": KEY}, trust_env=False
        ).json()
        assert stats["source"] == "api" and stats["request_count_total"] == 3


def test_anthropic_errors_come_as_the_clients_exceptions(served_with_key: Serving) -> None:
    with claude(served_with_key) as api, claude(served_with_key, key="wrong") as wrong_key:
        with pytest.raises(anthropic.NotFoundError) as missing:
            api.messages.create(model="no-such-model", max_tokens=5, messages=QUESTION)
        assert missing.value.body["error"]["type"] == "not_found_error"
        with pytest.raises(anthropic.AuthenticationError):
            wrong_key.messages.create(model=MODEL, max_tokens=5, messages=QUESTION)
        with pytest.raises(anthropic.BadRequestError):
            api.messages.create(model=MODEL, max_tokens=0, messages=QUESTION)


def test_ollama_list_show_ps_chat_generate_delete_and_unknown_model(served_with_key: Serving) -> None:
    api = ollama.Client(host=served_with_key.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    try:
        talk_ollama(api)
    finally:
        api.close()


def talk_ollama(api: ollama.Client) -> None:
    listed = sorted(m.model or "" for m in api.list().models)
    assert listed == sorted(f"{name}:latest" for name in (MODEL, COPY))
    shown = api.show(f"{MODEL}:latest")
    assert shown.details is not None and shown.details.format == "gguf"
    assert shown.capabilities == ["completion"] and shown.modelinfo["general.context_length"] == 4096
    assert api.ps().models == []

    reply = api.chat(model=MODEL, messages=QUESTION, options={"temperature": 0, "num_predict": 16})
    assert "Paris" in reply.message.content and reply.done and reply.done_reason in ("stop", "length")
    assert (reply.prompt_eval_count or 0) > 0 and (reply.eval_count or 0) > 0

    parts = list(
        api.chat(
            model=f"{MODEL}:latest",
            messages=[{"role": "user", "content": "Count from one to ten in words."}],
            options={"temperature": 0, "num_predict": 30},
            stream=True,
        )
    )
    assert len(parts) >= 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts).strip()
    # A line holds the tokens of one read of the engine's stream (one or more): the end counts them all.
    assert (parts[-1].eval_count or 0) >= len([p for p in parts[:-1] if p.message.content]) >= 1
    assert parts[-1].done_reason == "stop" or parts[-1].eval_count == 30

    generated = api.generate(model=MODEL, prompt="The capital of France is", options={"num_predict": 8})
    assert generated.response and generated.done
    running = api.ps().models
    assert [m.model for m in running] == [f"{MODEL}:latest"] and running[0].context_length == 4096

    assert api.delete(COPY).status == "success"
    assert f"{COPY}:latest" not in [m.model for m in api.list().models]
    with pytest.raises(ollama.ResponseError) as missing:
        api.chat(model="no-such-model:7b", messages=QUESTION)
    assert missing.value.status_code == 404


def test_ollama_pull_from_the_hub_with_progress_then_copy_and_create_on_the_real_engine(
    smol_home: None,  # noqa: F811
    hub: LoopbackHub,  # noqa: F811
    lemon_home: Path,
) -> None:
    pulled = f"hf.co/{REPO}:Q4_1"
    with serving() as served:
        api = ollama.Client(host=served.url, timeout=120)
        try:
            parts = list(api.pull(pulled, stream=True))
            listed = sorted(m.model or "" for m in api.list().models)
            name = next(m for m in listed if m.startswith("user.SmolLM2")).removesuffix(":latest")
            options = {"llamacpp_backend": "system", "ctx_size": 2048}
            saved = httpx.post(f"{served.url}/api/v1/models/{name}/options", json=options, trust_env=False)
            reply = api.chat(model=pulled, messages=QUESTION, options={"temperature": 0, "num_predict": 16})
            api.copy(pulled, "smol-again")
            api.create(model="smol-short", from_="smol-again", parameters={"num_predict": 2})
            short = api.generate(model="smol-short", prompt="Count from one to ten in words.")
            after = sorted(m.model or "" for m in api.list().models)
        finally:
            api.close()
    statuses = [p.status or "" for p in parts]
    assert statuses[0] == "pulling manifest" and statuses[-1] == "success"
    layers = [p for p in parts if (p.status or "").startswith("pulling ") and p.digest]
    size = len(hub.repos[REPO].files[GGUF_FILE])
    assert layers and {p.digest for p in layers} == {f"sha256:{hub.repos[REPO].sha256(GGUF_FILE)}"}
    assert layers[-1].completed == layers[-1].total == size
    assert listed == sorted([f"{MODEL}:latest", f"{name}:latest"]) and saved.status_code == 200
    assert "Paris" in reply.message.content and reply.model == pulled
    assert after == sorted([*listed, "user.smol-again:latest", "user.smol-short:latest"])
    assert short.done_reason == "length" and short.eval_count == 2  # create's num_predict, by default
    assert engines_of(lemon_home) == []


def test_litellm_reaches_the_model_in_each_dialect(served_with_key: Serving) -> None:
    command = [sys.executable, "-m", "tests.support.litellm_client", served_with_key.url, KEY, MODEL]
    ran = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert ran.returncode == 0, ran.stderr
    lines = [line.removeprefix(RESULT) for line in ran.stdout.splitlines() if line.startswith(RESULT)]
    said = {got["provider"]: got for got in map(json.loads, lines)}
    assert set(said) == {"openai", "anthropic", "ollama_chat"}
    for provider, got in said.items():
        assert "Paris" in got["text"] and min(got["usage"]) > 0, (provider, got)
        assert len(got["pieces"]) > 1 and "Paris" in "".join(got["pieces"]), (provider, got)
        assert got["wrong key"] == "AuthenticationError", (provider, got)
