"""OpenAI fidelity of the local API against the stand-in engine (a real child process that answers like
llama-server), with raw httpx: where a reply's reasoning goes (per request, per model), what an engine
cannot do refused before it is touched, unknown routes in every dialect, and the models' real times."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import httpx

from app.core.models import Model
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.support.hubserver import LoopbackHub
from tests.support.standin import make_standin_model
from tests.unit.test_api import SYSTEM, error_of, models, run_api
from tests.unit.test_api_lemonade import VISION

CHAT = "/v1/chat/completions"
THOUGHT = "the user greets me"
HI = [{"role": "user", "content": "hi"}]


def streamed(text: str) -> tuple[str, str]:
    """A chat stream's content and reasoning_content, each joined."""
    content, reasoning = [], []
    for line in text.splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:])["choices"]:
                delta = choice["delta"]
                content.append(delta.get("content") or "")
                reasoning.append(delta.get("reasoning_content") or "")
    return "".join(content), "".join(reasoning)


def whole(answer: httpx.Response) -> tuple[str, str | None]:
    message = answer.json()["choices"][0]["message"]
    return message["content"], message.get("reasoning_content")


def test_reasoning_goes_where_the_request_or_the_models_option_says(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "thinker", reply="Hello there", reasoning=THOUGHT)
        got: dict[str, Any] = {}
        for fmt in (None, "separate", "inline", "hidden", "none", "deepseek"):
            ask = {"model": name, "messages": HI, **({"reasoning_format": fmt} if fmt else {})}
            got[fmt, "whole"] = whole(await client.post(CHAT, json=ask))
            got[fmt, "stream"] = streamed((await client.post(CHAT, json={**ask, "stream": True})).text)
        bad = await client.post(CHAT, json={"model": name, "messages": HI, "reasoning_format": "loud"})
        got["bad"] = bad.status_code, error_of(bad)["message"]
        saved = await client.post(f"/api/v1/models/{name}/options", json={"reasoning_format": "hidden"})
        got["saved"] = saved.json()["saved"]
        got["by model"] = whole(await client.post(CHAT, json={"model": name, "messages": HI}))
        ask = {"model": name, "messages": HI, "reasoning_format": "separate"}
        got["request over model"] = whole(await client.post(CHAT, json=ask))
        message = await client.post("/v1/messages", json={"model": name, "max_tokens": 50, "messages": HI})
        got["anthropic"] = [block["type"] for block in message.json()["content"]]
        return got

    got = run_api(standin_settings, body)
    for way in ("whole", "stream"):
        # By default, and as llama-server's own names say: in reasoning_content.
        assert got[None, way] == got["separate", way] == got["deepseek", way] == ("Hello there", THOUGHT)
        assert (
            got["inline", way]
            == got["none", way]
            == (f"<think>{THOUGHT}</think>Hello there", "" if way == "stream" else None)
        )
        assert got["hidden", way] == ("Hello there", "" if way == "stream" else None)
    assert got["bad"][0] == 400 and "separate, inline, hidden" in got["bad"][1]
    assert got["saved"] == {"llamacpp_backend": "system", "reasoning_format": "hidden"}
    assert got["by model"] == ("Hello there", None)
    assert got["request over model"] == ("Hello there", THOUGHT)
    assert got["anthropic"] == ["thinking", "text"]  # another dialect's place for it, whatever the option


def test_what_the_engine_cannot_do_is_a_400_naming_the_model_before_it_is_loaded(
    standin_settings: Settings, tmp_path: Path
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    looking = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}

    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (gguf,) = models(router, tmp_path, "texty")
        mlx = router.register(Model("user.mlxy", "lemon-mlx", "org/mlxy-4bit", user=True)).name
        got: dict[str, Any] = {}
        for label, ask in {
            "image": {"model": gguf, "messages": looking},
            "image streamed": {"model": gguf, "messages": looking, "stream": True},
            "json_object on mlx": {"model": mlx, "messages": HI, "response_format": {"type": "json_object"}},
            "json_schema on mlx": {"model": mlx, "messages": HI, "response_format": schema, "stream": True},
        }.items():
            answer = await client.post(CHAT, json=ask)
            got[label] = answer.status_code, error_of(answer)
        got["loaded"] = router.loaded()
        ok = {"model": gguf, "messages": HI, "response_format": schema}
        got["json_schema on llama.cpp"] = (await client.post(CHAT, json=ok)).status_code
        return got

    got = run_api(standin_settings, body)
    for label in ("image", "image streamed"):
        status, error = got[label]
        assert status == 400 and error["code"] == "image_not_supported" and "user.texty" in error["message"]
    for label in ("json_object on mlx", "json_schema on mlx"):
        status, error = got[label]
        assert status == 400 and error["code"] == "unsupported_response_format"
        assert "user.mlxy" in error["message"] and "lemon-mlx" in error["message"]
    assert got["loaded"] == []  # refused before any engine was started
    assert got["json_schema on llama.cpp"] == 200


def test_unknown_routes_are_404_in_each_dialect(standin_settings: Settings) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, httpx.Response]:
        paths = ["/v1/nope", "/api/v1/nope", "/api/nope", "/v1/messages/nope", "/nope"]
        return {path: await client.get(path) for path in paths} | {
            "POST /api/nope": await client.post("/api/nope")
        }

    got = run_api(standin_settings, body)
    assert {path: r.status_code for path, r in got.items()} == dict.fromkeys(got, 404)
    assert error_of(got["/v1/nope"])["code"] == "not_found"
    assert error_of(got["/api/v1/nope"])["code"] == "not_found"
    assert set(got["/api/nope"].json()) == {"error"}  # Ollama's shape: {"error": "..."}
    assert got["/v1/messages/nope"].json()["type"] == "error"  # Anthropic's


def test_models_are_listed_with_the_time_they_came_here(standin_settings: Settings, tmp_path: Path) -> None:
    made = 1_650_000_000

    async def body(router: Router, client: httpx.AsyncClient) -> tuple[Any, Any, Any]:
        path = make_standin_model(tmp_path / "files", "dated")
        os.utime(path, (made, made))
        model = router.library.import_path(path)
        router.save_options(model.name, SYSTEM)
        listed = (await client.get("/v1/models")).json()["data"]
        one = (await client.get(f"/v1/models/{model.name}")).json()
        every = (await client.get("/v1/models?show_all=true")).json()["data"]
        return listed, one, every

    listed, one, every = run_api(standin_settings, body)
    assert [(m["id"], m["created"]) for m in listed] == [("user.dated", made)]
    assert one["created"] == made
    assert all(isinstance(m["created"], int) and m["created"] > 0 for m in every)


def test_a_model_with_its_projector_takes_images_and_says_when_it_was_downloaded(
    standin_settings: Settings, hub: LoopbackHub
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    looking = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]

    async def body(router: Router, client: httpx.AsyncClient) -> tuple[int, int, Any]:
        before = int(time.time())
        pulled = await client.post("/api/v1/pull", json=VISION)
        assert pulled.status_code == 200, pulled.text
        router.save_options("user.Big-Vision", SYSTEM)
        answer = await client.post(CHAT, json={"model": "user.Big-Vision", "messages": looking})
        assert answer.status_code == 200, answer.text
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        return before, int(time.time()), listed["user.Big-Vision"]["created"]

    before, after, created = run_api(standin_settings, body)
    assert before - 1 <= created <= after  # when its files came, not a fixed date
