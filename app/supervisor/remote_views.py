"""What the router and its front ends see of the remote servers (``app.supervisor.remotes``): the
``RemoteChanged`` event, a remote's ``RemoteSnapshot`` and each of its models' ``RemoteModelView``;
values only, taken now."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from app.core.remotes import (
    RemoteKind,
    RemoteModelInfo,
    RemoteModelStatus,
    RemoteRef,
    RemoteState,
    remote_model_status,
)
from app.core.units import GB


@dataclass(frozen=True)
class RemoteChanged:
    """A remote moved between states (``old`` is not ``state``), its model list changed (``old`` is
    ``state``), or it was added or removed."""

    name: str
    old: RemoteState
    state: RemoteState
    message: str = ""  # why it is unreachable or refused
    removed: bool = False

    @property
    def moved(self) -> bool:
        return self.old is not self.state


@dataclass(frozen=True)
class RemoteSnapshot:
    """A remote as front ends show it (read-only)."""

    name: str
    url: str
    state: RemoteState
    kind: RemoteKind | None
    version: str
    message: str
    since: float  # when it entered its state, seconds since the epoch
    has_key: bool
    models: tuple[RemoteModelInfo, ...]  # the last list it sent (kept while it is unreachable)

    @property
    def text(self) -> str:
        """``reachable``, ``unreachable since 14:02``..."""
        state: str = self.state.value
        if self.state in (RemoteState.UNREACHABLE, RemoteState.REFUSED):
            return f"{state} since {time.strftime('%H:%M', time.localtime(self.since))}"
        return state

    def views(self) -> list[RemoteModelView]:
        return [RemoteModelView(self, m, remote_model_status(self.state, m.loaded)) for m in self.models]

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.url,
            "state": self.state.value,
            "kind": self.kind.value if self.kind else None,
            "version": self.version or None,
            "message": self.message,
            "since": round(self.since, 3),
            "key": self.has_key,
            "models": [m.id for m in self.models],
        }


@dataclass(frozen=True)
class RemoteModelView:
    """A remote's model with its one status: what ``models``, the Model Manager, the tray and the API show."""

    remote: RemoteSnapshot
    info: RemoteModelInfo
    status: RemoteModelStatus

    @property
    def name(self) -> str:
        return RemoteRef(self.remote.name, self.info.id).name

    @property
    def message(self) -> str:
        return self.remote.message

    def to_json(self) -> dict[str, Any]:
        """The keys of ``lemon-desk models --json``'s local rows that apply, and the remote's."""
        return {
            "name": self.name,
            "recipe": self.info.recipe,
            "checkpoint": self.info.checkpoint,
            "labels": list(self.info.labels),
            "size_gb": round(self.info.size_bytes / GB, 3),
            "user": False,
            "downloaded": True,  # on its remote: nothing to download here
            "state": self.status.value,
            "pinned": False,
            "message": self.message,
            "remote": self.remote.name,
            "remote_url": self.remote.url,
            "remote_model": self.info.id,
        }
