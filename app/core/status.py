"""A model's status, derived in one place from the router's facts: what is on disk, the last download,
the one-click load phase under way, the engine's state, the last load error and the pin.

``lemon-desk models``, the Model Manager, the tray and the local API all show this one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from app.core.downloads import DownloadState
from app.core.engine_state import EngineState


class LoadPhase(Enum):
    DOWNLOADING = "downloading"  # one-click load: fetching the model's files
    INSTALLING = "installing"  # one-click load: installing the backend it needs
    LOADING = "loading"  # the engine is starting


class Status(Enum):
    NOT_DOWNLOADED = "not downloaded"  # known, not on this machine (or only part of it, no download)
    DOWNLOADING = "downloading"  # a download is queued or fetching; ``percent`` says how far
    PAUSED = "paused"  # a download stopped part way; it can be resumed
    DOWNLOAD_FAILED = "download failed"  # the last download failed; ``message`` says why
    INSTALLING = "installing"  # its backend is being installed so that it can load
    DOWNLOADED = "downloaded"  # on this machine (downloaded or imported), not loaded
    LOADING = "loading"  # its engine is starting
    LOADED = "loaded"  # its engine is ready
    CRASHED = "crashed"  # its engine died; ``message`` says whether it is being restarted
    FAILED = "failed"  # the last load failed; ``message`` says why


@dataclass(frozen=True)
class ModelFacts:
    """What the router knows of one model."""

    on_disk: bool  # downloaded or imported: it can be loaded
    download: DownloadState | None = None  # the last download's state, when one is remembered
    done_bytes: int = 0  # of the download or the install under way
    total_bytes: int = 0
    download_message: str = ""
    phase: LoadPhase | None = None  # the one-click load under way
    engine: EngineState | None = None
    error: str = ""  # why the last load failed, or the crash and what the router does about it
    pinned: bool = False


@dataclass(frozen=True)
class ModelStatus:
    status: Status
    pinned: bool = False
    percent: int | None = None  # of a download or an install
    message: str = ""

    @property
    def text(self) -> str:
        """For people: ``downloading 42%``, ``loaded, pinned``."""
        text = self.status.value
        if self.percent is not None and self.status in (Status.DOWNLOADING, Status.PAUSED, Status.INSTALLING):
            text += f" {self.percent}%"
        return f"{text}, pinned" if self.pinned else text


def _percent(done: int, total: int) -> int | None:
    return min(100, int(100 * done / total)) if total > 0 else None


_FROM_DOWNLOAD = {
    DownloadState.QUEUED: Status.DOWNLOADING,
    DownloadState.RUNNING: Status.DOWNLOADING,
    DownloadState.PAUSED: Status.PAUSED,
    DownloadState.FAILED: Status.DOWNLOAD_FAILED,
}


def model_status(facts: ModelFacts) -> ModelStatus:
    """The engine wins over a load under way, which wins over an error, which wins over the files."""
    percent = _percent(facts.done_bytes, facts.total_bytes)
    if facts.engine is EngineState.READY:
        return ModelStatus(Status.LOADED, facts.pinned)
    if facts.engine is EngineState.STARTING or facts.phase is LoadPhase.LOADING:
        return ModelStatus(Status.LOADING, facts.pinned)
    if facts.phase is LoadPhase.INSTALLING:
        return ModelStatus(Status.INSTALLING, facts.pinned, percent)
    if facts.phase is LoadPhase.DOWNLOADING:
        return ModelStatus(Status.DOWNLOADING, facts.pinned, percent)
    if facts.engine is EngineState.CRASHED:
        return ModelStatus(Status.CRASHED, facts.pinned, message=facts.error)
    if facts.error:
        return ModelStatus(Status.FAILED, facts.pinned, message=facts.error)
    if facts.download in _FROM_DOWNLOAD and not (facts.on_disk and facts.download is DownloadState.FAILED):
        status = _FROM_DOWNLOAD[facts.download]
        return ModelStatus(status, facts.pinned, percent, facts.download_message)
    return ModelStatus(Status.DOWNLOADED if facts.on_disk else Status.NOT_DOWNLOADED, facts.pinned)
