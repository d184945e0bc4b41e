"""A model split across llama.cpp RPC workers, on loopback with the real binaries: two ``lemon-desk worker``
processes stand in for two machines (the build has ``GGML_RPC=ON``; see tests/support/llama.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.errors import WorkerError
from app.core.rpc import Endpoint, memory_by_device, parse_endpoint
from app.store.library import Library
from app.store.settings import Settings
from app.supervisor.process import free_port
from app.supervisor.router import EngineRecovery, Router
from app.supervisor.router import recovery as router_module
from app.supervisor.rpc import probe
from tests.integration.conftest import Mirror, engines_of, lemon_desk
from tests.integration.test_run import ENDLESS, after_phases, engine_of, start
from tests.support.serve import serving

pytestmark = pytest.mark.integration


@pytest.fixture
def installed(mirror: Mirror) -> None:
    """llama.cpp installed from the loopback release mirror by the first worker (one click)."""


class Workers:
    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, *extra: str) -> str:
        """A ``lemon-desk worker`` on a free loopback port; returns its address once it answers."""
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "app", "worker", "--port", str(port), "--json", *extra],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # one JSON line once the worker answers a probe
        assert line, proc.communicate(timeout=30)[1]
        offered = json.loads(line)
        assert offered["endpoint"] == f"127.0.0.1:{port}" and offered["devices"][0]["free_bytes"] > 0
        self.procs[offered["endpoint"]] = proc
        return str(offered["endpoint"])

    def kill(self, endpoint: str) -> None:
        """kill -9 of the worker command: its ggml-rpc-server dies with it (PDEATHSIG)."""
        proc = self.procs.pop(endpoint)
        server = psutil.Process(proc.pid).children()
        proc.kill()
        proc.communicate(timeout=30)
        _, alive = psutil.wait_procs(server, timeout=30)
        assert server and not alive  # no orphan worker

    def stop_all(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.communicate(timeout=30)
            assert proc.returncode == 0
        self.procs.clear()


@pytest.fixture
def workers(installed: None) -> Iterator[Workers]:
    running = Workers()
    yield running
    for proc in running.procs.values():
        proc.kill()
        proc.communicate(timeout=30)


def test_two_workers_hold_the_model_and_a_lost_one_is_named(
    workers: Workers, smol_gguf: Path, lemon_home: Path
) -> None:
    first = workers.start()
    second = workers.start()
    both = f"{first},{second}"

    done = lemon_desk("run", str(smol_gguf), "--rpc", both, "--prompt", "Say hello.", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["reply"].strip()
    log = (lemon_home / "logs" / f"engine-{smol_gguf.stem}.log").read_text().splitlines()
    placed = memory_by_device(log)
    assert placed[first] > 50 << 20 and placed[second] > 50 << 20  # layers and KV cache on each worker

    cli = start("run", str(smol_gguf), "--rpc", both, "--prompt", "Count to a thousand.", "--args", ENDLESS)
    engine = engine_of(cli)
    workers.kill(second)
    _, err = cli.communicate(timeout=60)
    assert cli.returncode == 1
    said = after_phases(err).splitlines()[0]
    assert said.startswith("error: llama-server stopped unexpectedly (killed by signal SIGABRT)")
    assert f"the RPC worker {second} is unreachable" in said and "Traceback" not in err
    assert not psutil.pid_exists(engine.pid)

    again = lemon_desk("run", str(smol_gguf), "--rpc", first, "--prompt", "Say hello.", "--json")
    assert again.returncode == 0, again.stderr
    refused = lemon_desk("run", str(smol_gguf), "--rpc", both, "--prompt", "Say hello.")
    assert refused.returncode == 1
    assert f"The RPC worker {second} is unreachable (connection refused)" in refused.stderr
    workers.stop_all()  # SIGTERM: each exits 0 and takes its ggml-rpc-server with it


def test_serve_and_bench_take_rpc_too(workers: Workers, smol_gguf: Path, lemon_home: Path) -> None:
    worker = workers.start()
    Library(Settings()).import_path(smol_gguf, name="user.smol")
    with serving("--rpc", worker) as served:
        reply = httpx.post(
            f"{served.url}/v1/chat/completions",
            json={
                "model": "user.smol",
                "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 8,
            },
            timeout=120,
        )
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"].strip()
        [engine] = [p for p in engines_of(lemon_home) if p.name() == "llama-server"]
        assert engine.cmdline()[engine.cmdline().index("--rpc") + 1] == worker

    done = lemon_desk(
        "bench",
        "user.smol",
        "--rpc",
        worker,
        "--prompt-tokens",
        "64",
        "--gen-tokens",
        "16",
        "--repetitions",
        "1",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    [result] = json.loads(done.stdout)["results"]
    assert result["pp_tps"] > 0 and result["tg_tps"] > 0
    log = (lemon_home / "logs" / "engine-user.smol.log").read_text()
    assert memory_by_device(log.splitlines())[worker] > 0


def test_the_router_checks_workers_and_reloads_without_a_lost_one(
    workers: Workers, smol_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router_module, "RESTART_BACKOFF_S", (0.05, 0.05, 0.05))
    first, second = workers.start(), workers.start()
    name = smol_gguf.stem
    settings = Settings(rpc_workers=f"{first},{second}")

    async def go() -> None:
        async with Router(settings) as router:
            recoveries: list[EngineRecovery] = []
            router.subscribe(lambda e: recoveries.append(e) if isinstance(e, EngineRecovery) else None)
            model = router.library.find(str(smol_gguf))
            engine = await router.load(model)
            assert engine.request.rpc == (first, second)
            with pytest.raises(WorkerError, match="busy: another engine is using it"):
                await probe(parse_endpoint(first), 1.0)
            reply = await router.chat(name, [{"role": "user", "content": "Say hello."}], max_tokens=8)
            assert reply.content.strip()

            workers.kill(second)
            # The engine notices on its next request; the restart finds the worker gone and gives up.
            with pytest.raises(Exception, match=f"(?i)the RPC worker {second} is unreachable"):
                await router.chat(name, [{"role": "user", "content": "Say hello."}], max_tokens=8)
            while not (recoveries and recoveries[-1].gave_up):
                await asyncio.sleep(0.05)
            assert f"The RPC worker {second} is unreachable" in recoveries[-1].message

            engine = await router.reload_without(name, (second,))
            assert engine.state is EngineState.READY and engine.request.rpc == (first,)
            reply = await router.chat(name, [{"role": "user", "content": "Say hello."}], max_tokens=8)
            assert reply.content.strip()

    asyncio.run(go())


def test_a_worker_that_dies_is_started_again(installed: None) -> None:
    """The app's own worker, killed, is back after the first step of the backoff."""

    async def go() -> None:
        async with Router(Settings()) as router:
            worker = await router.start_worker(Endpoint("127.0.0.1", free_port()))
            assert worker.state is EngineState.READY and worker.info is not None
            first_pid = worker.process.pid
            assert first_pid is not None
            psutil.Process(first_pid).kill()
            while worker.state is not EngineState.READY or worker.process.pid == first_pid:
                await asyncio.sleep(0.05)  # back after the first step of the backoff (1 s)
            assert (await probe(worker.endpoint)).devices
            server = worker.process.pid
        assert server is not None and not psutil.pid_exists(server)  # stopped with the router

    asyncio.run(go())
