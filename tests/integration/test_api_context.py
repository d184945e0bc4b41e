"""A prompt longer than the model's context, through the local API's three dialects with their official
clients, against `lemon-desk serve` on the real llama-server with a context of 512 tokens: each client
gets the engine's refusal in plain words as its own kind of bad-request error, nothing cut."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import ollama
import openai
import pytest

from app.store.model_options import ModelOptions, save_model_options
from tests.integration.conftest import engines_of
from tests.integration.test_api_openai import MODEL, smol_home  # noqa: F401 -- a fixture
from tests.support.serve import Serving, serving

pytestmark = pytest.mark.integration

TOO_LONG = [{"role": "user", "content": "apple " * 700}]
SAID = "The chat is too long for the model: it needs"


@pytest.fixture
def served_small(smol_home: None, lemon_home: Path) -> Iterator[Serving]:  # noqa: F811
    save_model_options({MODEL: ModelOptions(backend="system", ctx_size=512)})
    with serving() as running:
        yield running
    assert engines_of(lemon_home) == []


def test_each_dialect_returns_the_engines_refusal_in_its_own_shape(served_small: Serving) -> None:
    with openai.OpenAI(base_url=f"{served_small.url}/v1", api_key="none", max_retries=0, timeout=120) as api:
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(model=MODEL, messages=TOO_LONG, max_tokens=8)  # type: ignore[arg-type]
        error = refused.value.body
        assert isinstance(error, dict) and error["code"] == "engine_refused", error
        assert SAID in error["message"] and "context holds 512" in error["message"]

    with anthropic.Anthropic(base_url=served_small.url, api_key="none", max_retries=0, timeout=120) as claude:
        with pytest.raises(anthropic.BadRequestError) as declined:
            claude.messages.create(model=MODEL, max_tokens=8, messages=TOO_LONG)  # type: ignore[arg-type]
        body = declined.value.body
        assert isinstance(body, dict) and body["type"] == "error", body
        assert body["error"]["type"] == "invalid_request_error" and SAID in body["error"]["message"]

    llama = ollama.Client(host=served_small.url, timeout=120)
    try:
        with pytest.raises(ollama.ResponseError) as answered:
            llama.chat(model=MODEL, messages=TOO_LONG, options={"num_predict": 8})
        assert answered.value.status_code == 400 and SAID in answered.value.error
    finally:
        llama.close()
