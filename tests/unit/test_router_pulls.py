"""Pulls (app.supervisor.router.pulls) on its own, against the loopback Hub: a pull registers the model,
downloads it into the cache and says so (the download's moves, the model's status changed); a load
waiting on the download hears its progress; a pull forgets a failed load; a download held part way
pauses and resumes to the end; a local model has nothing to pull."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.core.downloads import DownloadState
from app.core.errors import ModelError
from app.core.status import LoadState
from app.store.hfcache import RepoCache, hub_cache_dir
from app.store.settings import Settings
from app.supervisor.downloads import DownloadChanged
from app.supervisor.router.events import LoadProgress, ModelsChanged
from tests.support.fileserver import Fault
from tests.support.hubserver import LoopbackHub
from tests.support.router_parts import router_parts
from tests.support.standin import make_standin_model
from tests.support.testrepos import BIG, big_files
from tests.support.waiting import until

Q8 = f"{BIG}:Q8_0"
Q8_FILE = "Big-Q8_0.gguf"


def test_a_pull_registers_downloads_and_says_so_and_forgets_a_failed_load(hub: LoopbackHub) -> None:
    async def go() -> None:
        async with router_parts(Settings()) as parts:
            model, files = await parts.pulls.plan_pull(Q8)
            parts.runtime[model.name].move(LoadState.FAILED, "an earlier load failed")
            record = await parts.pulls.download(model, files)
            assert record.state is DownloadState.DONE
            assert parts.library.local_files(parts.library.resolve(model.name)) is not None
            moves = [
                e.state for e in parts.events if isinstance(e, DownloadChanged) and e.id == model.checkpoint
            ]
            assert moves == [DownloadState.QUEUED, DownloadState.RUNNING, DownloadState.DONE]
            assert any(isinstance(e, ModelsChanged) and model.name in e.names for e in parts.events)
            assert parts.runtime[model.name].state is LoadState.IDLE and parts.runtime[model.name].error == ""

    asyncio.run(go())


def test_a_load_waiting_on_the_download_hears_its_progress(hub: LoopbackHub) -> None:
    async def go() -> None:
        async with router_parts(Settings()) as parts:
            model, files = await parts.pulls.plan_pull(Q8)
            parts.runtime.set_phase(model.name, LoadState.DOWNLOADING)
            await parts.pulls.download(model, files)
            heard = [
                e for e in parts.events if isinstance(e, LoadProgress) and e.phase is LoadState.DOWNLOADING
            ]
            assert heard[-1].done == heard[-1].total == files.size
            assert {e.detail for e in heard[1:]} == {f.path for f in files.files}, "each file as it comes"
            progress = parts.runtime[model.name].progress
            assert progress is not None and progress.done == progress.total

    asyncio.run(go())


def test_a_download_paused_part_way_resumes_to_the_end(hub: LoopbackHub) -> None:
    held = len(big_files()[Q8_FILE]) // 3
    hub.arm(BIG, Q8_FILE, Fault(hold_after=held))

    async def go() -> None:
        async with router_parts(Settings()) as parts:
            model = await parts.pulls.add(Q8)
            manager = await parts.pulls.manager()
            part = RepoCache(hub_cache_dir(), BIG).blob(hub.repos[BIG].sha256(Q8_FILE) + ".part")
            await until(lambda: part.exists() and part.stat().st_size >= held)  # the Hub holds it there
            await parts.pulls.pause(model.name)
            assert manager.records[model.checkpoint].state is DownloadState.PAUSED
            await parts.pulls.resume(model.name)
            done = await manager.wait(model.checkpoint)
            assert done.state is DownloadState.DONE
            assert parts.library.local_files(parts.library.resolve(model.name)) is not None

    asyncio.run(go())


def test_a_local_model_has_nothing_to_pull(standin_settings: Settings, tmp_path: Path) -> None:
    async def go() -> None:
        async with router_parts(standin_settings) as parts:
            model = parts.library.import_path(make_standin_model(tmp_path, "here"))
            with pytest.raises(ModelError, match="is a local model: there is nothing to download"):
                await parts.pulls.pull(model.name)

    asyncio.run(go())
