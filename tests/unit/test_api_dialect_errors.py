"""The failures behind the API (a wrong key, the loading policy, an engine that cannot start, an engine's
reply that cannot be read) in the Anthropic and Ollama dialects, against the stand-in engine with raw
httpx: each with the status the dialect uses for it and the body in its shape. The request's own mistakes
and hostile bodies are in tests/unit/test_api_anthropic.py and test_api_ollama.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.standin import make_standin_model
from tests.unit.test_api import SYSTEM, models, run_api

HI = [{"role": "user", "content": "hi"}]
KEY = "s3cret"
NOT_JSON = {"name": "weather", "arguments": "{not json"}


def anthropic(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"} and "Traceback" not in response.text, body
    return response.status_code, body["error"]["type"], body["error"]["message"]


def ollama(response: httpx.Response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    assert "Traceback" not in response.text
    return response.status_code, body["error"]


def test_each_failure_behind_the_api_has_each_dialects_status_and_shape(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        broken = router.library.import_path(make_standin_model(tmp_path, "broken", crash_on_load=True)).name
        router.save_options(broken, SYSTEM)
        (garbled,) = models(router, tmp_path, "garbled", tool_call=NOT_JSON)
        pinned, other = models(router, tmp_path, "pinned", "other")

        def messages(model: str, **extra: Any) -> dict[str, Any]:
            return {"model": model, "max_tokens": 20, "messages": HI, **extra}

        def chat(model: str, **extra: Any) -> dict[str, Any]:
            return {"model": model, "messages": HI, "stream": False, **extra}

        wrong = {"Authorization": "Bearer wrong"}
        got: dict[str, Any] = {
            "anthropic key": anthropic(
                await client.post("/v1/messages", json=messages(other), headers=wrong)
            ),
            "ollama key": ollama(await client.post("/api/chat", json=chat(other), headers=wrong)),
            "anthropic engine": anthropic(await client.post("/v1/messages", json=messages(broken))),
            "ollama engine": ollama(await client.post("/api/chat", json=chat(broken))),
            "anthropic garbled": anthropic(await client.post("/v1/messages", json=messages(garbled))),
            "ollama garbled": ollama(await client.post("/api/chat", json=chat(garbled))),
        }
        load = await client.post("/api/v1/load", json={"model_name": pinned, "pinned": True})
        assert load.status_code == 200, load.text
        got["anthropic policy"] = anthropic(await client.post("/v1/messages", json=messages(other)))
        got["ollama policy"] = ollama(await client.post("/api/chat", json=chat(other)))
        return got

    got = run_api(standin_settings, body, key=KEY, auth=KEY)
    said = {k: v[-1] for k, v in got.items()}
    statuses = {k: v[:-1] for k, v in got.items()}
    assert statuses == {
        "anthropic key": (401, "authentication_error"),
        "ollama key": (401,),
        "anthropic engine": (529, "overloaded_error"),  # Anthropic's "cannot answer now"
        "ollama engine": (503,),
        "anthropic garbled": (500, "api_error"),  # the engine failed the request
        "ollama garbled": (502,),
        "anthropic policy": (400, "invalid_request_error"),  # Anthropic has no 409
        "ollama policy": (409,),
    }
    for dialect in ("anthropic", "ollama"):
        assert "API key" in said[f"{dialect} key"]
        assert "exited while loading broken.gguf" in said[f"{dialect} engine"]  # with its last words
        assert "simulated load failure" in said[f"{dialect} engine"]
        assert "'weather' with arguments that are not a JSON object" in said[f"{dialect} garbled"]
        assert "pinned: user.pinned" in said[f"{dialect} policy"]
