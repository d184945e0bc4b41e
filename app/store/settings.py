"""The app's settings: one validated model with a schema version, stored atomically as JSON.

A corrupt settings file is set aside (never deleted) and reported; the app starts on defaults.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from app.core.policy import parse_caps
from app.core.rpc import parse_workers
from app.store.files import atomic_write_json, read_json, set_aside
from app.store.kvcache import DEFAULT_BUDGET_GB
from app.store.paths import home

SCHEMA = 1
# What the Settings dialog accepts, in seconds: below the minimum a model or a reply could never finish.
LOAD_TIMEOUT_RANGE_S = (10, 7200)
REQUEST_TIMEOUT_RANGE_S = (10, 3600)
TOOL_TIMEOUT_RANGE_S = (1, 3600)


@dataclass
class Settings:
    llama_server_path: str = ""  # a llama-server binary of the user's, for the `system` backend
    release_mirror: str = ""  # stands in for https://github.com in release downloads
    models_dir: str = ""  # Hugging Face cache folder; empty means HF_HUB_CACHE / HF_HOME / default
    max_loaded_models: int | dict[str, int] = 1  # a total, or per-device caps (app.core.policy)
    idle_unload_minutes: int = 0  # 0: never
    keep_in_tray: bool = True
    load_timeout_s: float = 600.0
    request_timeout_s: float = 300.0
    hang_grace_s: float = 90.0
    api_enabled: bool = True  # the window serves the local API (OpenAI- and Lemonade-compatible)
    api_port: int = 13305  # on 127.0.0.1; 0: any free port
    ollama_port: int = 0  # the local API on this port too, for Ollama's clients (its own: 11434); 0: off
    rpc_workers: str = ""  # llama.cpp RPC workers every llama.cpp load uses ("host:port,..."; empty: none)
    worker_enabled: bool = False  # the window runs an RPC worker (``lemon-desk worker``) for other machines
    worker_host: str = "127.0.0.1"  # another address needs worker_allow_network: the protocol is open
    worker_port: int = 50052
    worker_allow_network: bool = False
    kv_cache_budget_gb: float = DEFAULT_BUDGET_GB  # disk for conversations' saved KV caches (0: none kept)
    tool_rounds: int = 8  # MCP tool rounds one reply may take before it must answer
    tool_timeout_s: float = (
        60.0  # per MCP tool call; one that takes longer goes back to the model as an error
    )


@dataclass(frozen=True)
class LoadedSettings:
    settings: Settings
    warning: str = ""  # what went wrong reading the file, for the user


def llama_server_problem(path: str) -> str:
    """What is wrong with a configured llama-server path, or "" (empty means: look on PATH)."""
    if not path:
        return ""
    binary = Path(path).expanduser()
    if not binary.is_absolute():
        return "The llama-server path must be a full path (or empty to look on PATH)."
    if not binary.is_file():
        return f"There is no file at {binary}."
    if not os.access(binary, os.X_OK):
        return f"{binary} is not executable."
    return ""


def settings_path() -> Path:
    return home() / "settings.json"


def _from_json(data: Any) -> Settings:
    if not isinstance(data, dict):
        raise ValueError("not an object")
    defaults = Settings()
    values: dict[str, Any] = {}
    for f in fields(Settings):
        if f.name in data:
            value, default = data[f.name], getattr(defaults, f.name)
            if f.name == "max_loaded_models":
                values[f.name] = parse_caps(value).to_json()
                continue
            if f.name == "rpc_workers" and isinstance(value, str):
                parse_workers(value)  # a bad list is refused here, not at the next load
            # ints are accepted where floats are expected; nothing else changes type.
            if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if type(value) is not type(default):
                raise ValueError(f"'{f.name}' has the wrong type")
            if f.name == "ollama_port" and not 0 <= value <= 65535:
                raise ValueError(f"'{f.name}' must be a port number, or 0 for none")
            if f.name == "kv_cache_budget_gb" and not 0 <= value < float("inf"):
                raise ValueError(f"'{f.name}' must be a number of GB, 0 or more")
            if f.name in ("tool_rounds", "tool_timeout_s") and not 0 < value < float("inf"):
                raise ValueError(f"'{f.name}' must be more than 0")
            values[f.name] = value
    return Settings(**values)


def load_settings(path: Path | None = None) -> LoadedSettings:
    path = path or settings_path()
    if not path.exists():
        return LoadedSettings(Settings())
    try:
        return LoadedSettings(_from_json(read_json(path)))
    except (OSError, ValueError, ConfigError) as err:
        backup = set_aside(path)
        return LoadedSettings(
            Settings(), f"Settings file was unreadable ({err}); kept it as {backup.name} and used defaults."
        )


def save_settings(settings: Settings, path: Path | None = None) -> None:
    atomic_write_json(path or settings_path(), {"schema": SCHEMA, **asdict(settings)})
