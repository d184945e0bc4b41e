"""A model download as the app remembers it: what to fetch, how far it got, how it ended.

Its states and the legal moves between them (``_TRANSITIONS``; ``DownloadRecord.with_state`` makes every
move, the download manager in ``app.supervisor.downloads`` asks for them)::

    QUEUED -> RUNNING -> DONE
      |          |-----> PAUSED  -> QUEUED (resumed)
      '----------+-----> FAILED  -> QUEUED (tried again)
                 '-----> CANCELLED -> QUEUED (downloaded again)

Any state but DONE can be cancelled; a DONE one is final (pulled again, it is a new download).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from app.core.errors import ConfigError
from app.core.moves import check_move
from app.core.names import listing_problem, path_problem, repo_id_problem
from app.core.refs import FileSet, RepoFile, RepoListing

INTERRUPTED = "Interrupted when the app stopped; resume it to go on from where it was."


class DownloadState(Enum):
    QUEUED = "queued"  # waiting for a free download slot
    RUNNING = "running"  # fetching bytes
    PAUSED = "paused"  # stopped by the user or by the app exiting; the partial files are kept
    DONE = "done"  # every file verified and linked into the cache
    FAILED = "failed"  # stopped by an error; ``message`` says which and what to do
    CANCELLED = "cancelled"  # stopped by the user; partial files deleted unless the user kept them

    @property
    def active(self) -> bool:
        return self in (DownloadState.QUEUED, DownloadState.RUNNING)


_TRANSITIONS: dict[DownloadState, frozenset[DownloadState]] = {
    DownloadState.QUEUED: frozenset(
        {DownloadState.RUNNING, DownloadState.PAUSED, DownloadState.FAILED, DownloadState.CANCELLED}
    ),
    DownloadState.RUNNING: frozenset(
        {DownloadState.DONE, DownloadState.PAUSED, DownloadState.FAILED, DownloadState.CANCELLED}
    ),
    DownloadState.PAUSED: frozenset({DownloadState.QUEUED, DownloadState.CANCELLED}),
    DownloadState.DONE: frozenset(),  # pulled again, it is a new download
    DownloadState.FAILED: frozenset({DownloadState.QUEUED, DownloadState.CANCELLED}),
    # Cancelled again: the partial files kept the first time may be deleted now, and the message says so.
    DownloadState.CANCELLED: frozenset({DownloadState.QUEUED, DownloadState.CANCELLED}),
}


@dataclass(frozen=True)
class DownloadRecord:
    id: str  # the model's checkpoint ("org/repo:VARIANT"): one download per checkpoint
    model: str  # the model's name
    files: FileSet
    state: DownloadState = DownloadState.QUEUED
    message: str = ""
    done_bytes: int = 0  # bytes on disk when the state last changed

    def with_state(
        self, state: DownloadState, message: str = "", done_bytes: int | None = None
    ) -> DownloadRecord:
        """The record moved to ``state``; IllegalMove when the table does not allow that move."""
        check_move(f"download {self.id}", _TRANSITIONS, self.state, state)
        done = self.done_bytes if done_bytes is None else done_bytes
        return replace(self, state=state, message=message, done_bytes=done)

    def to_json(self) -> dict[str, Any]:
        fs = self.files
        return {
            "model": self.model,
            "state": self.state.value,
            "message": self.message,
            "done_bytes": self.done_bytes,
            "total_bytes": fs.size,
            "repo_id": fs.repo_id,
            "revision": fs.revision,
            "recipe": fs.recipe,
            "label": fs.label,
            "main": fs.main,
            "mmproj": fs.mmproj,
            "files": [
                {"path": f.path, "size": f.size, "sha256": f.sha256, "blob_id": f.blob_id} for f in fs.files
            ],
        }


def record_from_json(download_id: str, raw: Any) -> DownloadRecord:
    try:
        files = tuple(
            RepoFile(str(f["path"]), int(f["size"]), f.get("sha256"), f.get("blob_id")) for f in raw["files"]
        )
        fileset = FileSet(
            repo_id=str(raw["repo_id"]),
            revision=str(raw["revision"]),
            recipe=str(raw["recipe"]),
            label=str(raw["label"]),
            files=files,
            main=raw.get("main"),
            mmproj=raw.get("mmproj"),
        )
        if why := _unsafe(fileset):
            raise ConfigError(f"Download '{download_id}' is not safe to use: {why}.")
        return DownloadRecord(
            id=download_id,
            model=str(raw["model"]),
            files=fileset,
            state=DownloadState(raw["state"]),
            message=str(raw.get("message", "")),
            done_bytes=int(raw.get("done_bytes", 0)),
        )
    # OverflowError: int() of a size or count that JSON wrote as Infinity (or 1e999)
    except (KeyError, TypeError, ValueError, OverflowError) as err:
        raise ConfigError(f"Download '{download_id}' is malformed ({err}).") from None


def _unsafe(fs: FileSet) -> str | None:
    """What in a stored record cannot safely become a path: the file may have been edited or damaged."""
    if why := repo_id_problem(fs.repo_id):
        return f"the repo {fs.repo_id!r} {why}"
    for what, path in (("main file", fs.main), ("projector", fs.mmproj)):
        if path is not None and (why := path_problem(path)):
            return f"the {what} {path!r} {why}"
    return listing_problem(RepoListing(fs.repo_id, fs.revision, fs.files))
