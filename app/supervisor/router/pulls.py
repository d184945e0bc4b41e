"""Pulls: the Hub client and the download manager's lifetime, and every verb that fetches a model's
files (plan, download, add, pause, resume, cancel, the snapshots the CLI and the window list).

The Hub client is made on first use, and the download manager with it; whichever verb comes first makes
both. The Hugging Face token is read (from the keychain, maybe) when a request first needs it, not when
the client is made: the window's start-up, which opens the download manager, touches no keychain.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.core.downloads import INTERRUPTED, DownloadRecord, DownloadState
from app.core.errors import ModelError
from app.core.fit import BandwidthCap, download_cap, memory_budget
from app.core.hardware import Hardware
from app.core.models import Model
from app.core.refs import FileSet, parse_ref, select
from app.core.status import LoadState
from app.core.units import GB
from app.platform import detect_hardware, free_memory
from app.store.downloads import load_downloads, recovered
from app.store.hfcache import RepoCache
from app.store.library import Library
from app.store.secrets import get_hf_token
from app.supervisor.downloads import (
    DownloadChanged,
    DownloadEvent,
    DownloadManager,
    DownloadProgress,
    DownloadSnapshot,
)
from app.supervisor.hub import HubClient, gated_error
from app.supervisor.router.runtime import Runtime

if TYPE_CHECKING:
    import httpx


class Pulls:
    def __init__(
        self,
        library: Callable[[], Library],
        runtime: Runtime,
        hardware: Callable[[], Hardware],
        warnings: list[str],
    ) -> None:
        self._library = library
        self._runtime = runtime
        self._hardware = hardware  # raises RuntimeError while no load has asked for the machine
        self._warnings = warnings  # the router's, where a download manager's warning is added
        self._http: httpx.AsyncClient | None = None
        self._hub: HubClient | None = None
        self._downloads: DownloadManager | None = None
        self._closing: asyncio.Task[None] | None = None  # an earlier folder's manager, closing

    # --- the Hub and the download manager -------------------------------------------------------------

    async def hub(self) -> HubClient:
        """The Hub client, made on first use; it reads the token when a request first needs it."""
        return self._client()

    def _client(self) -> HubClient:
        if self._hub is None:
            import httpx  # on first use: the window's start-up does without it

            self._http = httpx.AsyncClient()
            self._hub = HubClient(self._http, token=get_hf_token)
        return self._hub

    def downloads(self) -> DownloadManager:
        """The download manager, made (with the Hub client) when there is none."""
        if self._downloads is None:
            self._downloads = DownloadManager(self._library().cache_root, self._client(), cap_policy=self.cap)
            if self._downloads.warning:
                self._warnings.append(self._downloads.warning)
            self._downloads.subscribe(self._on_download)
        return self._downloads

    async def manager(self) -> DownloadManager:
        await self.hub()
        return self.downloads()

    @property
    def running(self) -> DownloadManager | None:
        """The download manager when one was made, without making one."""
        return self._downloads

    def records(self) -> dict[str, DownloadRecord] | None:
        return self._downloads.records if self._downloads else None

    def done_bytes(self, record: DownloadRecord) -> int:
        live = self._downloads.progress.get(record.id) if self._downloads else None
        return live if live is not None else record.done_bytes

    def folder_changed(self) -> None:
        """The models folder moved: downloads under way finish where they started, the next one goes to
        the new folder (an idle manager closes now, in the background)."""
        if self._downloads is None or self._downloads.busy:
            return
        self._closing = asyncio.ensure_future(self._downloads.close())
        self._downloads = None

    async def close(self, resume_later: bool) -> None:
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)
        if self._downloads is not None:
            await self._downloads.close(resume_later=resume_later)
        if self._http is not None:
            await self._http.aclose()

    def cap(self, recipe: str, remaining: int) -> BandwidthCap | None:
        """The seed's bandwidth cap for a download on unified memory (``app.core.fit.download_cap``)."""
        try:
            hardware = self._hardware()
        except RuntimeError:  # no load has asked for the machine yet
            hardware = detect_hardware()
        kind = memory_budget(hardware, recipe).kind
        return download_cap(kind, remaining, free_memory(kind, hardware))

    def _on_download(self, event: DownloadEvent) -> None:
        runtime = self._runtime
        runtime.emit(event)
        record = self._downloads.records.get(event.id) if self._downloads else None
        name = record.model if record else event.id
        downloading = runtime.in_phase(name, LoadState.DOWNLOADING)
        if downloading is not None and isinstance(event, DownloadProgress):
            runtime.set_phase(name, LoadState.DOWNLOADING, event.done, event.total, event.file)
        elif isinstance(event, DownloadChanged):
            runtime.changed(name)

    # --- pulls ----------------------------------------------------------------------------------------

    async def plan_pull(self, name_or_ref: str | Model, recipe: str | None = None) -> tuple[Model, FileSet]:
        """The model and the files a download of it needs (asks the Hub; downloads nothing)."""
        model = name_or_ref if isinstance(name_or_ref, Model) else self._library().resolve(name_or_ref)
        if model.repo_id is None:
            raise ModelError(f"{model.name} is a local model: there is nothing to download.")
        hub = await self.hub()
        ref = parse_ref(model.checkpoint)
        listing = await hub.listing(ref.repo_id)
        if listing.gated and not await hub.token():
            raise gated_error(ref.repo_id, hub.endpoint)
        files = select(listing, ref, recipe or model.recipe or None, model.mmproj)
        if model.user:
            model = dataclasses.replace(model, recipe=files.recipe, size_gb=round(files.size / GB, 3))
        return model, files

    async def download(self, model: Model, files: FileSet) -> DownloadRecord:
        """Fetch ``files`` for ``model`` into the cache (joining a download of it under way).

        Raises why it failed (``DownloadManager.outcome``); cancelling this call leaves the download
        running (pause or cancel it through ``downloads()``).
        """
        manager = await self._submit(model, files)
        record = await manager.outcome(model.checkpoint)
        if record.state is DownloadState.CANCELLED:
            raise asyncio.CancelledError
        return record

    async def add(self, ref: str) -> Model:
        """Register a Hub reference (``org/repo:VARIANT``) as a model and start its download; returns
        the model without waiting for the download (its progress comes as events)."""
        model, files = await self.plan_pull(ref)
        await self._submit(model, files)
        return model

    def register(self, model: Model) -> Model:
        """Register a model defined from outside, downloading nothing (``Library.define`` refuses a name
        defined otherwise); returns it as kept."""
        library = self._library()
        model = library.define(model)
        library.register(model)
        self._runtime.changed(model.name)
        return model

    async def _submit(self, model: Model, files: FileSet) -> DownloadManager:
        self._library().register(model)
        manager = await self.manager()
        self._runtime.forget_failure(model.name)
        manager.submit(model.checkpoint, model.name, files)
        self._runtime.changed(model.name)
        return manager

    async def pull(self, name_or_ref: str | Model, recipe: str | None = None) -> DownloadRecord:
        """The one pull: the CLI's, the window's and the API's."""
        model, files = await self.plan_pull(name_or_ref, recipe)
        return await self.download(model, files)

    async def pause(self, name: str) -> None:
        await (await self.manager()).pause(self._library().resolve(name).checkpoint)

    async def resume(self, name: str) -> None:
        (await self.manager()).resume(self._library().resolve(name).checkpoint)

    async def cancel(self, name: str, *, keep_partial: bool = False) -> None:
        """Stop a download and delete its partial files (``keep_partial``: keep them, so a later
        download of the model goes on from there)."""
        manager = await self.manager()
        await manager.cancel(self._library().resolve(name).checkpoint, keep_partial=keep_partial)
        self._runtime.changed(name)

    async def drop(self, model: Model) -> None:
        """Cancel the model's download, when this run's manager has one (before its files go)."""
        if self._downloads is not None and model.checkpoint in self._downloads.records:
            await self._downloads.cancel(model.checkpoint)

    def snapshots(self) -> list[DownloadSnapshot]:
        """Every download the app remembers (``<home>/downloads.json``), with speed and ETA for those
        running in this process. Reads files: front ends on the loop call it in a thread."""
        if self._downloads is not None:
            return self._downloads.snapshots()
        loaded = load_downloads()
        if loaded.warning:
            self._warnings.append(loaded.warning)
        root = self._library().cache_root
        out = []
        for record in (recovered(r, root) for r in loaded.items.values()):
            # Running in another process: its record's count is from when it started; the disk is now.
            live = RepoCache(root, record.files.repo_id).bytes_on_disk(record.files.files)
            out.append(DownloadSnapshot(record, live if record.state.active else record.done_bytes))
        return out

    async def open(self) -> list[str]:
        """Read the downloads remembered and resume those the app's last run left unfinished (quit or
        crash); returns the names of those resumed."""
        manager = await self.manager()
        resumed = []
        for record in list(manager.records.values()):
            if record.state is DownloadState.PAUSED and record.message == INTERRUPTED:
                manager.resume(record.id)
                resumed.append(record.model)
        if resumed:
            self._runtime.changed(*resumed)
        return resumed
