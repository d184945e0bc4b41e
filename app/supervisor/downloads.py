"""Model downloads as tasks the ``DownloadManager`` owns (the router's ``pulls`` part keeps the manager):
a few at once, pause / resume / cancel, resume after a crash.

Each download fetches its files one after another into the Hugging Face cache (``blobs/<oid>``, through
``blobs/<oid>.part`` so a new process resumes it), verifies them (SHA-256 for LFS files, the git blob id
for small ones; a damaged file is deleted and fetched once more), links them into
``snapshots/<commit>/`` and points ``refs/main`` at the commit. Files the cache already holds are
linked, not fetched. Records live in ``<home>/downloads.json`` and are written at every state change;
a download that was running when the process died comes back paused.

Subscribers get plain dataclass events (``DownloadProgress``, ``DownloadChanged``) on the loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.downloads import INTERRUPTED, DownloadRecord, DownloadState
from app.core.errors import ChecksumError, DownloadError, LemonDeskError, ModelError, StorageError
from app.core.fit import BandwidthCap
from app.core.refs import FileSet, RepoFile
from app.core.units import GB
from app.store.downloads import (
    DownloadLock,
    download_in_progress,
    load_downloads,
    recovered,
    save_downloads,
)
from app.store.hfcache import RepoCache
from app.store.saving import saving
from app.supervisor.fetch import Progress, fetch
from app.supervisor.hub import HubClient, gated_error, missing_error
from app.supervisor.listeners import Listeners

if TYPE_CHECKING:
    import httpx


@dataclass(frozen=True)
class DownloadProgress:
    id: str
    file: str  # the file being fetched
    done: int  # bytes of the whole download on disk
    total: int
    speed_bps: float
    eta_s: float | None
    cap: BandwidthCap | None = None  # the download is throttled, and why
    file_done: int = 0  # bytes of ``file`` on disk


@dataclass(frozen=True)
class DownloadSnapshot:
    """A download as front ends list it: its record, how far it is, and (while it runs in this
    process) its speed and ETA."""

    record: DownloadRecord
    done: int
    speed_bps: float | None = None  # None: not running here, so unknown
    eta_s: float | None = None
    cap: BandwidthCap | None = None

    @property
    def total(self) -> int:
        return self.record.files.size

    @property
    def percent(self) -> float:
        return 100.0 * self.done / self.total if self.total else 100.0

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "model": r.model,
            "id": r.id,
            "state": r.state.value,
            "message": r.message,
            "done_bytes": self.done,
            "total_bytes": self.total,
            "percent": round(self.percent, 1),
            "speed_bps": self.speed_bps,
            "eta_s": self.eta_s,
            "capped_bps": self.cap.bps if self.cap else None,
            "cap_reason": self.cap.reason if self.cap else None,
            "recipe": r.files.recipe,
            "repo_id": r.files.repo_id,
            "label": r.files.label,
        }


@dataclass(frozen=True)
class DownloadChanged:
    id: str
    state: DownloadState
    message: str
    record: DownloadRecord


DownloadEvent = DownloadProgress | DownloadChanged
Subscriber = Callable[[DownloadEvent], None]
# (recipe, bytes left to fetch) -> the cap to apply, or None (see app.core.fit.download_cap).
CapPolicy = Callable[[str, int], "BandwidthCap | None"]


def git_blob_id(path: Path) -> str:
    """The git object id of a file's content, as the Hub lists it for files outside LFS."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk_space(target: Path, need: int, what: str) -> None:
    """Refuse a download that cannot fit on the disk, saying how much is missing."""
    free = shutil.disk_usage(_existing_ancestor(target)).free
    if need > free:
        raise ModelError(
            f"Not enough disk space for {what}: it needs {need / GB:.2f} GB, and {free / GB:.2f} GB is free "
            f"where the models go ({target}).",
            f"Free up {(need - free) / GB:.2f} GB, or choose another models folder in the settings.",
        )


def _cancelled_message(kept: bool) -> str:
    if kept:
        return "Cancelled; the partial files were kept, so downloading it again goes on from there."
    return "Cancelled; the partial files were deleted."


class DownloadManager:
    """Every download's record and task, and the events they make (the module docstring says how)."""

    def __init__(
        self,
        cache_root: Path,
        hub: HubClient,
        *,
        max_parallel: int = 2,
        stall_timeout_s: float = 30.0,
        backoff_s: float = 0.5,
        cap_policy: CapPolicy | None = None,
    ) -> None:
        self.cache_root = cache_root
        self.cap_policy = cap_policy
        self.hub = hub
        self._http: httpx.Client | None = None
        self.stall_timeout_s = stall_timeout_s
        self.backoff_s = backoff_s
        self._slots = asyncio.Semaphore(max_parallel)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._intents: dict[str, DownloadState] = {}  # why a task is being cancelled: pause or cancel
        self._keep: dict[str, bool] = {}  # a cancel that keeps the partial files
        self._resume_later = False  # pauses now are the window quitting: its next start resumes them
        self.progress: dict[str, int] = {}  # bytes on disk of each running download, as they arrive
        self.latest: dict[str, DownloadProgress] = {}  # the last progress of each running download
        self.caps: dict[str, BandwidthCap] = {}  # the running downloads that are throttled
        self._failures: dict[str, LemonDeskError] = {}  # why each download that failed here failed
        self._subscribers: Listeners[DownloadEvent] = Listeners("the downloads")
        loaded = load_downloads()
        self.warning = loaded.warning
        self.records = {rid: self._recovered(r) for rid, r in loaded.items.items()}

    @property
    def busy(self) -> bool:
        """A download is queued or running."""
        return bool(self._tasks)

    @property
    def http(self) -> httpx.Client:
        """A blocking client: file bytes move in worker threads (see fetch)."""
        if self._http is None:
            import httpx

            self._http = httpx.Client()
        return self._http

    def _recovered(self, record: DownloadRecord) -> DownloadRecord:
        return recovered(record, self.cache_root)

    def snapshots(self) -> list[DownloadSnapshot]:
        """Every download remembered, with live progress for those running here."""
        out = []
        for rid, record in self.records.items():
            live = self.latest.get(rid)
            done = self.progress.get(rid, record.done_bytes)
            if live is None:
                out.append(DownloadSnapshot(record, done, cap=self.caps.get(rid)))
            else:
                out.append(DownloadSnapshot(record, done, live.speed_bps, live.eta_s, self.caps.get(rid)))
        return out

    # -- events

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        return self._subscribers.add(subscriber)

    def _emit(self, event: DownloadEvent) -> None:
        self._subscribers.emit(event)

    def _set(
        self, rid: str, state: DownloadState, message: str = "", done: int | None = None
    ) -> DownloadRecord:
        """Move the download to ``state`` (as ``DownloadRecord.with_state`` allows), save it and say so."""
        return self._put(self.records[rid].with_state(state, message, done))

    def _put(self, record: DownloadRecord) -> DownloadRecord:
        """Keep ``record`` and tell the listeners; a StorageError if it could not be saved (said all the
        same: the record here is what this process does)."""
        self.records[record.id] = record
        try:
            with saving("the download list"):
                self._save(record.id)
        finally:
            self._emit(DownloadChanged(record.id, record.state, record.message, record))
        return record

    def _save(self, rid: str) -> None:
        """Merge this record into the file: another process (the CLI, the window) may own others."""
        on_disk = load_downloads().items
        if rid in self.records:
            on_disk[rid] = self.records[rid]
        else:
            on_disk.pop(rid, None)
        save_downloads(on_disk)

    # -- intents

    def submit(self, rid: str, model: str, files: FileSet) -> DownloadRecord:
        """Start (or restart) the download of ``files``; one download per ``rid`` at a time."""
        if rid in self._tasks:
            return self.records[rid]
        self.records[rid] = DownloadRecord(rid, model, files, done_bytes=self._on_disk(files))
        return self._start(rid)

    def resume(self, rid: str) -> DownloadRecord:
        record = self._record(rid)
        if rid in self._tasks or record.state is DownloadState.DONE:
            return record
        return self._start(rid)

    def _start(self, rid: str) -> DownloadRecord:
        self._failures.pop(rid, None)
        record = self.records[rid]
        # A new record is queued already; one another process runs is queued here too (its lock then
        # refuses this run): neither is a move of this manager's.
        if record.state.active:
            record = self._put(replace(record, state=DownloadState.QUEUED, message=""))
        else:
            record = self._set(rid, DownloadState.QUEUED)
        self._tasks[rid] = asyncio.create_task(self._run(rid), name=f"download {rid}")
        return record

    async def pause(self, rid: str) -> DownloadRecord:
        self._not_elsewhere(rid, "pause")
        await self._stop(rid, DownloadState.PAUSED)
        return self._record(rid)

    async def cancel(self, rid: str, *, keep_partial: bool = False) -> DownloadRecord:
        """Stop, and delete the partial files unless ``keep_partial`` (a later download resumes them)."""
        record = self._record(rid)
        self._not_elsewhere(rid, "cancel")
        intent = DownloadState.CANCELLED
        if keep_partial:
            self._keep[rid] = True
        try:
            stopped = await self._stop(rid, intent)
        finally:
            self._keep.pop(rid, None)
        if not stopped and record.state is not DownloadState.DONE:
            if not keep_partial:
                RepoCache(self.cache_root, record.files.repo_id).remove_partials(record.files.files)
            done = self._on_disk(record.files) if keep_partial else 0
            self._set(rid, intent, _cancelled_message(keep_partial), done=done)
        return self._record(rid)

    def _not_elsewhere(self, rid: str, verb: str) -> None:
        """Only the process that runs a download can stop it; say which one does."""
        if rid not in self._tasks and download_in_progress(rid):
            raise ModelError(
                f"{rid} is being downloaded by another Lemon Desk process.",
                f"{verb.capitalize()} it there: the window's downloads panel, or Ctrl-C in its `pull`.",
            )

    async def wait(self, rid: str) -> DownloadRecord:
        task = self._tasks.get(rid)
        if task is not None:
            await asyncio.wait([task])
        return self._record(rid)

    async def close(self, resume_later: bool = False) -> None:
        """Pause everything (the process is ending); partial files stay. ``resume_later``: marked as
        interrupted, for the window's next start to resume (a ``pull`` stopped with Ctrl-C stays paused)."""
        self._resume_later = resume_later
        for rid in list(self._tasks):
            await self._stop(rid, DownloadState.PAUSED)
        if self._http is not None:
            self._http.close()
            self._http = None

    async def outcome(self, rid: str) -> DownloadRecord:
        """``wait``, and raise why the download failed: the error itself, so that a network failure
        (a DownloadError) stays one for the local API's 502; a failure of an earlier run, by its message."""
        record = await self.wait(rid)
        if record.state is DownloadState.FAILED:
            raise self._failures.get(rid) or ModelError(record.message)
        return record

    def _record(self, rid: str) -> DownloadRecord:
        try:
            return self.records[rid]
        except KeyError:
            raise ModelError(f"There is no download of {rid}.") from None

    async def _stop(self, rid: str, intent: DownloadState) -> bool:
        task = self._tasks.get(rid)
        if task is None:
            return False
        self._intents[rid] = intent
        task.cancel()
        await asyncio.wait([task])
        return True

    # -- the work

    def _on_disk(self, files: FileSet) -> int:
        return RepoCache(self.cache_root, files.repo_id).bytes_on_disk(files.files)

    async def _run(self, rid: str) -> None:
        files = self.records[rid].files
        lock = DownloadLock(rid)
        try:
            async with self._slots:
                if not lock.acquire():
                    raise ModelError(
                        f"{rid} is being downloaded by another Lemon Desk process.",
                        "Let that one finish (the window or a `lemon-desk pull`), or stop it first.",
                    )
                self._set(rid, DownloadState.RUNNING, done=self._on_disk(files))
                await self._download(rid, files)
            self._set(rid, DownloadState.DONE, done=files.size)
        except asyncio.CancelledError:
            intent = self._intents.pop(rid, DownloadState.PAUSED)
            message = INTERRUPTED if intent is DownloadState.PAUSED and self._resume_later else ""
            if intent is DownloadState.CANCELLED:
                keep = self._keep.get(rid, False)
                if not keep:
                    RepoCache(self.cache_root, files.repo_id).remove_partials(files.files)
                message = _cancelled_message(keep)
            self._set(rid, intent, message, done=self._on_disk(files))
        except LemonDeskError as err:
            self._failures[rid] = err
            # Failed here and said, even when the reason is that no record can be saved.
            with contextlib.suppress(StorageError):
                self._set(rid, DownloadState.FAILED, str(err), done=self._on_disk(files))
        finally:
            lock.release()
            self._tasks.pop(rid, None)
            self.progress.pop(rid, None)
            self.latest.pop(rid, None)
            self.caps.pop(rid, None)

    async def _download(self, rid: str, files: FileSet) -> None:
        cache = RepoCache(self.cache_root, files.repo_id)
        todo = [f for f in files.files if not cache.has_blob(f)]
        check_disk_space(
            cache.folder, sum(f.size for f in todo) - cache.partial_bytes(tuple(todo)), f"{files.repo_id}"
        )
        done = files.size - sum(f.size for f in todo)
        cap = None
        if self.cap_policy is not None:  # may probe the machine: in a thread
            cap = await asyncio.to_thread(self.cap_policy, files.recipe, files.size - self._on_disk(files))
        if cap is not None:
            self.caps[rid] = cap
        for file in files.files:
            if file in todo:
                await self._fetch_verified(rid, cache, file, done, files.size)
                done += file.size
            cache.link(files.revision, file)
        cache.set_ref(files.revision)

    async def _fetch_verified(
        self, rid: str, cache: RepoCache, file: RepoFile, before: int, total: int
    ) -> None:
        def on_progress(p: Progress) -> None:
            done = before + p.done
            self.progress[rid] = done
            eta = (total - done) / p.speed_bps if p.speed_bps > 0 else None
            event = DownloadProgress(rid, file.path, done, total, p.speed_bps, eta, cap, p.done)
            self.latest[rid] = event
            self._emit(event)

        cap = self.caps.get(rid)

        url = self.hub.file_url(cache.repo_id, self.records[rid].files.revision, file.path)
        blob = cache.blob(file.oid)
        for attempt in (1, 2):
            try:
                await fetch(
                    self.http,
                    url,
                    blob,
                    sha256=file.sha256,
                    headers=await self.hub.headers(),
                    on_progress=on_progress,
                    stall_timeout_s=self.stall_timeout_s,
                    backoff_s=self.backoff_s,
                    max_bps=cap.bps if cap else None,
                )
                if (
                    file.sha256 is None
                    and file.blob_id
                    and await asyncio.to_thread(git_blob_id, blob) != file.blob_id
                ):
                    blob.unlink()
                    raise ChecksumError(f"{file.path} is corrupt: its git blob id is not {file.blob_id}.")
                return
            except ChecksumError:
                if attempt == 2:
                    raise ChecksumError(
                        f"{file.path} from {cache.repo_id} arrived damaged twice (its checksum did not "
                        "match); the damaged copies were deleted.",
                        "Try again later; if it keeps happening, the file on the Hub or a proxy is at fault.",
                    ) from None
            except DownloadError as err:
                if err.status in (401, 403):
                    raise gated_error(cache.repo_id, self.hub.endpoint, err.status) from None
                if err.status == 404:
                    raise missing_error(cache.repo_id, file.path) from None
                raise
