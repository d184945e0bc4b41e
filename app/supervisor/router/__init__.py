"""The router: the one owner of what runs, and this package's face. Front ends (the bridge, the CLI's
commands, the local API) import from here only; the modules behind it are its parts:

- ``events``: what the router tells subscribers (its dataclasses and the ``RouterEvent`` union).
- ``runtime``: one ``ModelRuntime`` record per model for this run, and the saved options and pins.
- ``backends``: a load's ``LoadOptions`` and the install of the backend it needs.
- ``pulls``: the Hub client and the download manager, and every verb that fetches a model's files.
- ``discover``: the first run's suggestion, Hub search, shapes read from the Hub, labels, counts.
- ``views``: a model as every front end shows it (``ModelView``), its one status derived once.
- ``loading``: one-click load, fit check, eviction, caps and idle unload (``app.core.policy``).
- ``recovery``: restart a crashed engine with backoff, or give up with its last words.
- ``requests``: chat, replay, run cards, request accounting; the one place deciding local or remote.
- ``tools``: the tool loop, a reply's calls of MCP tools run (with permission) and fed back.
- ``usage``: engine and machine samples; ``worker``: this machine's RPC worker.
- ``router``: the composition, ``Router``, and its staged shutdown.
"""

from app.supervisor.router.catalog import Catalog
from app.supervisor.router.discover import Suggestion
from app.supervisor.router.engines import EngineSnapshot, device_of
from app.supervisor.router.events import (
    Dialect,
    EngineRecovery,
    EngineUsage,
    Listener,
    LoadProgress,
    ModelsChanged,
    RequestFinished,
    RequestSource,
    RouterEvent,
)
from app.supervisor.router.router import Router
from app.supervisor.router.views import ModelView

__all__ = [
    "Catalog",
    "Dialect",
    "EngineRecovery",
    "EngineSnapshot",
    "EngineUsage",
    "Listener",
    "LoadProgress",
    "ModelView",
    "ModelsChanged",
    "RequestFinished",
    "RequestSource",
    "Router",
    "RouterEvent",
    "Suggestion",
    "device_of",
]
