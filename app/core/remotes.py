"""Remote backends, the pure part: a remote's name and address, its models' names (``@NAME/MODEL``),
its state and the legal moves between them, and its model list read from what it sent.

A remote is another machine's OpenAI-compatible server: another Lemon Desk's local API, a Lemonade
Server, or any server that answers ``GET /v1/models`` and ``POST /v1/chat/completions``. Its state::

    UNKNOWN --> REACHABLE <--> UNREACHABLE
       |            ^  \\          ^
       |            |   v         |
       '-------> REFUSED <--------'

UNKNOWN is only the start (nothing asked yet); every other state can follow any other, each move being
one event (``app.supervisor.remotes``, the one place that makes them).

Everything a remote sends is checked here before it is shown or used: model ids are text of a bounded
length without control characters, at most ``MAX_MODELS`` of them. A remote's own remotes (ids that
start with ``@``) are left out: one hop only, so that two Lemon Desks that are each other's remote do not
list each other's lists without end.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from app.core.errors import ConfigError
from app.core.names import plain_name_problem
from app.core.units import GB

PREFIX = "@"
MAX_NAME = 64
MAX_MODEL_ID = 256
MAX_MODELS = 2000
# The prefixes a server root is given with, stripped: Lemon Desk and Lemonade serve both, OpenAI /v1.
API_SUFFIXES = ("/api/v1", "/v1")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")


class RemoteState(Enum):
    UNKNOWN = "checking"  # not asked yet (just added, or the app just started)
    REACHABLE = "reachable"  # answered its model list with the key it was given
    UNREACHABLE = "unreachable"  # did not answer, or not as an OpenAI-compatible server; retried with backoff
    REFUSED = "key refused"  # answered 401/403: the key is missing or wrong


_TRANSITIONS: dict[RemoteState, frozenset[RemoteState]] = {
    RemoteState.UNKNOWN: frozenset({RemoteState.REACHABLE, RemoteState.UNREACHABLE, RemoteState.REFUSED}),
    RemoteState.REACHABLE: frozenset({RemoteState.UNREACHABLE, RemoteState.REFUSED}),
    RemoteState.UNREACHABLE: frozenset({RemoteState.REACHABLE, RemoteState.REFUSED}),
    RemoteState.REFUSED: frozenset({RemoteState.REACHABLE, RemoteState.UNREACHABLE}),
}


def can_transition(old: RemoteState, new: RemoteState) -> bool:
    return new in _TRANSITIONS[old]


class RemoteKind(Enum):
    LEMON_DESK = "Lemon Desk"  # another Lemon Desk: Lemonade's routes (load, unload, stats) and ours
    LEMONADE = "Lemonade"  # a Lemonade Server: load, unload and stats under /api/v1
    OPENAI = "OpenAI-compatible"  # only OpenAI's routes: models load there as its own rules say


SERVER_LEMON_DESK = "lemon-desk"  # the "server" of Lemon Desk's GET /api/v1/health: another Lemon Desk


# --- names and addresses ----------------------------------------------------------------------------


def check_remote_name(name: str) -> str:
    """A remote's name, as the user typed it; else a ConfigError saying what is allowed."""
    if why := plain_name_problem(name, MAX_NAME):
        raise ConfigError(
            f"{name!r} cannot name a remote: it {why}.",
            f"Use letters, digits, '.', '_' and '-' (at most {MAX_NAME}), starting with a letter or digit.",
        )
    return name


def normalise_url(text: str) -> str:
    """The server root of a remote's address: ``http(s)://host[:port][/path]`` without a trailing ``/v1``
    or ``/api/v1`` (both prefixes are served from the root). Anything else is a ConfigError."""
    example = "Give one such as http://192.168.1.20:13305."
    raw = text.strip()
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as err:
        raise ConfigError(f"{raw!r} is not a usable address: {err}.", example) from None
    if parts.scheme.lower() not in ("http", "https"):
        raise ConfigError(f"{raw!r} is not an http:// or https:// address.", example)
    if "@" in parts.netloc:
        raise ConfigError(
            "The address holds a user name or password, which would be kept in a plain file.",
            "Leave them out of the address and give the key with --api-key (it goes to the keychain).",
        )
    host = parts.hostname or ""
    bracketed = parts.netloc.startswith("[")
    if not host or (not bracketed and not _HOST.fullmatch(host)):
        raise ConfigError(f"{raw!r} names no usable host.", example)
    if port == 0:
        raise ConfigError(f"{raw!r} has port 0, which no server listens on.", example)
    if parts.query or parts.fragment:
        raise ConfigError(f"{raw!r} has a query or fragment; a server root has neither.", example)
    path = parts.path.rstrip("/")
    for suffix in API_SUFFIXES:
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    if _CONTROL.search(path) or " " in path:
        raise ConfigError(f"{raw!r} has a path with spaces or control characters.", example)
    netloc = f"[{host}]" if bracketed else host.lower()
    if port is not None:
        netloc += f":{port}"
    return f"{parts.scheme.lower()}://{netloc}{path}"


# --- model names ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteRef:
    """``@NAME/MODEL``: the remote and the model's id there (which may hold ``/`` itself)."""

    remote: str
    model: str

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.remote}/{self.model}"


def is_remote_model(name: str) -> bool:
    return name.startswith(PREFIX)


def parse_remote_model(name: str) -> RemoteRef:
    """``@NAME/MODEL`` split; a ConfigError when it is not that shape."""
    remote, slash, model = name[len(PREFIX) :].partition("/")
    if not is_remote_model(name) or not slash or not model or plain_name_problem(remote, MAX_NAME):
        raise ConfigError(
            f"{name!r} is not a remote model name.",
            "Remote models are named @REMOTE/MODEL; see `lemon-desk models`.",
        )
    return RemoteRef(remote, model)


# --- what a remote sends ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteModelInfo:
    """One model as its remote listed it."""

    id: str
    recipe: str = ""  # "" when the remote does not say (plain OpenAI servers)
    size_bytes: int = 0
    labels: tuple[str, ...] = ()
    checkpoint: str = ""
    loaded: bool = False  # the remote says it is loaded there now


def model_id_problem(value: object) -> str | None:
    if not isinstance(value, str) or not value:
        return "is empty or not text"
    if len(value) > MAX_MODEL_ID:
        return f"is longer than {MAX_MODEL_ID} characters"
    if _CONTROL.search(value):
        return "holds a control character"
    return None


def _text(value: Any, limit: int = 200) -> str:
    return value[:limit] if isinstance(value, str) and not _CONTROL.search(value[:limit]) else ""


def _size_bytes(value: Any) -> int:
    """Lemon Desk and Lemonade give ``size`` in GB."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e5:
        return 0
    return int(value * GB)


def parse_model_list(payload: Any, loaded: frozenset[str] = frozenset()) -> tuple[RemoteModelInfo, ...]:
    """The models of a ``GET /v1/models`` answer (``{"data": [{"id": ...}, ...]}``), checked entry by
    entry; entries that are not usable are left out. ``loaded``: the ids the remote's health names.
    A payload that is not such a list at all is a ValueError."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("no 'data' list")
    models: dict[str, RemoteModelInfo] = {}
    for entry in data[: MAX_MODELS * 2]:
        if not isinstance(entry, dict):
            continue
        model_id = entry.get("id")
        if model_id_problem(model_id) or not isinstance(model_id, str) or is_remote_model(model_id):
            continue
        labels = entry.get("labels")
        models[model_id] = RemoteModelInfo(
            id=model_id,
            recipe=_text(entry.get("recipe"), 40),
            size_bytes=_size_bytes(entry.get("size")),
            labels=tuple(_text(label, 40) for label in labels[:20] if _text(label, 40))
            if isinstance(labels, list)
            else (),
            checkpoint=_text(entry.get("checkpoint"), 400),
            loaded=model_id in loaded or entry.get("status") == "loaded",
        )
        if len(models) >= MAX_MODELS:
            break
    return tuple(models.values())


def loaded_models(health: Any) -> frozenset[str]:
    """The model ids a Lemonade-style ``GET /api/v1/health`` names as loaded."""
    entries = health.get("all_models_loaded") if isinstance(health, dict) else None
    if not isinstance(entries, list):
        return frozenset()
    names = (e.get("model_name") for e in entries if isinstance(e, dict))
    return frozenset(n for n in names if isinstance(n, str) and not model_id_problem(n))


# --- a remote model's status ------------------------------------------------------------------------


class RemoteModelStatus(Enum):
    CHECKING = "checking"  # its remote was not asked yet
    LOADED = "loaded"  # its remote says it is loaded there
    AVAILABLE = "available"  # its remote serves it; it loads there on the first request
    UNREACHABLE = "unreachable"  # its remote does not answer: the model list is the last one seen
    REFUSED = "key refused"  # its remote refused the key


_FROM_STATE = {
    RemoteState.UNKNOWN: RemoteModelStatus.CHECKING,
    RemoteState.UNREACHABLE: RemoteModelStatus.UNREACHABLE,
    RemoteState.REFUSED: RemoteModelStatus.REFUSED,
}


def remote_model_status(state: RemoteState, loaded: bool) -> RemoteModelStatus:
    """The remote's state wins; a reachable remote's model is loaded there or available."""
    if state is RemoteState.REACHABLE:
        return RemoteModelStatus.LOADED if loaded else RemoteModelStatus.AVAILABLE
    return _FROM_STATE[state]
