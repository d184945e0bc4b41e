"""One-click load from an empty LEMON_DESK_HOME and an empty Hugging Face cache to an answer: the router
downloads a catalog model from a loopback Hub, installs llamacpp:cpu from the loopback release mirror and
starts the real llama-server on it; cancelled in the download or the install phase, it leaves nothing.

The catalog entry is Qwen3-0.6B-GGUF, but the bytes the loopback Hub serves under its repo id and file
name are SmolLM2-135M's (the real GGUF, small and quick to load). They are served on loopback only;
nothing here claims they are Qwen3's.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.core.backends import BackendState
from app.core.downloads import DownloadState
from app.core.status import LoadState, Status
from app.store.downloads import load_downloads
from app.store.installs import install_dir
from app.store.paths import staging_dir
from app.store.settings import Settings
from app.supervisor.router import LoadProgress, Router, RouterEvent
from tests.integration.conftest import ASSET, TAG, Mirror, engines_of, lemon_desk, release_path
from tests.support.fileserver import Fault
from tests.support.hubserver import HubRepo, LoopbackHub

pytestmark = pytest.mark.integration

MODEL = "Qwen3-0.6B-GGUF"  # catalog checkpoint unsloth/Qwen3-0.6B-GGUF:Q4_0
REPO = "unsloth/Qwen3-0.6B-GGUF"
FILE = "Qwen3-0.6B-Q4_0.gguf"
PROMPT = "What is the capital of France? Answer in one word."
WAIT_S = 120.0


@pytest.fixture
def hub(smol_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LoopbackHub]:
    """A loopback Hub serving SmolLM2's bytes as the catalog's Qwen3-0.6B Q4_0 file, and an empty cache."""
    hub = LoopbackHub()
    hub.add(HubRepo(REPO, {FILE: smol_gguf.read_bytes()}, tags=("gguf",)))
    with hub.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        for var in ("HF_HOME", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield hub


def repo_cache(tmp_path: Path) -> Path:
    return tmp_path / "hf-cache" / f"models--{REPO.replace('/', '--')}"


def json_of(*args: str) -> Any:
    done = lemon_desk(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_run_a_catalog_model_from_an_empty_home_downloads_installs_loads_and_answers(
    hub: LoopbackHub, mirror: Mirror, lemon_home: Path, tmp_path: Path
) -> None:
    info = json_of("system-info")
    llamacpp = info["recipes"]["llamacpp"]
    assert llamacpp["default_backend"] == "cpu", llamacpp  # the cpu-only profile
    assert llamacpp["backends"]["cpu"]["state"] == BackendState.INSTALLABLE.value
    assert not lemon_home.joinpath("engines").exists()
    assert not repo_cache(tmp_path).exists()

    done = lemon_desk("run", MODEL, "--prompt", PROMPT, "--json")

    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["model"] == MODEL and result["backend"] == "llamacpp:cpu"
    assert result["reply"].strip()
    phases = [line.split(": ", 1)[1].split()[0] for line in done.stderr.splitlines() if ": " in line]
    for phase in (LoadState.DOWNLOADING, LoadState.INSTALLING, LoadState.LOADING):
        assert f"{MODEL}: {phase.value}" in done.stderr, done.stderr
    assert phases.index(LoadState.DOWNLOADING.value) < phases.index(LoadState.INSTALLING.value)
    assert phases.index(LoadState.INSTALLING.value) < phases.index(LoadState.LOADING.value)
    assert "installing llamacpp:cpu" in done.stderr

    cpu = json_of("backends")["recipes"]["llamacpp"]["backends"]["cpu"]
    assert cpu["state"] == BackendState.INSTALLED.value and cpu["installed_version"] == TAG, cpu
    assert install_dir("llamacpp", "cpu").is_dir()
    models = {m["name"]: m for m in json_of("models")["models"]}
    assert models[MODEL]["state"] == "downloaded", models[MODEL]
    assert engines_of(lemon_home) == []


# --- cancel at each phase, through the router in-process ----------------------------------------------


async def wait_for(events: list[RouterEvent], seen: Callable[[RouterEvent], bool]) -> None:
    async with asyncio.timeout(WAIT_S):
        while not any(seen(e) for e in events):
            await asyncio.sleep(0.02)


def phase(name: LoadState) -> Callable[[RouterEvent], bool]:
    return lambda e: isinstance(e, LoadProgress) and e.model == MODEL and e.phase is name


def test_cancel_while_downloading_deletes_the_partial_download(
    hub: LoopbackHub, mirror: Mirror, lemon_home: Path, tmp_path: Path
) -> None:
    hub.arm(REPO, FILE, Fault(hold_after=1 << 20))  # a megabyte, then silence until the server closes

    async def go() -> None:
        async with Router(Settings()) as router:
            events: list[RouterEvent] = []
            router.subscribe(events.append)
            task = router.load(MODEL)
            await wait_for(events, lambda e: isinstance(e, LoadProgress) and e.done > 0)
            assert list(repo_cache(tmp_path).glob("blobs/*.part")), "the partial file is being written"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            record = router.downloads().records[f"{REPO}:Q4_0"]
            assert record.state is DownloadState.CANCELLED
            assert router.status(MODEL).status.status is Status.NOT_DOWNLOADED

    asyncio.run(go())
    assert list(repo_cache(tmp_path).glob("blobs/*")) == []
    assert list(repo_cache(tmp_path).glob("snapshots/**/*.gguf")) == []
    active = (DownloadState.QUEUED, DownloadState.RUNNING)
    assert [r for r in load_downloads().items.values() if r.state in active] == []
    assert not install_dir("llamacpp", "cpu").exists()
    assert engines_of(lemon_home) == []


def test_cancel_while_installing_undoes_the_install(
    hub: LoopbackHub, mirror: Mirror, lemon_home: Path, tmp_path: Path
) -> None:
    mirror.served.arm(release_path(TAG, ASSET), Fault(hold_after=0))  # headers, then silence
    part = staging_dir() / "llamacpp-cpu" / f"{ASSET}.part"

    async def go() -> None:
        async with Router(Settings()) as router:
            events: list[RouterEvent] = []
            router.subscribe(events.append)
            task = router.load(MODEL)
            await wait_for(events, phase(LoadState.INSTALLING))
            async with asyncio.timeout(WAIT_S):
                while not part.exists():  # the archive's download has begun
                    await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            info = await router.supervisor.info()
            assert info.recipes["llamacpp"].backends["cpu"].state is BackendState.INSTALLABLE
            assert router.status(MODEL).status.status is Status.DOWNLOADED, "the download is kept"

    asyncio.run(go())
    assert not install_dir("llamacpp", "cpu").exists()
    assert not part.exists()
    leftovers = [p for p in staging_dir().rglob("*") if p.is_file()] if staging_dir().exists() else []
    assert leftovers == []
    assert engines_of(lemon_home) == []
