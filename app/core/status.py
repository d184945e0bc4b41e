"""A model's status, derived in one place from the router's facts: what is on disk, the last download,
the model's ``LoadState`` (a one-click load's phase, a crash being recovered, a load that failed) with
its error, the engine's state and the pin. ``LoadState``'s legal moves are ``_LOAD_TRANSITIONS``;
the router's ``ModelRuntime.move`` is the one place that makes them.

``lemon-desk models``, the Model Manager, the tray and the local API all show this one value.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from app.core.downloads import DownloadState
from app.core.engine_state import EngineState
from app.core.moves import check_move


class LoadState(Enum):
    IDLE = "idle"  # no load under way, none failed: not loaded, unloaded, or a new load forgot the last
    DOWNLOADING = "downloading"  # one-click load: fetching the model's files
    INSTALLING = "installing"  # one-click load: installing the backend it needs
    LOADING = "loading"  # one-click load: the engine is starting
    RUNNING = "running"  # the load launched its engine (or a restart did), and it has not crashed since
    RESTARTING = "restarting"  # its engine crashed; a restart is due (``error`` says when)
    GAVE_UP = "gave up"  # it crashed too often, or did not start again: it stays down till loaded again
    FAILED = "failed"  # the last load failed; ``error`` says why


LOAD_PHASES = frozenset({LoadState.DOWNLOADING, LoadState.INSTALLING, LoadState.LOADING})
_CRASH = frozenset({LoadState.RESTARTING, LoadState.GAVE_UP})  # what the router does about a crash

#   IDLE -> DOWNLOADING -> INSTALLING -> LOADING -> RUNNING
#                 '-------------'------------'----> FAILED (why in ``error``)
#   a crash (RUNNING, or wherever an engine runs) -> RESTARTING -> RUNNING
#                                                        '------> GAVE_UP
# A load starts from IDLE (it forgets the last outcome first). Any state can go back to IDLE: unloaded,
# cancelled, or a new load. A crash can come wherever an engine runs: an earlier load's engine keeps
# running while a new load of the model gets ready, and fails or not.
_LOAD_TRANSITIONS: dict[LoadState, frozenset[LoadState]] = {
    LoadState.IDLE: LOAD_PHASES | _CRASH | {LoadState.FAILED},
    LoadState.DOWNLOADING: frozenset(
        {LoadState.IDLE, LoadState.INSTALLING, LoadState.LOADING, LoadState.FAILED}
    ),
    LoadState.INSTALLING: _CRASH | {LoadState.IDLE, LoadState.LOADING, LoadState.FAILED},
    LoadState.LOADING: _CRASH | {LoadState.IDLE, LoadState.RUNNING, LoadState.FAILED},
    LoadState.RUNNING: _CRASH | {LoadState.IDLE},
    LoadState.RESTARTING: _CRASH | {LoadState.IDLE, LoadState.RUNNING, LoadState.FAILED},
    LoadState.GAVE_UP: frozenset({LoadState.IDLE, LoadState.FAILED}),
    LoadState.FAILED: _CRASH | {LoadState.IDLE},
}


def check_load_move(model: str, old: LoadState, new: LoadState) -> None:
    """IllegalMove unless ``_LOAD_TRANSITIONS`` allows ``old -> new`` (staying put is not a move)."""
    if new is not old:
        check_move(f"the load of {model}", _LOAD_TRANSITIONS, old, new)


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
    load: LoadState = LoadState.IDLE
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


def unfinished(download: DownloadState | None) -> bool:
    """A download the status shows: under way, paused, or failed (till it is tried again)."""
    return download in _FROM_DOWNLOAD


def on_disk(files_here: bool, from_hub: bool, download: DownloadState | None) -> bool:
    """Whether a model counts as on this machine: all its files are here and, for one from the Hub, no
    download of it is unfinished."""
    return files_here and not (from_hub and unfinished(download))


def model_status(facts: ModelFacts) -> ModelStatus:
    """The engine wins over a load under way, which wins over an error, which wins over the files."""
    percent = _percent(facts.done_bytes, facts.total_bytes)
    if facts.engine is EngineState.READY:
        return ModelStatus(Status.LOADED, facts.pinned)
    if facts.engine is EngineState.STARTING or facts.load is LoadState.LOADING:
        return ModelStatus(Status.LOADING, facts.pinned)
    if facts.load is LoadState.INSTALLING:
        return ModelStatus(Status.INSTALLING, facts.pinned, percent)
    if facts.load is LoadState.DOWNLOADING:
        return ModelStatus(Status.DOWNLOADING, facts.pinned, percent)
    if facts.engine is EngineState.CRASHED:
        return ModelStatus(Status.CRASHED, facts.pinned, message=facts.error)
    if facts.error:
        return ModelStatus(Status.FAILED, facts.pinned, message=facts.error)
    if facts.download in _FROM_DOWNLOAD and not (facts.on_disk and facts.download is DownloadState.FAILED):
        status = _FROM_DOWNLOAD[facts.download]
        return ModelStatus(status, facts.pinned, percent, facts.download_message)
    return ModelStatus(Status.DOWNLOADED if facts.on_disk else Status.NOT_DOWNLOADED, facts.pinned)
