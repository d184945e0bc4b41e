"""lemon-mlx's rules against the REAL engine: lemon-mlx-engine b1050-stable's Linux CPU ``server``, built
from pinned sources (tests/support/lemon_mlx_engine.py) and served as its release asset by a loopback
mirror, running a tiny Qwen3-shaped MLX model whose reply is known (tests/support/qwen3_model.py) from
the Hugging Face cache under the real repo id. The app's installer, supervisor and client are its real
code. Facts the tests pin are written down in docs/lemon-mlx-engine.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import psutil
import pytest

from app.client.adapters import Route
from app.client.events import ChatDelta, ChatDone
from app.client.sse import SSEParser
from app.core.engine_state import EngineState
from app.core.errors import EngineError, UnsupportedRequestError
from app.core.launch import LaunchRequest
from app.store.catalog import load_backend_versions
from app.store.installs import read_manifest
from app.store.model_options import ModelOptions, save_model_options
from app.supervisor.engine import Engine
from tests.conftest import profile_path
from tests.integration.conftest import OpenAIs, lemon_desk
from tests.integration.mlx.test_lemon_mlx_engine import cpu_x86
from tests.support.fileserver import Served, serve
from tests.support.lemon_mlx_engine import lemon_mlx_engine_zip
from tests.support.lemon_mlx_release import lay_out_hf_cache
from tests.support.mlx_env import qwen3_mlx_model, tiny_mlx_model
from tests.support.serve import serving

pytestmark = pytest.mark.integration
T = TypeVar("T")

REPO = "mlx-community/Qwen3-0.6B-4bit"  # the catalog's Qwen3-0.6B-MLX, here holding the tiny Qwen3
CATALOG_NAME = "Qwen3-0.6B-MLX"
HELLO = [{"role": "user", "content": "Hello"}]


@dataclass(frozen=True)
class Qwen3:
    folder: Path
    text: str  # its whole reply, "<think>...</think>" included
    tokens: list[str]  # the reply's tokens, as the engine counts them


@pytest.fixture(scope="session")
def engine_zip() -> Path:
    return lemon_mlx_engine_zip()


@pytest.fixture(scope="session")
def qwen3() -> Qwen3:
    folder = qwen3_mlx_model()
    reply = json.loads((folder / "reply.json").read_text())
    return Qwen3(folder, reply["text"], reply["tokens"])


def release_files(zip_bytes: bytes, digest: str) -> dict[str, bytes]:
    """The asset at its real path under the mirror, and the release's metadata giving its digest."""
    spec = load_backend_versions().spec("lemon-mlx", "cpu")
    asset = spec.asset_name("linux-x86_64")
    metadata = {"tag_name": spec.version, "assets": [{"name": asset, "digest": f"sha256:{digest}"}]}
    return {
        f"/{spec.repo}/releases/download/{spec.version}/{asset}": zip_bytes,
        f"/api/v3/repos/{spec.repo}/releases/tags/{spec.version}": json.dumps(metadata).encode(),
    }


@pytest.fixture
def mirror(engine_zip: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    data = engine_zip.read_bytes()
    served = Served(files=release_files(data, hashlib.sha256(data).hexdigest()))
    with serve(served) as base:
        monkeypatch.setenv("LEMON_DESK_RELEASE_MIRROR", base)
        yield served


@pytest.fixture
def hf_home(qwen3: Qwen3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An HF cache holding the tiny Qwen3 under the real repo id, named by HF_HOME for the app."""
    hf = tmp_path / "hf"
    lay_out_hf_cache(hf / "hub", REPO, qwen3.folder)
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    return hf


@pytest.fixture
def server(mirror: Served, lemon_home: Path, hf_home: Path) -> Path:
    """``lemon-desk backends install lemon-mlx:cpu`` from the mirror; the installed ``server``."""
    result = lemon_desk("backends", "install", "lemon-mlx:cpu", "--json")
    assert result.returncode == 0, result.stderr
    return lemon_home / "engines" / "lemon-mlx" / "cpu" / "server"


def request(server: Path, hf_home: Path, *args: str, model: str = REPO) -> LaunchRequest:
    return LaunchRequest(
        recipe="lemon-mlx",
        backend="cpu",
        binary=str(server),
        library_dir=str(server.parent),
        model=model,
        ctx_size=1024,
        user_args=args,
        hf_hub_cache=str(hf_home / "hub"),
    )


def run(engine: Engine, body: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``body`` on a fresh loop; the engine is stopped whatever happens."""

    async def main() -> T:
        try:
            return await body()
        finally:
            await engine.stop()

    return asyncio.run(main())


async def chat(engine: Engine, messages: Any = HELLO, **params: Any) -> tuple[str, str, ChatDone]:
    content, reasoning, done = "", "", None
    async with engine.chat_client() as client:
        async for event in client.stream_chat(messages, **params):
            if isinstance(event, ChatDelta):
                content, reasoning = content + event.content, reasoning + event.reasoning
            else:
                done = event
    assert done is not None
    return content, reasoning, done


def answer_of(text: str) -> str:
    return text.split("</think>", 1)[1]


def test_install_checks_the_digest_the_release_gives(
    mirror: Served, engine_zip: Path, lemon_home: Path, hf_home: Path
) -> None:
    result = lemon_desk("backends", "install", "lemon-mlx:cpu", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["version"] == "b1050-stable"
    folder = lemon_home / "engines" / "lemon-mlx" / "cpu"
    manifest = read_manifest(folder)
    assert manifest is not None and manifest.sha256 == hashlib.sha256(engine_zip.read_bytes()).hexdigest()
    assert sorted(p.name for p in folder.iterdir() if p.name != "lemon-desk-install.json") == [
        "libgfortran.so.5",
        "liblapacke.so.3",
        "libopenblas.so.0",
        "server",
    ]


def test_an_asset_unlike_its_release_digest_is_not_installed(
    mirror: Served, engine_zip: Path, lemon_home: Path, hf_home: Path
) -> None:
    mirror.files.update(release_files(engine_zip.read_bytes(), "0" * 64))
    result = lemon_desk("backends", "install", "lemon-mlx:cpu")
    assert result.returncode == 1
    assert "SHA-256" in result.stderr and "Traceback" not in result.stderr
    assert not (lemon_home / "engines" / "lemon-mlx" / "cpu").exists()


def test_the_release_server_needs_its_folder_on_the_loader_path(server: Path, hf_home: Path) -> None:
    # The binary has no RUNPATH: its bundled libraries are found only through LD_LIBRARY_PATH.
    dynamic = subprocess.run(["readelf", "-d", str(server)], capture_output=True, text=True, check=True)
    assert "RUNPATH" not in dynamic.stdout and "RPATH" not in dynamic.stdout
    assert "libopenblas.so.0" in dynamic.stdout
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    hidden = hidden_system_openblas()
    bare = subprocess.run(
        [*hidden, str(server), "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert bare.returncode == 127, bare.stderr
    assert "libopenblas.so.0: cannot open shared object file" in bare.stderr  # the loader's own words
    env["LD_LIBRARY_PATH"] = str(server.parent)
    found = subprocess.run(
        [*hidden, str(server), "--help"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert found.returncode == 0 and "--ctx-size" in found.stdout + found.stderr


SYSTEM_OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0")


def hidden_system_openblas() -> list[str]:
    """A command prefix that runs a program as on a machine without the system's OpenBLAS (this one has
    it, to build the engine): a private mount namespace with an empty folder over the one holding it
    (Debian's openblas-pthread/). Skips where that cannot be done here."""
    real = SYSTEM_OPENBLAS.resolve()
    if not SYSTEM_OPENBLAS.exists() or real.parent == SYSTEM_OPENBLAS.parent:
        pytest.skip("the system's OpenBLAS is not in a folder of its own here: it cannot be hidden")
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False).returncode != 0:
        pytest.skip("no private mount namespace here (unshare --mount): the system's OpenBLAS stays visible")
    hide = f'mount -t tmpfs none {real.parent} && exec "$0" "$@"'
    return ["unshare", "--mount", "--", "sh", "-c", hide]


def test_launch_repo_id_hf_home_library_path_ctx_size_and_extra_args_reach_the_engine(
    server: Path, hf_home: Path, tmp_path: Path
) -> None:
    args = ("--max-tokens", "4", "--max-loaded", "1")
    engine = Engine("qwen3", request(server, hf_home, *args), cpu_x86(), log_path=tmp_path / "e.log")

    async def go() -> tuple[list[str], dict[str, str], int, Any, ChatDone]:
        await engine.start()  # returns once /health answers 200: the model is loaded and warm
        assert engine.pid is not None
        proc = psutil.Process(engine.pid)
        async with httpx.AsyncClient() as http:
            health = (await http.get(f"{engine.base_url}/health")).status_code
            models = (await http.get(f"{engine.base_url}/v1/models")).json()
        _, _, done = await chat(engine)
        return proc.cmdline(), proc.environ(), health, models, done

    cmdline, env, health, models, done = run(engine, go)
    assert cmdline == [
        str(server), REPO, "--host", "127.0.0.1", "--port", str(engine.port), "--ctx-size", "1024", *args,
    ]  # fmt: skip
    # The engine's --max-tokens does not limit a request: its own max_tokens (default 2048) replaces it.
    assert done.telemetry.completion_tokens > 4 and done.finish_reason == "stop"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(server.parent)
    assert env["HF_HOME"] == str(hf_home) and env["HF_HUB_CACHE"] == str(hf_home / "hub")
    assert health == 200
    assert [m["id"] for m in models["data"]] == [REPO]  # the engine names the model as its argv did
    log = (tmp_path / "e.log").read_text()
    assert f"Loading model: {REPO}" in log


def test_a_reply_with_reasoning_split_telemetry_from_both_speed_lines_and_a_stop_string(
    server: Path, hf_home: Path, qwen3: Qwen3, tmp_path: Path
) -> None:
    engine = Engine("qwen3", request(server, hf_home), cpu_x86(), log_path=tmp_path / "e.log")

    async def go() -> tuple[tuple[str, str, ChatDone], tuple[str, str, ChatDone]]:
        await engine.start()
        whole = await chat(engine, max_completion_tokens=64)
        stopped = await chat(engine, max_completion_tokens=64, stop=" lemon")
        return whole, stopped

    (content, reasoning, done), (cut, _, cut_done) = run(engine, go)
    thought, said = qwen3.text.removeprefix("<think>").split("</think>")
    assert (reasoning, content) == (thought, said)  # <think> split out of content, into reasoning
    assert done.finish_reason == "stop"  # the model's end token: a genuine stop stays one
    t = done.telemetry
    # Both speed lines were read: "[TPS] Prompt: ..." and "Generation: ..." (no prefix on b1050-stable).
    lines = engine.output
    [prompt_line] = [line for line in lines if line.startswith("[TPS] Prompt:")][:1]
    [generation_line] = [line for line in lines if line.startswith("Generation:")][:1]
    assert t.prompt_tokens == int(prompt_line.split()[2]) > 0
    # The engine counts the end token as generated (b1050-stable).
    assert t.completion_tokens == int(generation_line.split()[1]) == len(qwen3.tokens) + 1
    assert t.decode_tps == float(generation_line.split()[3]) and t.ttft_s > 0
    # A stop string, turned into the array the engine parses (a bare string is a 400 there).
    assert cut_done.finish_reason == "stop"
    assert " lemon" not in cut and cut.startswith(said.split(" lemon")[0])


def test_a_limit_that_cut_the_reply_is_length_although_the_engine_says_stop(
    server: Path, hf_home: Path, qwen3: Qwen3, tmp_path: Path
) -> None:
    # Cut right after the first byte of "é": a token with no text, which the engine does not count
    # when it decides "length".
    limit = qwen3.tokens.index("Ã") + 1
    engine = Engine("qwen3", request(server, hf_home), cpu_x86(), log_path=tmp_path / "e.log")

    async def go() -> tuple[tuple[str, str, ChatDone], dict[str, Any]]:
        await engine.start()
        streamed = await chat(engine, max_completion_tokens=limit)
        async with httpx.AsyncClient(timeout=60) as http:
            raw = await http.post(
                f"{engine.base_url}/v1/chat/completions", json={"messages": HELLO, "max_tokens": limit}
            )
        return streamed, raw.json()

    (_, _, done), raw = run(engine, go)
    assert raw["choices"][0]["finish_reason"] == "stop"  # the engine's word (b1050-stable)
    assert raw["usage"]["completion_tokens"] == limit  # ...though its count shows the limit was hit
    assert done.telemetry.completion_tokens == limit
    assert done.finish_reason == "length"


def test_content_parts_are_flattened_and_max_completion_tokens_is_its_max_tokens(
    server: Path, hf_home: Path, qwen3: Qwen3, tmp_path: Path
) -> None:
    engine = Engine("qwen3", request(server, hf_home), cpu_x86(), log_path=tmp_path / "e.log")
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]

    async def go() -> tuple[int, tuple[str, str, ChatDone]]:
        await engine.start()
        async with httpx.AsyncClient(timeout=60) as http:  # what the engine does with parts itself
            refused = await http.post(f"{engine.base_url}/v1/chat/completions", json={"messages": parts})
        return refused.status_code, await chat(engine, parts, max_completion_tokens=3)

    refused, (content, reasoning, done) = run(engine, go)
    assert refused == 400
    assert done.telemetry.completion_tokens == 3 and done.finish_reason == "length"
    assert reasoning == "".join(qwen3.tokens[1:3]).replace("Ġ", " ") and content == ""


def test_streamed_completions_end_in_an_sse_error_and_other_routes_are_refused(
    server: Path, hf_home: Path, tmp_path: Path
) -> None:
    engine = Engine("qwen3", request(server, hf_home), cpu_x86(), log_path=tmp_path / "e.log")

    async def refused(relay: aiohttp.ClientSession, route: Route, body: dict[str, Any]) -> str:
        async with engine.chat_client() as client:
            with pytest.raises(UnsupportedRequestError) as err:
                async for _ in client.forward_stream(route, body, relay):
                    pass
        return err.value.message

    async def go() -> tuple[list[bytes], dict[str, Any], list[str]]:
        await engine.start()
        async with engine.chat_client() as client, aiohttp.ClientSession() as relay:
            body = {"prompt": "Hello", "stream": True}
            chunks = [c async for c in client.forward_stream(Route.COMPLETIONS, body, relay)]
            whole = [c async for c in client.forward_stream(Route.COMPLETIONS, {"prompt": "Hello"}, relay)]
            refusals = [
                await refused(relay, Route.RESPONSES, {"input": "Hello"}),
                await refused(relay, Route.EMBEDDINGS, {"input": "Hello"}),
            ]
        return chunks, json.loads(b"".join(whole)), refusals

    chunks, whole, refusals = run(engine, go)
    parser = SSEParser()
    events = [e for c in chunks for e in parser.feed(c)] + parser.close()
    assert [e.data for e in events][1:] == ["[DONE]"]
    assert "lemon-mlx cannot stream /v1/completions" in json.loads(events[0].data)["error"]["message"]
    assert whole["choices"][0]["text"]  # not streamed, the engine answers it
    assert whole["id"].startswith("chatcmpl-")  # as the engine names completions too (b1050-stable)
    assert refusals == [f"lemon-mlx has no /v1/{route} endpoint." for route in ("responses", "embeddings")]


def test_a_taken_port_is_a_failed_start_although_the_engine_exits_0(
    server: Path, hf_home: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        engine = Engine("busy", request(server, hf_home), cpu_x86(), port=port, log_path=tmp_path / "e.log")
        with pytest.raises(EngineError) as err:
            run(engine, engine.start)
    assert engine.state is EngineState.FAILED
    assert "(exit code 0)" in err.value.message
    assert f"Server listening on http://127.0.0.1:{port}" in err.value.last_output


def test_sigterm_stops_the_engine_and_a_stop_it_does_not_act_on_becomes_sigkill(
    server: Path, hf_home: Path, tmp_path: Path
) -> None:
    def stopped(engine: Engine, hold_off: bool) -> tuple[int, list[str]]:
        async def go() -> int:
            await engine.start()
            assert engine.pid is not None
            if hold_off:  # a stopped process runs no signal handler: SIGTERM waits, as if ignored
                os.kill(engine.pid, signal.SIGSTOP)
            pid = engine.pid
            await engine.stop()
            return pid

        pid = run(engine, go)
        log = engine.log_path.read_text().splitlines()
        return pid, [line for line in log if line.startswith("=== stopped")]

    quick = Engine("qwen3", request(server, hf_home), cpu_x86(), log_path=tmp_path / "a.log")
    pid, stops = stopped(quick, hold_off=False)
    assert stops == ["=== stopped (exit code 0)"]  # its SIGTERM handler stops the server: exit 0
    assert not psutil.pid_exists(pid)
    held = Engine("qwen3", request(server, hf_home), cpu_x86(), stop_grace_s=1.0, log_path=tmp_path / "b.log")
    pid, stops = stopped(held, hold_off=True)
    assert stops == ["=== stopped (killed by signal SIGKILL)"]
    assert not psutil.pid_exists(pid)


def test_a_llama_shaped_model_crashes_this_engine_and_its_last_words_are_shown(
    server: Path, hf_home: Path, tmp_path: Path
) -> None:
    llama = "tests/tiny-llama"
    lay_out_hf_cache(hf_home / "hub", llama, tiny_mlx_model())
    engine = Engine("llama", request(server, hf_home, model=llama), cpu_x86(), log_path=tmp_path / "e.log")
    with pytest.raises(EngineError) as err:
        run(engine, engine.start)
    assert engine.state is EngineState.FAILED
    assert "(exit code 1)" in err.value.message
    assert "Cannot reshape array" in err.value.last_output  # b1050-stable's dangling-reference crash


def engines_running(server: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["exe", "status"]):
        if proc.info["exe"] == str(server) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def test_lemon_desk_run_installs_the_engine_runs_it_and_prints_the_answer_and_telemetry(
    mirror: Served, lemon_home: Path, hf_home: Path, qwen3: Qwen3
) -> None:
    assert not lemon_home.exists()  # an empty home: nothing installed
    result = lemon_desk("run", CATALOG_NAME, "--backend", "lemon-mlx:cpu", "--prompt", "Hello", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["backend"] == "lemon-mlx:cpu"
    assert out["reply"] == answer_of(qwen3.text)  # the reasoning is not the reply
    t = out["telemetry"]
    assert t["completion_tokens"] == len(qwen3.tokens) + 1 and t["prompt_tokens"] > 0  # + its end token
    assert t["decode_tps"] > 0 and t["ttft_s"] > 0
    log = (lemon_home / "logs" / f"engine-{CATALOG_NAME}.log").read_text()
    [generation] = [line for line in log.splitlines() if line.startswith("Generation:")]
    assert t["decode_tps"] == float(generation.split()[3])  # the engine's own figure, not an estimate
    assert mirror.bytes_sent(f"/{load_backend_versions().spec('lemon-mlx', 'cpu').repo}/releases/download/"
                             f"b1050-stable/mlx-engine-b1050-stable-ubuntu-cpu-x64.zip")  # fmt: skip
    assert engines_running(lemon_home / "engines" / "lemon-mlx" / "cpu" / "server") == []


def test_the_local_api_with_the_openai_client_and_recovery_after_kill_9_of_the_engine(
    server: Path, lemon_home: Path, qwen3: Qwen3, openai_api: OpenAIs
) -> None:
    import openai

    save_model_options({CATALOG_NAME: ModelOptions(backend="cpu")})
    with serving() as served:
        api = openai_api(served.url)
        inline = {"reasoning_format": "inline"}  # the engine's own way: its reasoning inside the content
        reply = api.chat.completions.create(
            model=CATALOG_NAME, messages=HELLO, max_completion_tokens=64, stop=" lemon", extra_body=inline
        )
        # The API passes the engine's content on as it is (reasoning inside), cut at the stop string the
        # engine ignored.
        assert reply.choices[0].message.content == qwen3.text.split(" lemon")[0]
        assert reply.choices[0].finish_reason == "stop"
        [engine] = engines_running(server)

        engine.kill()  # kill -9: the app restarts it and the next request is answered
        engine.wait(timeout=30)
        deadline = time.monotonic() + 120
        while True:
            try:
                again = api.chat.completions.create(
                    model=CATALOG_NAME, messages=HELLO, max_tokens=64, extra_body=inline
                )
                break
            except openai.APIError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        assert again.choices[0].message.content == qwen3.text
        [restarted] = engines_running(server)
        assert restarted.pid != engine.pid

        stream = api.completions.create(model=CATALOG_NAME, prompt="Hello", stream=True)
        with pytest.raises(openai.APIError, match="lemon-mlx cannot stream /v1/completions"):
            list(stream)
        with pytest.raises(openai.APIStatusError, match="lemon-mlx has no /v1/responses endpoint"):
            api.responses.create(model=CATALOG_NAME, input="Hello")

        served.proc.kill()  # kill -9 of the app: its engine must not outlive it
        served.proc.wait(timeout=30)
        gone, alive = psutil.wait_procs([restarted], timeout=30)
        assert gone and not alive


def test_the_local_api_splits_out_the_reasoning_corrects_the_finish_and_refuses_a_schema(
    server: Path, lemon_home: Path, qwen3: Qwen3
) -> None:
    import openai

    thought, said = qwen3.text.removeprefix("<think>").split("</think>")
    limit = qwen3.tokens.index("Ã") + 1  # the engine says "stop" for a reply cut here (see above)
    save_model_options({CATALOG_NAME: ModelOptions(backend="cpu")})
    with (
        serving() as served,
        openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=120) as api,
    ):
        reply = api.chat.completions.create(model=CATALOG_NAME, messages=HELLO, max_tokens=64)
        message = reply.choices[0].message
        assert (message.content, (message.model_extra or {}).get("reasoning_content")) == (said, thought)

        chunks = list(
            api.chat.completions.create(model=CATALOG_NAME, messages=HELLO, max_tokens=64, stream=True)
        )
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        content = "".join(d.content or "" for d in deltas)
        reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
        assert (content, reasoning) == (said, thought)

        hidden = api.chat.completions.create(
            model=CATALOG_NAME, messages=HELLO, max_tokens=64, extra_body={"reasoning_format": "hidden"}
        )
        assert hidden.choices[0].message.content == said
        assert "reasoning_content" not in (hidden.choices[0].message.model_extra or {})

        cut = api.chat.completions.create(model=CATALOG_NAME, messages=HELLO, max_tokens=limit)
        assert cut.choices[0].finish_reason == "length"
        assert cut.usage is not None and cut.usage.completion_tokens == limit
        cut_stream = api.chat.completions.create(
            model=CATALOG_NAME, messages=HELLO, max_tokens=limit, stream=True
        )
        assert [
            c.choices[0].finish_reason for c in cut_stream if c.choices and c.choices[0].finish_reason
        ] == ["length"]

        with pytest.raises(openai.BadRequestError, match="lemon-mlx"):
            api.chat.completions.create(
                model=CATALOG_NAME, messages=HELLO, response_format={"type": "json_object"}
            )
