"""The local API against Lemonade Server's documented API (docs/api/lemonade.md and openai.md in
lemonade-sdk/lemonade), with raw httpx on a real server: a ``pull`` that registers a ``user.`` model
from the loopback Hub and refuses bad definitions with a 400, ``models/register``, the ``stats``
totals, ``health``'s per-model fields, recipe options in each recipe's names with Lemonade's null
semantics, the model list's context fields, ``system-info``'s keys, ``system-stats``, ``/live`` and
the ``/v0`` prefixes. The engine is the stand-in (tests/support/standin.py)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.store.settings import Settings
from app.store.usermodels import user_models_path
from app.supervisor.router import Router
from tests.support.fileserver import Fault
from tests.support.hubserver import LoopbackHub
from tests.support.modelfiles import CONTEXT
from tests.support.testrepos import BIG, TINY_MLX
from tests.unit.test_api import HI, error_of, models, run_api

SYSTEM = {"llamacpp_backend": "system"}
VISION = {
    "model_name": "user.Big-Vision",
    "checkpoint": f"{BIG}:Q8_0",
    "recipe": "llamacpp",
    "mmproj": "mmproj-Big-f16.gguf",
    "vision": True,
    "reasoning": True,
}


async def sse(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        kind = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[6:])))
    return events


def user_models() -> dict[str, Any]:
    path = user_models_path()
    return dict(json.loads(path.read_text())["models"]) if path.exists() else {}


# --- pull registers a user model ---------------------------------------------------------------------


def test_pull_registers_a_user_model_downloads_it_and_loads_it_with_its_projector(
    standin_settings: Settings, hub: LoopbackHub
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> dict[str, Any]:
        events = await sse(client, "/api/v1/pull", {**VISION, "stream": True})
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        load = await client.post(
            "/api/v1/load", json={"model_name": "user.Big-Vision", **SYSTEM, "save_options": True}
        )
        reply = await client.post("/v1/chat/completions", json={"model": "user.Big-Vision", "messages": HI})
        health = (await client.get("/api/v1/health")).json()
        one = (await client.get("/v1/models/user.Big-Vision")).json()
        return {
            "events": events,
            "listed": listed,
            "load": load.status_code,
            "reply": reply.json(),
            "health": health,
            "one": one,
        }

    got = run_api(standin_settings, body)
    kinds = [kind for kind, _ in got["events"]]
    assert kinds[-1] == "complete" and set(kinds[:-1]) == {"progress"}
    assert got["events"][-1][1]["model_name"] == "user.Big-Vision"
    assert {data["file"] for kind, data in got["events"] if kind == "progress"} == {
        "Big-Q8_0.gguf",
        "mmproj-Big-f16.gguf",
    }
    model = got["listed"]["user.Big-Vision"]
    assert model["labels"] == ["reasoning", "vision"] and model["downloaded"] is True and model["size"] > 0
    assert model["recipe"] == "llamacpp" and model["checkpoint"] == f"{BIG}:Q8_0"
    saved = user_models()["user.Big-Vision"]
    assert saved["mmproj"] == "mmproj-Big-f16.gguf" and saved["labels"] == ["reasoning", "vision"]

    # Loaded with its projector, under its own name: replies say which model answered.
    assert got["load"] == 200
    assert got["reply"]["model"] == "user.Big-Vision"
    (loaded,) = got["health"]["all_models_loaded"]
    argv = loaded["launch_command"]
    assert argv[argv.index("--mmproj") + 1].endswith("mmproj-Big-f16.gguf")
    assert argv[argv.index("--alias") + 1] == "user.Big-Vision"
    assert got["one"]["max_context_window"] == CONTEXT and got["one"]["context_length"] == 4096
    assert got["one"]["recipe_options"] == SYSTEM


def test_pull_without_streaming_and_a_second_name_for_the_same_checkpoint(
    standin_settings: Settings, hub: LoopbackHub
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        base = {"checkpoint": f"{BIG}:Q8_0", "recipe": "llamacpp"}
        first = await client.post("/api/v1/pull", json={"model_name": "user.Big-A", **base})
        again = await client.post(
            "/api/v1/pull", json={"model_name": "user.Big-A", **base, "reasoning": True}
        )
        other = await client.post("/v1/pull", json={"model_name": "user.Big-B", **base, "embedding": True})
        listed = {m["id"]: m["labels"] for m in (await client.get("/v1/models")).json()["data"]}
        return [first.json(), again.json(), other.json(), listed]

    first, again, other, listed = run_api(standin_settings, body)
    assert first == {"status": "success", "message": "Installed model: user.Big-A"}
    assert again["status"] == other["status"] == "success"
    # The same definition pulled again keeps the model and takes the labels asked for.
    assert listed == {"user.Big-A": ["reasoning"], "user.Big-B": ["embeddings"]}


BAD_DEFINITIONS: list[tuple[str, dict[str, Any], str]] = [
    ("no checkpoint", {"model_name": "user.X", "recipe": "llamacpp"}, "'checkpoint' is required"),
    ("no recipe", {"model_name": "user.X", "checkpoint": f"{BIG}:Q8_0"}, "'recipe' is required"),
    ("unknown recipe", {"model_name": "user.X", "checkpoint": BIG, "recipe": "whispercpp"}, "whispercpp"),
    ("a space", {"model_name": "user.two words", "checkpoint": BIG, "recipe": "llamacpp"}, "model name"),
    ("a slash", {"model_name": "user.../etc", "checkpoint": BIG, "recipe": "llamacpp"}, "model name"),
    ("too long", {"model_name": "user." + "x" * 129, "checkpoint": BIG, "recipe": "llamacpp"}, "128"),
    ("not user.", {"model_name": "Mine", "checkpoint": f"{BIG}:Q8_0", "recipe": "llamacpp"}, "user.Mine"),
    (
        "not a ref",
        {"model_name": "user.X", "checkpoint": "../../etc/passwd", "recipe": "llamacpp"},
        "Hugging",
    ),
    (
        "modelscope",
        {"model_name": "user.X", "checkpoint": BIG, "recipe": "llamacpp", "source": "ms"},
        "source",
    ),
    (
        "two modes",
        {
            "model_name": "user.X",
            "checkpoint": BIG,
            "recipe": "llamacpp",
            "labels": ["embeddings"],
            "reranking": True,
        },
        "two modes",
    ),
    (
        "a mode not served",
        {"model_name": "user.X", "checkpoint": BIG, "recipe": "llamacpp", "labels": ["transcription"]},
        "cannot serve",
    ),
    (
        "mlx embeddings",
        {"model_name": "user.X", "checkpoint": TINY_MLX, "recipe": "lemon-mlx", "embedding": True},
        "cannot serve",
    ),
    (
        "mlx projector",
        {"model_name": "user.X", "checkpoint": TINY_MLX, "recipe": "lemon-mlx", "mmproj": "p.gguf"},
        "mmproj",
    ),
    (
        "projector path",
        {"model_name": "user.X", "checkpoint": BIG, "recipe": "llamacpp", "mmproj": "../p.gguf"},
        "mmproj",
    ),
    (
        "a draft",
        {"model_name": "user.X", "checkpoints": {"main": BIG, "draft": BIG}, "recipe": "llamacpp"},
        "draft",
    ),
    (
        "projector elsewhere",
        {"model_name": "user.X", "checkpoints": {"main": BIG, "mmproj": "a/b:p.gguf"}, "recipe": "llamacpp"},
        "one repo",
    ),
    (
        "vision as text",
        {"model_name": "user.X", "checkpoint": BIG, "recipe": "llamacpp", "vision": "yes"},
        "'vision'",
    ),
    (
        "labels as text",
        {"model_name": "user.X", "checkpoint": BIG, "recipe": "llamacpp", "labels": "chat"},
        "'labels'",
    ),
    (
        "checkpoint a list",
        {"model_name": "user.X", "checkpoint": [BIG], "recipe": "llamacpp"},
        "'checkpoint'",
    ),
    # Asked of the Hub: nothing there answers to these.
    ("no such variant", {"model_name": "user.X", "checkpoint": f"{BIG}:Q2_K", "recipe": "llamacpp"}, "Q2_K"),
    (
        "no such projector",
        {
            "model_name": "user.X",
            "checkpoint": f"{BIG}:Q8_0",
            "recipe": "llamacpp",
            "mmproj": "mmproj-x.gguf",
        },
        "projector",
    ),
    ("GGUF as MLX", {"model_name": "user.X", "checkpoint": BIG, "recipe": "lemon-mlx"}, "not an MLX model"),
]


@pytest.mark.parametrize(
    ("case", "definition", "said"), BAD_DEFINITIONS, ids=[c for c, _, _ in BAD_DEFINITIONS]
)
def test_a_bad_definition_is_a_400_naming_what_is_wrong_and_registers_nothing(
    standin_settings: Settings, hub: LoopbackHub, case: str, definition: dict[str, Any], said: str
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[tuple[int, dict[str, Any]]]:
        out = []
        for stream in (False, True):
            response = await client.post("/api/v1/pull", json={**definition, "stream": stream})
            out.append((response.status_code, error_of(response)))
        return out

    for status, error in run_api(standin_settings, body):
        assert status == 400, error
        assert said in error["message"], error
        assert error["type"] == "invalid_request_error"
    assert user_models() == {} and hub.byte_requests() == []


def test_a_pull_the_hub_cannot_answer_is_a_502_and_its_body_is_checked_first(
    standin_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    definition = {"model_name": "user.Big", "checkpoint": f"{BIG}:Q8_0", "recipe": "llamacpp"}

    async def body(router: Router, client: httpx.AsyncClient) -> list[httpx.Response]:
        bodies = [
            definition,
            {**definition, "stream": True},
            {**definition, "subscribe": "no"},
            {**definition, "stream": True, "subscribe": False},
        ]
        return [await client.post("/api/v1/pull", json=b) for b in bodies]

    whole, streamed, bad_subscribe, jobless = run_api(standin_settings, body)
    for unreachable in (whole, streamed):
        error = error_of(unreachable)
        assert unreachable.status_code == 502 and error["type"] == "server_error", error
        assert error["code"] == "hub_unreachable" and "Could not reach the Hugging Face" in error["message"]
    # Refused before the Hub is asked: a 400, not the 502 above.
    assert bad_subscribe.status_code == 400 and "'subscribe'" in error_of(bad_subscribe)["message"]
    assert jobless.status_code == 400 and error_of(jobless)["code"] == "unsupported"
    assert user_models() == {}


# The Hub's answer to the file list, and the pull's status, error code and what its message says.
HUB_ANSWERS: list[tuple[Fault, int, str, str]] = [
    (Fault(status=503), 502, "hub_unreachable", "HTTP 503"),
    (Fault(status=500), 502, "hub_unreachable", "HTTP 500"),
    (Fault(status=429, status_headers={"Retry-After": "7"}), 503, "hub_busy", "wait 7 seconds"),
    # About the request (no such repo, a gated one): still the client's to fix.
    (Fault(status=404), 400, "model_error", "does not exist on the Hugging Face Hub"),
    (Fault(status=401), 400, "model_error", "is gated"),
]


@pytest.mark.parametrize(
    ("fault", "status", "code", "said"), HUB_ANSWERS, ids=[f"HTTP {f.status}" for f, *_ in HUB_ANSWERS]
)
def test_a_pull_the_hub_fails_on_its_side_is_a_5xx(
    standin_settings: Settings, hub: LoopbackHub, fault: Fault, status: int, code: str, said: str
) -> None:
    """The Hub failing (5xx) or asking the app to slow down (429) is no fault of the request: a 502, or a
    503 saying when to try again; a missing or gated repo stays a 400."""
    definition = {"model_name": "user.Big", "checkpoint": f"{BIG}:Q8_0", "recipe": "llamacpp"}

    async def body(router: Router, client: httpx.AsyncClient) -> list[httpx.Response]:
        out = []
        for stream in (False, True):
            hub.served.arm(f"/api/models/{BIG}", fault)
            out.append(await client.post("/api/v1/pull", json={**definition, "stream": stream}))
        return out

    for response in run_api(standin_settings, body):
        error = error_of(response)
        assert (response.status_code, error["code"]) == (status, code), error
        assert said in error["message"], error
    assert user_models() == {} and hub.byte_requests() == []


# How the file's download fails, and what the error says.
DOWNLOAD_FAILURES: dict[str, tuple[list[Fault], str]] = {
    # Cut off, then 503 to the resume and its five retries.
    "cut off partway": (
        [Fault(cut_after=100_000)] + [Fault(status=503)] * 6,
        "failed after 5 retries: HTTP 503",
    ),
    "damaged twice": ([Fault(corrupt=True)] * 2, "arrived damaged twice"),
}


@pytest.mark.parametrize("case", list(DOWNLOAD_FAILURES))
def test_a_download_the_hub_fails_is_a_502(standin_settings: Settings, hub: LoopbackHub, case: str) -> None:
    """The download's own error (a DownloadError) reaches the API: a 502 download_failed, not a 400 as
    if the request were wrong; the router wrapped it in a ModelError."""
    faults, said = DOWNLOAD_FAILURES[case]
    for fault in faults:
        hub.arm(BIG, "Big-Q8_0.gguf", fault)
    definition = {"model_name": "user.Big", "checkpoint": f"{BIG}:Q8_0", "recipe": "llamacpp"}

    async def body(router: Router, client: httpx.AsyncClient) -> httpx.Response:
        await router.hub()
        router.downloads().backoff_s = 0.01
        return await client.post("/api/v1/pull", json=definition)

    response = run_api(standin_settings, body)
    error = error_of(response)
    assert (response.status_code, error["code"], error["type"]) == (502, "download_failed", "server_error")
    assert said in error["message"], error
    assert len(hub.requests_for(BIG, "Big-Q8_0.gguf")) == len(faults)


def test_a_name_registered_with_other_files_is_refused(standin_settings: Settings, hub: LoopbackHub) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        base = {"model_name": "user.Big", "recipe": "llamacpp"}
        registered = await client.post("/api/v1/models/register", json={**base, "checkpoint": f"{BIG}:Q8_0"})
        other = await client.post("/api/v1/pull", json={**base, "checkpoint": f"{BIG}:Q4_K_M"})
        unknown_user = await client.post("/api/v1/pull", json={"model_name": "user.Nothing"})
        unknown = await client.post("/api/v1/pull", json={"model_name": "Nothing"})
        catalog = {"model_name": "Qwen3-0.6B-GGUF", "checkpoint": f"{BIG}:Q8_0", "recipe": "llamacpp"}
        builtin = await client.post("/api/v1/pull", json=catalog)
        assert builtin.status_code == 400 and "already registered" in error_of(builtin)["message"]
        jobless = await client.post(
            "/api/v1/pull", json={"model_name": "user.Big", "stream": True, "subscribe": False}
        )
        return [
            registered.status_code,
            other.status_code,
            error_of(other)["message"],
            unknown_user,
            unknown,
            jobless,
        ]

    registered, status, message, unknown_user, unknown, jobless = run_api(standin_settings, body)
    assert jobless.status_code == 400 and error_of(jobless)["code"] == "unsupported"
    assert registered == 200 and status == 400
    assert "already registered" in message and "Q4_K_M" in message
    assert unknown_user.status_code == 400 and "'checkpoint'" in error_of(unknown_user)["message"]
    assert unknown.status_code == 404 and error_of(unknown)["code"] == "model_not_found"
    assert user_models()["user.Big"]["checkpoint"] == f"{BIG}:Q8_0"


def test_register_defines_without_downloading_and_pull_by_name_downloads(
    standin_settings: Settings, hub: LoopbackHub
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        definition = {"model_name": "user.Tiny", "checkpoint": TINY_MLX, "recipe": "lemon-mlx"}
        registered = (await client.post("/api/v1/models/register", json=definition)).json()
        fetched = hub.byte_requests()
        local = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        every = {m["id"]: m for m in (await client.get("/v1/models?show_all=true")).json()["data"]}
        pulled = await client.post("/api/v1/pull", json={"model_name": "user.Tiny"})
        after = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        return [registered, fetched, local, every["user.Tiny"], pulled.status_code, after]

    registered, fetched, local, listed, pulled, after = run_api(standin_settings, body)
    assert registered["status"] == "success" and registered["canonical_model_name"] == "user.Tiny"
    assert registered["model"]["id"] == "user.Tiny" and registered["model"]["downloaded"] is False
    assert fetched == [] and local == []
    assert listed["recipe"] == "lemon-mlx" and "size" not in listed  # unknown until its files are
    assert pulled == 200 and after == ["user.Tiny"]


# --- stats ---------------------------------------------------------------------------------------------


def test_stats_report_the_last_request_and_running_totals(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        (name,) = models(router, tmp_path, "alpha", tokens=3)
        before = (await client.get("/api/v1/stats")).json()
        prompt = "one two three four five six"
        await client.post("/v1/completions", json={"model": name, "prompt": prompt})
        # The same start again: the stand-in, like llama-server, takes it from its prefix cache.
        await client.post("/v1/completions", json={"model": name, "prompt": prompt + " seven eight"})
        return [before, (await client.get("/api/v1/stats")).json()]

    before, after = run_api(standin_settings, body)
    assert before["time_to_first_token"] is None and before["cache_tokens"] is None
    assert before["request_count_total"] == 0 and before["output_tokens_total"] == 0
    assert after["prompt_tokens"] == 8 and after["cache_tokens"] == 6 and after["input_tokens"] == 2
    assert after["output_tokens"] == 3 and after["tokens_per_second"] > 0
    assert after["request_count_total"] == 2
    assert after["prompt_tokens_total"] == 6 + 8 and after["cache_tokens_total"] == 6
    assert after["input_tokens_total"] == 6 + 2 and after["output_tokens_total"] == 6


# --- health --------------------------------------------------------------------------------------------


def test_health_gives_each_loaded_models_use_busy_and_streaming_state(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        (name,) = models(router, tmp_path, "alpha", tokens=200, token_delay_s=0.01)
        await client.post("/api/v1/load", json={"model_name": name, "ctx_size": 2048, "pinned": True})
        idle = (await client.get("/api/v1/health")).json()
        request = {"model": name, "messages": HI, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for _ in response.aiter_bytes():
                break
            during = (await client.get("/api/v1/health")).json()
        return [idle, during]

    idle, during = run_api(standin_settings, body)
    (model,) = idle["all_models_loaded"]
    assert abs(model["last_use"] - time.time()) < 30
    assert model["is_busy"] is False and model["is_streaming"] is False
    assert model["type"] == "llm" and model["pinned"] is True and model["device"] in ("cpu", "gpu")
    assert model["backend_url"].startswith("http://127.0.0.1:") and model["backend_url"].endswith("/v1")
    assert model["launch_command"][model["launch_command"].index("--ctx-size") + 1] == "2048"
    assert model["recipe_options"] == {"ctx_size": 2048, "llamacpp_backend": "system", "llamacpp_args": ""}
    assert idle["pinned_models"] == {"llm": 1, "embedding": 0, "reranking": 0}
    (streaming,) = during["all_models_loaded"]
    assert streaming["is_busy"] is True and streaming["is_streaming"] is True


# --- recipe options ------------------------------------------------------------------------------------


def test_options_of_a_lemon_mlx_model_take_its_names_and_refuse_llamacpps(
    standin_settings: Settings, hub: LoopbackHub
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        definition = {"model_name": "user.Tiny", "checkpoint": TINY_MLX, "recipe": "lemon-mlx"}
        await client.post("/api/v1/models/register", json=definition)
        path = "/api/v1/models/user.Tiny/options"
        read = (await client.get(path)).json()
        foreign = await client.post(path, json={"llamacpp_args": "--no-mmap"})
        foreign_load = await client.post(
            "/api/v1/load", json={"model_name": "user.Tiny", "llamacpp_backend": "cpu"}
        )
        preview = (await client.post(path, json={"ctx_size": 8192, "dry_run": True})).json()
        saved = (
            await client.post(path, json={"lemon_mlx_backend": "mlx-lm", "lemon_mlx_args": "--x 1"})
        ).json()
        pinned = await client.post(path, json={"pinned": True})
        return [read, foreign, foreign_load, preview, saved, pinned]

    read, foreign, foreign_load, preview, saved, pinned = run_api(standin_settings, body)
    assert set(read["effective"]) == {"model_name", "ctx_size", "lemon_mlx_backend", "lemon_mlx_args"}
    assert read["recipe"] == "lemon-mlx" and read["saved"] == {} and read["resolved_ctx_size"] is None
    for refused in (foreign, foreign_load):
        assert refused.status_code == 400
        error = error_of(refused)
        assert error["code"] == "wrong_recipe_option" and "lemon_mlx_" in error["message"]
    # dry_run shows what a save would make and saves nothing.
    assert preview["effective"]["ctx_size"] == 8192 and preview["resolved_ctx_size"] == 8192
    assert preview["saved"] == {}
    assert saved["saved"] == {"lemon_mlx_backend": "mlx-lm", "lemon_mlx_args": "--x 1"}
    assert pinned.status_code == 400 and error_of(pinned)["code"] == "unknown_option"


def test_a_null_option_on_load_ignores_the_saved_value_for_that_load_only(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        (name,) = models(router, tmp_path, "alpha")
        path = f"/api/v1/models/{name}/options"
        await client.post(path, json={"ctx_size": 1024, "llamacpp_args": "--batch-size 64"})

        async def launched() -> list[str]:
            health = (await client.get("/api/v1/health")).json()
            return list(health["all_models_loaded"][0]["launch_command"])

        await client.post("/api/v1/load", json={"model_name": name, "ctx_size": None})
        defaults = await launched()
        await client.post(
            "/api/v1/load",
            json={"model_name": name, "llamacpp_args": None, "ctx_size": 512, "save_options": True},
        )
        overridden = await launched()
        saved = (await client.get(path)).json()["saved"]
        reserved = await client.post(path, json={"llamacpp_args": "--port 1"})
        cleared = (await client.post(path, json={"ctx_size": None})).json()["saved"]
        too_big = await client.post(path, json={"ctx_size": 99999999999999})
        return [defaults, overridden, saved, reserved, cleared, too_big]

    defaults, overridden, saved, reserved, cleared, too_big = run_api(standin_settings, body)
    assert too_big.status_code == 400
    assert error_of(too_big)["message"].startswith(
        "'ctx_size' must be a positive number of tokens, at most 16,777,216, or -1 for automatic."
    )
    assert defaults[defaults.index("--ctx-size") + 1] == "4096" and "--batch-size" in defaults
    assert overridden[overridden.index("--ctx-size") + 1] == "512" and "--batch-size" not in overridden
    # save_options keeps the values given; a null leaves the saved one as it was.
    assert saved == {"ctx_size": 512, "llamacpp_backend": "system", "llamacpp_args": "--batch-size 64"}
    assert reserved.status_code == 400 and "--port" in error_of(reserved)["message"]
    # On the options route a null removes what was saved.
    assert cleared == {"llamacpp_backend": "system", "llamacpp_args": "--batch-size 64"}


@pytest.mark.parametrize("args", ["--foo \u0000", "--threads\u001b1"])
def test_extra_arguments_holding_a_control_character_are_a_400_and_nothing_is_loaded(
    standin_settings: Settings, tmp_path: Path, args: str
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        (name,) = models(router, tmp_path, "alpha")
        load = await client.post("/api/v1/load", json={"model_name": name, "llamacpp_args": args})
        saved = await client.post(f"/api/v1/models/{name}/options", json={"llamacpp_args": args})
        health = (await client.get("/api/v1/health")).json()
        return [load, saved, health["all_models_loaded"]]

    load, saved, loaded = run_api(standin_settings, body)
    for response in (load, saved):
        assert response.status_code == 400
        assert "extra engine arguments hold a control character" in error_of(response)["message"]
    assert loaded == []


# --- models, system, routes ----------------------------------------------------------------------------


def test_models_list_lemonades_fields(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        (name,) = models(router, tmp_path, "alpha")
        await client.post(f"/api/v1/models/{name}/options", json={"ctx_size": 3072})
        listed = (await client.get("/v1/models")).json()["data"]
        await client.post("/api/v1/load", json={"model_name": name, "ctx_size": 2048})
        loaded = (await client.get(f"/api/v0/models/{name}")).json()
        return [listed, loaded]

    (listed,), loaded = run_api(standin_settings, body)
    assert listed["owned_by"] == "lemonade"
    assert listed["context_length"] == 3072 and listed["max_context_window"] == 2048
    assert loaded["context_length"] == 2048  # what the running engine was started with
    assert loaded["recipe_options"] == {"ctx_size": 3072, "llamacpp_backend": "system"}


def test_system_info_system_stats_live_and_the_v0_prefixes(standin_settings: Settings) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[Any]:
        info = (await client.get("/api/v1/system-info")).json()
        stats = (await client.get("/api/v1/system-stats")).json()
        live = await client.get("/live")
        head = await client.head("/live")
        v0 = [(await client.get(f"{p}/health")).status_code for p in ("/v0", "/api/v0")]
        return [info, stats, live, head.status_code, v0]

    info, stats, live, head, v0 = run_api(standin_settings, body)
    assert {"OS Version", "Processor", "Physical Memory", "model_storage", "devices", "recipes"} <= set(info)
    assert {"hardware"} <= set(info)  # ours, as `lemon-desk system-info --json` prints it, stays
    storage = info["model_storage"]
    assert storage["total_bytes"] >= storage["free_bytes"] > 0 and storage["path"]
    assert info["devices"]["cpu"]["available"] is True and info["devices"]["cpu"]["threads"] > 0
    for support in info["recipes"].values():
        for backend in support["backends"].values():
            assert {"state", "message", "devices", "action"} <= set(backend)
            if backend["state"] == "installable":
                assert backend["action"].startswith("lemon-desk backends install ")
            if backend["state"] == "unsupported":
                assert backend["devices"] == []
    assert {"cpu_percent", "memory_gb", "gpu_percent", "vram_gb"} <= set(stats)
    assert live.status_code == 200 and live.json() == {"status": "ok"} and head == 200
    assert v0 == [200, 200]


def test_embeddings_and_reranking_bodies_are_checked_and_reranker_is_an_alias(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[int]:
        (name,) = models(router, tmp_path, "alpha")
        embed = {"model": name}
        rerank = {"model": name, "query": "q"}
        return [
            (await client.post("/v1/embeddings", json=embed)).status_code,
            (await client.post("/v1/embeddings", json={**embed, "input": 7})).status_code,
            (await client.post("/v1/reranker", json=rerank)).status_code,
            (await client.post("/v1/reranker", json={**rerank, "documents": [1]})).status_code,
            (
                await client.post(
                    "/v1/chat/completions", json={**embed, "messages": HI, "repeat_penalty": "x"}
                )
            ).status_code,
            (await client.post("/v1/reranker", json={**rerank, "documents": ["d"]})).status_code,
        ]

    # The last: well formed, for a model not labelled for reranking.
    assert run_api(standin_settings, body) == [400, 400, 400, 400, 400, 400]


@pytest.mark.parametrize("prefix", ["/v1", "/api/v1", "/v0", "/api/v0"])
def test_every_prefix_serves_every_route(standin_settings: Settings, prefix: str) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> list[int]:
        gets = ("models", "health", "stats", "system-stats")
        return [(await client.get(f"{prefix}/{path}")).status_code for path in gets]

    assert run_api(standin_settings, body) == [200] * 4


def test_streaming_marks_clear_when_the_reader_goes(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router, client: httpx.AsyncClient) -> bool:
        (name,) = models(router, tmp_path, "alpha", tokens=2000, token_delay_s=0.01)
        request = {"model": name, "messages": HI, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=request) as response:
            async for _ in response.aiter_bytes():
                break
        for _ in range(500):
            if not router.streaming(name) and not router.busy(name):
                return True
            await asyncio.sleep(0.01)
        return False

    assert run_api(standin_settings, body)
