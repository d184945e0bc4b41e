"""Options saved per model (its recipe options and sampling defaults), in ``<home>/model_options.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "models"


@dataclass(frozen=True)
class ModelOptions:
    backend: str | None = None  # None: Auto, the best backend installed here
    ctx_size: int | None = None  # None: the engine's default
    args: str = ""  # extra engine arguments, as typed
    temperature: float | None = None  # sampling defaults; None: the chat pane's own
    top_p: float | None = None
    max_tokens: int | None = None
    pinned: bool = False  # never evicted to make room, never unloaded when idle
    rpc: str = ""  # llama.cpp RPC workers "host:port,..."; "": the Settings' list; "local": none


def _parse(name: str, raw: Any) -> ModelOptions:
    if not isinstance(raw, dict):
        raise ConfigError(f"the options of {name} are not an object")
    known = {f.name for f in fields(ModelOptions)}
    try:
        return ModelOptions(**{k: v for k, v in raw.items() if k in known})
    except TypeError as err:
        raise ConfigError(f"the options of {name} are malformed: {err}") from None


def model_options_path() -> Path:
    return home() / "model_options.json"


def load_model_options(path: Path | None = None) -> Loaded[ModelOptions]:
    return load_records(path or model_options_path(), KEY, _parse, "model options")


def save_model_options(options: dict[str, ModelOptions], path: Path | None = None) -> None:
    save_records(path or model_options_path(), KEY, {name: asdict(o) for name, o in options.items()})
