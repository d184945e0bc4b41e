"""lemon-mlx end to end with real MLX inference on this machine.

- The mlx-lm backend, installed by the app from the package index, serves the tiny MLX model.
- The lemon-mlx release path: a loopback mirror serves a zip in the release layout whose ``server`` is a
  STAND-IN (tests/support/lemon_mlx_release.py: lemon-mlx's command line, mlx-lm inside). The app's
  real installer fetches and unpacks it, the real engine supervisor launches it, the real client talks
  to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Callable, Coroutine, Iterator
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
from app.core.errors import EngineError
from app.core.hardware import Hardware, hardware_from_json
from app.core.launch import LaunchRequest
from app.core.matrix import support_matrix
from app.core.telemetry import Telemetry
from app.store.catalog import load_backend_versions
from app.store.installs import install_dir
from app.supervisor.engine import Engine
from app.supervisor.installer import install_backend, installed_binary
from tests.conftest import profile_path
from tests.integration.conftest import lemon_desk
from tests.integration.mlx.conftest import Installed
from tests.support.fileserver import Served, serve
from tests.support.lemon_mlx_release import lay_out_hf_cache, read_calls, release_zip

pytestmark = pytest.mark.integration
T = TypeVar("T")

REPO = "mlx-community/Qwen3-0.6B-4bit"  # the catalog's Qwen3-0.6B-MLX, here holding the tiny model
HELLO = [{"role": "user", "content": "Hello there"}]


def cpu_x86() -> Hardware:
    return hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))


def run(engine: Engine, body: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``body`` on a fresh loop; the engine is stopped whatever happens."""

    async def main() -> T:
        try:
            return await body()
        finally:
            await engine.stop()

    return asyncio.run(main())


async def chat(engine: Engine, **params: Any) -> tuple[str, ChatDone]:
    text, done = "", None
    async with engine.chat_client() as client:
        async for event in client.stream_chat(HELLO, **params):
            if isinstance(event, ChatDelta):
                text += event.content + event.reasoning
            else:
                done = event
    assert done is not None
    return text, done


def test_mlx_lm_backend_serves_a_real_mlx_model(
    installed_once: Installed, tiny_model: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("LEMON_DESK_HOME", str(installed_once.home))
    python = installed_binary("lemon-mlx", "mlx-lm")
    assert python is not None
    request = LaunchRequest(
        recipe="lemon-mlx",
        backend="mlx-lm",
        binary=str(python),
        library_dir="",
        model=str(tiny_model),  # a local folder: this model has no repo id
        hf_hub_cache=str(tmp_path / "hf" / "hub"),
    )
    engine = Engine("tiny-mlx", request, cpu_x86(), log_path=tmp_path / "engine.log")

    async def go() -> tuple[str, ChatDone, int]:
        await engine.start()
        assert engine.pid is not None
        cmdline = psutil.Process(engine.pid).cmdline()
        assert cmdline[1:8] == ["-m", "mlx_lm", "server", "--model", str(tiny_model), "--host", "127.0.0.1"]
        text, done = await chat(engine, max_completion_tokens=12, temperature=0)
        return text, done, engine.pid

    text, done, pid = run(engine, go)
    assert text  # gibberish from random weights, but real tokens through real SSE
    assert done.finish_reason in ("length", "stop")
    t = done.telemetry
    assert 0 < t.completion_tokens <= 12  # max_completion_tokens reached the engine as max_tokens
    assert t.prompt_tokens > 0 and t.ttft_s > 0  # usage from the stream, TTFT measured by the client
    assert engine.state is EngineState.STOPPED and not psutil.pid_exists(pid)


@pytest.fixture
def lemon_mlx_mirror(test_mlx_python: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A loopback stand-in for GitHub releases holding the lemon-mlx cpu asset (its server a STAND-IN)."""
    spec = load_backend_versions().spec("lemon-mlx", "cpu")
    asset = spec.asset_name("linux-x86_64")
    assert asset == f"mlx-engine-{spec.version}-ubuntu-cpu-x64.zip"
    served = Served(
        files={f"/{spec.repo}/releases/download/{spec.version}/{asset}": release_zip(test_mlx_python)}
    )
    with serve(served) as base:
        monkeypatch.setenv("LEMON_DESK_RELEASE_MIRROR", base)
        yield base


async def install_standin(base: str) -> Path:
    versions = load_backend_versions()
    status = support_matrix(cpu_x86(), versions, release_base=base)["lemon-mlx"].backends["cpu"]
    assert status.url is not None and status.url.startswith(base)
    with httpx.Client() as client:
        await install_backend(versions.spec("lemon-mlx", "cpu"), status, client)
    binary = installed_binary("lemon-mlx", "cpu")
    assert binary is not None and binary.name == "server"
    return binary


def standin_request(binary: Path, hub: Path) -> LaunchRequest:
    return LaunchRequest(
        recipe="lemon-mlx",
        backend="cpu",
        binary=str(binary),
        library_dir=str(binary.parent),
        model=REPO,
        ctx_size=2048,
        hf_hub_cache=str(hub),
    )


def test_lemon_mlx_release_install_launch_chat_and_streamed_completions(
    lemon_mlx_mirror: str, tiny_model: Path, tmp_path: Path
) -> None:
    hub = tmp_path / "hf" / "hub"
    lay_out_hf_cache(hub, REPO, tiny_model)
    binary = asyncio.run(install_standin(lemon_mlx_mirror))
    folder = install_dir("lemon-mlx", "cpu")
    assert (folder / "libopenblas.so.0").exists()
    engine = Engine("qwen3-0.6b-mlx", standin_request(binary, hub), cpu_x86(), log_path=tmp_path / "e.log")

    async def go() -> tuple[str, ChatDone, list[bytes]]:
        await engine.start()
        text, done = await chat(engine, max_completion_tokens=10, stop="never-said")
        async with engine.chat_client() as client, aiohttp.ClientSession() as relay:
            body = {"prompt": "hi", "stream": True}
            chunks = [c async for c in client.forward_stream(Route.COMPLETIONS, body, relay)]
        return text, done, chunks

    text, done, chunks = run(engine, go)

    [call] = read_calls(folder)
    assert call["model"] == REPO  # the repo id, not a path: the engine resolves it from HF_HOME
    assert call["opts"] == {"--host": "127.0.0.1", "--port": str(engine.port), "--ctx-size": "2048"}
    env = call["env"]
    assert isinstance(env, dict)
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(folder)
    assert env["HF_HOME"] == str(hub.parent) and env["HF_HUB_CACHE"] == str(hub)

    assert text
    # Telemetry comes from the engine's [TPS] stderr lines, as lemon-mlx reports it.
    tps = [line for line in engine.output if line.startswith("[TPS] Generation:")]
    assert len(tps) == 1
    generated = int(tps[0].split()[2])
    assert done.telemetry.completion_tokens == generated and 0 < generated <= 10
    assert done.telemetry.decode_tps == float(tps[0].split()[4])
    assert isinstance(done.telemetry, Telemetry) and done.telemetry.ttft_s > 0

    # A streamed /v1/completions ends with an SSE error event and the end of the stream.
    parser = SSEParser()
    events = [e for c in chunks for e in parser.feed(c)] + parser.close()
    assert [e.data for e in events][1:] == ["[DONE]"]
    error = json.loads(events[0].data)["error"]
    assert "lemon-mlx cannot stream /v1/completions" in error["message"]
    assert not any("/v1/completions" in line for line in engine.output)  # never reached the engine


def test_a_taken_port_is_a_failed_start_although_the_engine_exits_0(
    lemon_mlx_mirror: str, tiny_model: Path, tmp_path: Path
) -> None:
    hub = tmp_path / "hf" / "hub"
    lay_out_hf_cache(hub, REPO, tiny_model)
    binary = asyncio.run(install_standin(lemon_mlx_mirror))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        engine = Engine(
            "busy", standin_request(binary, hub), cpu_x86(), port=port, log_path=tmp_path / "e.log"
        )
        with pytest.raises(EngineError) as err:
            run(engine, engine.start)
    assert engine.state is EngineState.FAILED
    assert "(exit code 0)" in err.value.message
    assert f"Port {port} is already in use" in err.value.last_output


def _engine_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(marker in part for part in proc.cmdline()):
                found.append(proc)
    return found


def test_lemon_desk_run_streams_a_reply_with_telemetry_on_the_mlx_lm_backend(
    installed_once: Installed, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_HOME", str(installed_once.home))
    result = lemon_desk("run", str(tiny_model), "--backend", "lemon-mlx:mlx-lm", "--prompt", "hi", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["model"] == tiny_model.name and out["backend"] == "lemon-mlx:mlx-lm"
    assert out["reply"]
    t = out["telemetry"]
    assert t["ttft_s"] > 0 and t["prompt_tokens"] > 0 and t["completion_tokens"] > 0 and t["decode_tps"] > 0
    assert _engine_processes(str(tiny_model)) == []  # the engine stopped with the command


def test_lemon_desk_installs_and_runs_the_lemon_mlx_release_from_a_mirror(
    lemon_mlx_mirror: str,
    tiny_model: Path,
    tmp_path: Path,
    lemon_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hf = tmp_path / "hf"
    lay_out_hf_cache(hf / "hub", REPO, tiny_model)
    monkeypatch.setenv("HF_HOME", str(hf))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))

    installed = lemon_desk("backends", "install", "lemon-mlx:cpu", "--json")
    assert installed.returncode == 0, installed.stderr
    assert json.loads(installed.stdout)["version"] == load_backend_versions().spec("lemon-mlx", "cpu").version

    result = lemon_desk("run", "Qwen3-0.6B-MLX", "--backend", "lemon-mlx:cpu", "--prompt", "hi")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()  # the reply, streamed to stdout

    folder = lemon_home / "engines" / "lemon-mlx" / "cpu"
    [call] = read_calls(folder)
    assert call["model"] == REPO
    env_seen = call["env"]
    assert isinstance(env_seen, dict)
    assert env_seen["LD_LIBRARY_PATH"].split(":")[0] == str(folder)
    assert env_seen["HF_HOME"] == str(hf)
    # The telemetry line shows the engine's own [TPS] figures.
    log = (lemon_home / "logs" / "engine-Qwen3-0.6B-MLX.log").read_text()
    [generation] = [line for line in log.splitlines() if line.startswith("[TPS] Generation:")]
    tokens, tps = generation.split()[2], float(generation.split()[4])
    assert f"reply {tokens} tokens at {tps:.1f} tok/s" in result.stderr
    assert _engine_processes(str(folder)) == []


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace_period(
    lemon_mlx_mirror: str, tiny_model: Path, tmp_path: Path
) -> None:
    hub = tmp_path / "hf" / "hub"
    lay_out_hf_cache(hub, REPO, tiny_model)
    binary = asyncio.run(install_standin(lemon_mlx_mirror))
    (binary.parent / "ignore-sigterm").write_text("")
    log = tmp_path / "e.log"
    engine = Engine("stubborn", standin_request(binary, hub), cpu_x86(), stop_grace_s=0.5, log_path=log)

    async def go() -> int:
        await engine.start()
        assert engine.pid is not None
        pid = engine.pid
        await engine.stop()
        return pid

    pid = run(engine, go)
    assert engine.state is EngineState.STOPPED and not psutil.pid_exists(pid)
    assert log.read_text().splitlines()[-1] == "=== stopped (killed by signal SIGKILL)"
