"""What the router tells its subscribers: its own event dataclasses, and the ``RouterEvent`` union of
those with the supervisor's, the download manager's, the remotes', the RPC worker's and the MCP
servers', which it passes on. Every event reaches subscribers on the loop thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from app.core.runcard import RunCard, dialect_label
from app.core.status import LoadState
from app.core.telemetry import Telemetry
from app.supervisor.downloads import DownloadEvent
from app.supervisor.mcp import McpServerChanged
from app.supervisor.remote_views import RemoteChanged
from app.supervisor.rpc import WorkerChanged
from app.supervisor.sampler import SystemSample
from app.supervisor.supervisor import SupervisorEvent


@dataclass(frozen=True)
class LoadProgress:
    """A one-click load entered a phase, or moved on within it."""

    model: str
    phase: LoadState  # one of ``LOAD_PHASES``
    done: int = 0  # bytes, in the download and install phases
    total: int = 0
    detail: str = ""


@dataclass(frozen=True)
class ModelsChanged:
    """The facts behind some models' statuses changed: front ends read ``statuses()`` again."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class EngineUsage:
    """A running engine's CPU and memory, sampled while someone watches (``Router.sample_usage``)."""

    model: str
    cpu_percent: float
    rss_bytes: int


@dataclass(frozen=True)
class EngineRecovery:
    """A crashed engine is being restarted, was restarted, or was given up on."""

    model: str
    message: str  # what happened and what the router does about it
    gave_up: bool  # True: the engine stays down until someone loads it again


class RequestSource(Enum):
    CHAT = "chat"  # the window's chat pane or the CLI
    API = "api"  # a request through the local API


class Dialect(Enum):
    """The local API's dialect a request was asked in."""

    OPENAI = "openai"  # /v1/, /v0/
    LEMONADE = "lemonade"  # /api/v1/, /api/v0/
    ANTHROPIC = "anthropic"  # messages under any prefix
    OLLAMA = "ollama"  # /api/NAME, /

    @property
    def label(self) -> str:
        """The dialect as people read it: "Ollama API"."""
        return dialect_label(self.value)


@dataclass(frozen=True)
class RequestFinished:
    """A reply ended: its figures, for the telemetry charts and the API's ``GET stats``."""

    model: str
    source: RequestSource
    telemetry: Telemetry
    dialect: Dialect | None = None  # an API request's; None for the window's chat and the CLI
    card: RunCard | None = None  # an API request's run card (the window's chat keeps its own)


RouterEvent = (
    SupervisorEvent
    | DownloadEvent
    | LoadProgress
    | ModelsChanged
    | EngineUsage
    | EngineRecovery
    | SystemSample
    | RequestFinished
    | WorkerChanged
    | RemoteChanged
    | McpServerChanged
)

Listener = Callable[[RouterEvent], None]
Emit = Callable[[RouterEvent], None]
