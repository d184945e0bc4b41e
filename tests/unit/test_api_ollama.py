"""Ollama's API against the stand-in engine (a real child process that answers like llama-server), with
the official `ollama` client and raw httpx: list, show, ps, chat and generate streamed and whole,
options, keep_alive 0, delete, the name rule, 501s, every error in Ollama's shape, hostile bodies, and
that Ollama's routes and Lemonade's /api/v1/ ones do not collide. The real engine is in
tests/integration/test_api_dialects.py."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.api.chat_events import Finish, Finished, Reasoning, Text, ToolCallArguments, ToolCallStart
from app.supervisor.api.ollama import keep_alive_unloads
from app.supervisor.api.ollama_chat import Reply, ndjson_line
from app.supervisor.router import Dialect, RequestFinished, RequestSource, Router, RouterEvent
from tests.support.hubserver import LoopbackHub
from tests.support.testrepos import BIG, big_files
from tests.unit.test_api import models, run_api

HI = [{"role": "user", "content": "hi"}]


@contextlib.asynccontextmanager
async def ollama_client(client: httpx.AsyncClient) -> AsyncIterator[ollama.AsyncClient]:
    """The official client for the server ``client`` talks to (it has __aexit__ but no __aenter__)."""
    api = ollama.AsyncClient(host=str(client.base_url), timeout=30)
    try:
        yield api
    finally:
        await api.close()


def test_list_show_ps_chat_generate_and_delete_with_the_ollama_client(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "alpha", tokens=4)
        seen: list[RouterEvent] = []
        router.subscribe(seen.append)
        async with ollama_client(client) as api:
            got: dict[str, Any] = {"listed": [m.model for m in (await api.list()).models]}
            shown = await api.show(f"{name}:latest")
            got["shown"] = (shown.capabilities, shown.details.format if shown.details else None)
            got["ps before"] = [m.model for m in (await api.ps()).models]
            pieces = [part async for part in await api.chat(model=name, messages=HI, stream=True)]
            got["streamed"] = "".join(p.message.content or "" for p in pieces)
            got["last"] = (pieces[-1].done, pieces[-1].done_reason, pieces[-1].eval_count)
            whole = await api.chat(model=f"{name}:latest", messages=HI, options={"num_predict": 2})
            got["whole"] = (
                whole.message.content,
                whole.done_reason,
                whole.eval_count,
                whole.prompt_eval_count,
            )
            generated = await api.generate(model=name, prompt="say it", system="briefly")
            got["generated"] = (generated.response, generated.done_reason)
            got["ps after"] = [m.model for m in (await api.ps()).models]
            got["telemetry"] = [f.source for f in seen if isinstance(f, RequestFinished)]
            got["deleted"] = (await api.delete(name)).status
            got["listed after"] = [m.model for m in (await api.list()).models]
            return got

    got = run_api(standin_settings, body)
    listed = got["listed"]
    assert len(listed) == 1 and listed[0].endswith(":latest")
    assert got["shown"] == (["completion"], "gguf")
    assert got["ps before"] == []
    assert got["streamed"] == "tok0 tok1 tok2 tok3 "
    assert got["last"] == (True, "stop", 4)
    assert got["whole"] == ("tok0 tok1 ", "length", 2, 1)  # the stand-in counts a prompt's words
    assert got["generated"] == ("tok0 tok1 tok2 tok3 ", "stop")
    assert got["ps after"] == listed
    assert got["telemetry"] == [RequestSource.API] * 3
    assert got["deleted"] == "success" and got["listed after"] == []


def test_stop_options_keep_alive_zero_and_a_load_request(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "alpha", reply="one two three four five")
        async with ollama_client(client) as api:
            got: dict[str, Any] = {}
            stopped = await api.chat(model=name, messages=HI, options={"stop": ["three"], "temperature": 0})
            got["stopped"] = (stopped.message.content, stopped.done_reason)
            got["loaded after chat"] = router.loaded()
            unload = await api.generate(model=name, keep_alive=0)
            got["unload"] = (unload.done_reason, router.loaded())
            load = await api.generate(model=name)
            got["load"] = (load.done_reason, router.loaded())
            await api.chat(model=name, messages=HI, keep_alive="0s")
            got["after keep_alive 0"] = router.loaded()
            return got

    got = run_api(standin_settings, body)
    assert got["stopped"] == ("one two ", "stop")
    assert len(got["loaded after chat"]) == 1
    assert got["unload"] == ("unload", [])
    assert got["load"] == ("load", got["loaded after chat"])
    assert got["after keep_alive 0"] == []


def test_root_version_and_the_name_rule(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "Alpha")
        async with ollama_client(client) as api:
            got: dict[str, Any] = {
                "root": ((r := await client.get("/")).status_code, r.text),
                "head": (await client.head("/")).status_code,
                "version": (await client.get("/api/version")).json(),
            }
            for given in (name, f"{name}:latest", name.lower(), f"{name}:7b"):
                try:
                    got[given] = (await api.show(given)).capabilities
                except ollama.ResponseError as err:
                    got[given] = err.status_code
            return got

    got = run_api(standin_settings, body)
    assert got.pop("root") == (200, "Ollama is running")
    assert got.pop("head") == 200
    assert set(got.pop("version")) == {"version"}
    assert list(got.values()) == [["completion"], ["completion"], ["completion"], 404]


def test_errors_have_ollamas_shape_and_nothing_collides(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "alpha")
        async with ollama_client(client) as api:
            got: dict[str, Any] = {}
            for call in ("chat", "generate"):
                try:
                    await getattr(api, call)(
                        model="nope", **({"messages": HI} if call == "chat" else {"prompt": "x"})
                    )
                except ollama.ResponseError as err:
                    got[call] = (err.status_code, "not found" in err.error)
            for path, method in (
                ("/api/push", "POST"),
                ("/api/create", "POST"),
                ("/api/blobs/sha256:00", "HEAD"),
                ("/api/nothing", "GET"),
                ("/api/chat", "GET"),
            ):
                response = await client.request(method, path)
                error = response.json()["error"] if method != "HEAD" else None
                assert method == "HEAD" or isinstance(error, str), response.text
                got[path] = response.status_code
            response = await client.post("/api/generate", json={"model": name, "prompt": "x", "raw": True})
            got["raw"] = (response.status_code, response.json()["error"])
            # Lemonade's /api/v1/ keeps OpenAI's shape; Ollama's unprefixed names are Ollama's.
            got["v1 unknown"] = set((await client.get("/api/v1/nothing")).json()["error"])
            got["v1 models"] = (await client.get("/api/v1/models")).json()["object"]
            got["v1 delete"] = (await client.post("/api/v1/delete", json={"model_name": "nope"})).status_code
            got["ollama delete"] = (
                await client.request("DELETE", "/api/delete", json={"model": "nope"})
            ).status_code
            return got

    got = run_api(standin_settings, body)
    assert got["chat"] == got["generate"] == (404, True)
    assert got["/api/push"] == got["/api/create"] == got["/api/blobs/sha256:00"] == 501
    assert got["/api/nothing"] == 404 and got["/api/chat"] == 405
    assert got["raw"][0] == 501 and "raw" in got["raw"][1]
    assert got["v1 unknown"] == {"message", "type", "code"}
    assert got["v1 models"] == "list"
    assert got["v1 delete"] == got["ollama delete"] == 404


def test_hostile_bodies_get_a_4xx_in_ollamas_shape(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[int], int]:
        (name,) = models(router, tmp_path, "alpha")
        hostile: list[bytes] = [
            b"\xff\xfe\x00garbage",
            b"[" * 100_000 + b"]" * 100_000,
            json.dumps({"model": ["x"]}).encode(),
            json.dumps({"model": "../../etc/passwd"}).encode(),
            json.dumps({"model": name, "messages": "hi", "prompt": 5}).encode(),
            json.dumps({"model": name, "messages": [{"role": 5}], "prompt": "x", "images": "x"}).encode(),
            json.dumps(
                {"model": name, "messages": [{"role": "user", "content": [1]}], "prompt": "x", "images": [5]}
            ).encode(),
            json.dumps({"model": name, "messages": HI, "prompt": "x", "options": []}).encode(),
            json.dumps(
                {"model": name, "messages": HI, "prompt": "x", "options": {"num_predict": "x"}}
            ).encode(),
            json.dumps({"model": name, "messages": HI, "prompt": "x", "options": {"stop": [1]}}).encode(),
            json.dumps(
                {"model": name, "messages": HI, "prompt": "x", "options": {"temperature": "hot"}}
            ).encode(),
            json.dumps({"model": name, "messages": HI, "prompt": "x", "format": 5}).encode(),
            json.dumps({"model": name, "messages": HI, "prompt": "x", "stream": "yes"}).encode(),
            json.dumps({"model": name, "messages": HI, "prompt": "x", "tools": {}}).encode(),
            json.dumps({"model": name, "messages": 5, "input": {}, "prompt": 5}).encode(),
        ]
        codes = []
        for i, raw in enumerate(hostile):
            paths = ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings"]
            for path in paths + ["/api/show"] * (i < 4):  # show reads the model's name only
                response = await client.post(path, content=raw)
                assert isinstance(response.json()["error"], str), (path, raw[:80], response.text)
                assert "Traceback" not in response.text
                codes.append(response.status_code)
        return codes, (await client.get("/api/v1/health")).status_code

    codes, health = run_api(standin_settings, body)
    assert all(400 <= c < 500 for c in codes), codes
    assert health == 200


@pytest.mark.parametrize("keep_alive", [0, "0", "0s", "0m"])
def test_keep_alive_zero_in_every_spelling_unloads(keep_alive: Any) -> None:
    assert keep_alive_unloads(keep_alive)
    assert not any(keep_alive_unloads(k) for k in ("5m", -1, None, False))


def test_tool_calls_come_whole_in_stream_and_reply(standin_settings: Settings, tmp_path: Path) -> None:
    call = {"name": "weather", "arguments": '{"city": "Paris"}'}
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}

    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[Any], Any, Any]:
        (name,) = models(router, tmp_path, "alpha", reply="Looking.", tool_call=call)
        async with ollama_client(client) as api:
            parts = [p async for p in await api.chat(model=name, messages=HI, tools=[tool], stream=True)]
            whole = await api.chat(model=name, messages=HI, tools=[tool])
            called = [*HI, whole.message.model_dump(exclude_none=True), {"role": "tool", "content": "Sunny"}]
            after = await api.chat(model=name, messages=called, tools=[tool])
        return parts, whole, after

    parts, whole, after = run_api(standin_settings, body)
    with_calls = [p for p in parts if p.message.tool_calls]
    assert len(with_calls) == 1 and not with_calls[0].done
    (streamed,) = with_calls[0].message.tool_calls or []
    assert (streamed.function.name, streamed.function.arguments) == ("weather", {"city": "Paris"})
    assert parts[-1].done and parts[-1].done_reason == "stop"
    assert whole.message.content == "Looking."
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []] == [
        ("weather", {"city": "Paris"})
    ]
    assert after.done  # the call and its result went back to the engine as OpenAI's messages


# --- pull, copy and create ---------------------------------------------------------------------------


def test_pull_from_the_hub_shows_ollamas_progress_and_the_model_is_listed(
    standin_settings: Settings, hub: LoopbackHub, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (local,) = models(router, tmp_path, "here")
        async with ollama_client(client) as api:
            here = [p.status async for p in await api.pull(f"{local}:latest", stream=True)]
            parts = [p async for p in await api.pull(f"hf.co/{BIG}:Q8_0", stream=True)]
            listed = [m.model for m in (await api.list()).models]
            again = await api.pull(f"hf.co/{BIG}:Q8_0")  # all here: one answer, "success"
            reply = await api.chat(model=f"hf.co/{BIG}:Q8_0", messages=HI)  # the name it was pulled by
            got: dict[str, Any] = {"parts": parts, "listed": listed, "again": again.status, "here": here}
            got["reply"] = (reply.done, reply.model)
            for name in ("llama3.2:1b", f"{BIG}:Q8_0", "hf.co/../x:Q4"):
                try:
                    await api.pull(name)
                except ollama.ResponseError as err:
                    got[name] = (err.status_code, err.error)
            raw = await client.post("/api/pull", json={"model": "hf.co/test-org/Nothing-GGUF:Q4_0"})
            got["no repo"] = (raw.status_code, set(raw.json()))
            return got

    got = run_api(standin_settings, body)
    statuses = [p.status for p in got["parts"]]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layers = [p for p in got["parts"] if (p.status or "").startswith("pulling ") and p.digest]
    by_digest: dict[str, list[Any]] = {}
    for part in layers:
        by_digest.setdefault(part.digest, []).append(part)
    files = {f"sha256:{hashlib.sha256(data).hexdigest()}": data for data in big_files().values()}
    q8 = f"sha256:{hashlib.sha256(big_files()['Big-Q8_0.gguf']).hexdigest()}"
    assert q8 in by_digest and set(by_digest) <= set(files)  # the GGUF (and the projector beside it)
    for digest, parts in by_digest.items():
        assert all(p.status == f"pulling {digest[7:19]}" and p.total == len(files[digest]) for p in parts)
        completed = [p.completed for p in parts]
        assert completed == sorted(completed) and completed[-1] == len(files[digest])
    assert len(by_digest[q8]) > 1  # progress as it came, not only the end
    assert sorted(got["listed"]) == ["user.Big-GGUF-Q8_0:latest", "user.here:latest"]
    assert got["again"] == "success"
    assert got["here"] == ["success"]  # imported from a file here: nothing to pull
    assert got["reply"] == (True, f"hf.co/{BIG}:Q8_0")
    status, said = got["llama3.2:1b"]
    assert status == 404 and "hf.co/ORG/REPO:QUANT" in said and "Ollama's library" in said
    assert got[f"{BIG}:Q8_0"][0] == 404  # Ollama reads ORG/REPO as a name of its own library
    assert got["hf.co/../x:Q4"][0] == 400
    assert got["no repo"][1] == {"error"} and 400 <= got["no repo"][0] < 600


def test_copy_and_create_make_user_models_and_refuse_what_they_cannot_keep(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "alpha", tokens=8)
        router.save_options(name, ModelOptions(backend="system", ctx_size=2048))
        async with ollama_client(client) as api:
            got: dict[str, Any] = {"copy": (await api.copy(name, "beta")).status}
            created = await api.create(
                model="gamma:latest", from_="beta", parameters={"num_ctx": 1024, "num_predict": 3}
            )
            got["create"] = created.status
            got["listed"] = sorted(m.model or "" for m in (await api.list()).models)
            got["options"] = {n: router.options(n) for n in ("user.beta", "user.gamma")}
            got["checkpoints"] = {n: router.catalog.models()[n].checkpoint for n in (name, "user.gamma")}
            reply = await api.chat(model="gamma", messages=HI)  # num_predict 3 is its default
            got["reply"] = (reply.message.content, reply.done_reason)
            for call, kwargs in (
                ("copy", {"source": name, "destination": "beta"}),  # exists already
                ("copy", {"source": "nope", "destination": "delta"}),
                ("create", {"model": "delta", "from_": name, "system": "Be brief."}),
                ("create", {"model": "delta", "from_": name, "parameters": {"top_k": 5}}),
                ("create", {"model": "delta", "files": {"x.gguf": "sha256:00"}}),
                ("create", {"model": "delta", "from_": name, "quantize": "q4_K_M"}),
                ("create", {"model": "delta:7b", "from_": name}),
            ):
                try:
                    await getattr(api, call)(**kwargs)
                    got[repr(kwargs)] = "accepted"
                except ollama.ResponseError as err:
                    got[repr(kwargs)] = (err.status_code, err.error)
            got["after"] = sorted(m.model or "" for m in (await api.list()).models)
            return got

    got = run_api(standin_settings, body)
    assert got["copy"] == got["create"] == "success"
    assert got["listed"] == ["user.alpha:latest", "user.beta:latest", "user.gamma:latest"]
    assert got["options"]["user.beta"] == ModelOptions(backend="system", ctx_size=2048)
    assert got["options"]["user.gamma"] == ModelOptions(backend="system", ctx_size=1024, max_tokens=3)
    assert len(set(got["checkpoints"].values())) == 1  # the same file, not a copy of it
    assert got["reply"] == ("tok0 tok1 tok2 ", "length")
    refusals = [v for k, v in got.items() if k.startswith("{")]
    assert [status for status, _ in refusals] == [400, 404, 501, 501, 501, 501, 400]
    assert "system prompt" in refusals[2][1] and "'top_k'" in refusals[3][1]
    assert "lemon-desk import" in refusals[4][1] and "quantiz" in refusals[5][1]
    assert got["after"] == got["listed"]


def test_create_keeps_only_what_a_load_or_a_request_takes_and_num_predict_minus_one_is_no_limit(
    standin_settings: Settings, tmp_path: Path
) -> None:
    refused = {
        '"num_ctx": 1000000000': "at most 16,777,216",
        '"num_ctx": 0': "or -1 for automatic",
        '"num_ctx": 2048.5': "positive number of tokens",
        '"temperature": NaN': "finite number of at least 0",
        '"temperature": Infinity': "finite number of at least 0",
        '"temperature": -1': "finite number of at least 0",
        '"top_p": NaN': "from 0 to 1",
        '"top_p": 1.5': "from 0 to 1",
        '"num_predict": 0': "or -1 (no limit)",
        '"num_predict": 4294967296': "from 1 to 2147483647",
    }

    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        (name,) = models(router, tmp_path, "alpha", tokens=8)
        got: dict[str, Any] = {}
        for parameter in refused:
            raw = f'{{"model": "gamma", "from": "{name}", "parameters": {{{parameter}}}}}'
            answer = await client.post("/api/create", content=raw)
            got[parameter] = (answer.status_code, answer.json())
        got["listed"] = sorted(n for n in router.catalog.models() if n.startswith("user."))
        async with ollama_client(client) as api:
            await api.create(model="gamma", from_=name, parameters={"num_predict": 3, "num_ctx": -1})
            got["options"] = router.options("user.gamma")
            short = await api.chat(model="gamma", messages=HI)
            unlimited = await api.chat(model="gamma", messages=HI, options={"num_predict": -1})
            got["replies"] = [(r.eval_count, r.done_reason) for r in (short, unlimited)]
        nan = await client.post(
            "/api/chat",
            content=f'{{"model": "{name}", "messages": {json.dumps(HI)}, "options": {{"min_p": NaN}}}}',
        )
        got["nan in a request"] = (nan.status_code, nan.json())
        return got

    got = run_api(standin_settings, body)
    for parameter, allowed in refused.items():
        status, answer = got[parameter]
        assert status == 400 and set(answer) == {"error"}, (parameter, answer)
        assert allowed in answer["error"] and "'parameters." in answer["error"], (parameter, answer)
    assert got["listed"] == ["user.alpha"]  # nothing was made of a refused create
    assert got["options"] == ModelOptions(backend="system", max_tokens=3)  # -1: automatic
    assert got["replies"] == [(3, "length"), (8, "stop")]
    assert got["nan in a request"] == (400, {"error": "'options.min_p' must be a finite number."})


def test_each_dialects_requests_are_tagged_with_it_in_stats_and_events(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> tuple[list[Any], list[Any]]:
        (name,) = models(router, tmp_path, "alpha")
        seen: list[RouterEvent] = []
        router.subscribe(seen.append)
        stats = []
        for path, request in (
            ("/v1/chat/completions", {"model": name, "messages": HI}),
            ("/api/v0/chat/completions", {"model": name, "messages": HI, "stream": True}),
            ("/api/v1/messages", {"model": name, "messages": HI, "max_tokens": 4}),
            ("/api/generate", {"model": name, "prompt": "hi"}),
            ("/api/embed", {"model": "nope", "input": "x"}),  # refused: no reply, no tag
        ):
            await client.post(path, json=request)
            stats.append((await client.get("/api/v1/stats")).json()["dialect"])
        finished = [
            (e.dialect, e.card.dialect if e.card else None) for e in seen if isinstance(e, RequestFinished)
        ]
        return stats, finished

    stats, finished = run_api(standin_settings, body)
    assert stats == ["openai", "lemonade", "anthropic", "ollama", "ollama"]
    dialects = [Dialect.OPENAI, Dialect.LEMONADE, Dialect.ANTHROPIC, Dialect.OLLAMA]
    assert finished == [(d, d.value) for d in dialects]  # each with its run card, tagged the same


def test_a_pull_paused_in_the_app_ends_with_an_error_not_success(
    standin_settings: Settings, hub: LoopbackHub, tmp_path: Path
) -> None:
    """Paused in the app mid-pull (the download is kept, to resume): the pull's client is told so in
    Ollama's shape, not told "success" for a model that is not there."""
    for revision in ("main", hub.repos[BIG].commit):
        hub.served.throttle[hub.file_path(BIG, "Big-Q8_0.gguf", revision)] = 20_000

    async def body(router: Router, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        lines: list[dict[str, Any]] = []
        async with client.stream("POST", "/api/pull", json={"model": f"hf.co/{BIG}:Q8_0"}) as response:
            async for line in response.aiter_lines():
                lines.append(json.loads(line))
                if lines[-1].get("completed"):
                    await router.pause_download("user.Big-GGUF-Q8_0")
        return lines

    lines = run_api(standin_settings, body)
    assert not any(line.get("status") == "success" for line in lines), lines
    assert "paused in the app" in lines[-1]["error"] and "Resume it" in lines[-1]["error"]


@pytest.mark.parametrize("chat", [True, False])
def test_each_streamed_line_is_its_dicts_json_and_a_reads_lines_share_their_time(chat: bool) -> None:
    reply = Reply('a "model"', chat, 0.0)
    batch = [
        Reasoning("so"),
        Text("Grüße\n"),
        ToolCallStart(0, "c", "get"),
        ToolCallArguments(0, "{}"),
        Text("🍋"),
    ]
    before = datetime.now(UTC)
    raw = reply.feed(batch)
    after = datetime.now(UTC)
    lines = [json.loads(line) for line in raw.splitlines()]
    when = datetime.fromisoformat(lines[0]["created_at"])
    assert before - timedelta(microseconds=1) <= when <= after and lines[0]["created_at"].endswith("Z")
    # Formatted, not encoded from a dict: the same bytes the dict would have been.
    assert raw == b"".join(ndjson_line(line) for line in lines)
    assert len({line["created_at"] for line in lines}) == 1
    said = [(line["message"] if chat else line) for line in lines]
    key = "content" if chat else "response"
    assert [(piece[key], piece.get("thinking")) for piece in said] == [
        ("", "so"),
        ("Grüße\n", None),
        ("🍋", None),
    ]
    assert all(line["model"] == 'a "model"' and line["done"] is False for line in lines)
    whole = reply.whole(Finished(Finish.TOOL_CALLS, None, 1, 4))
    assert (whole["message"] if chat else whole)[key] == "Grüße\n🍋"
