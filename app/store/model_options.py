"""Options saved per model (its recipe options and sampling defaults), in ``<home>/model_options.json``.

The file is hand-editable: a value of the wrong type (or a model's entry that is no object) is left
out with a line in the log and the rest kept; a file that is not the shape at all is set aside.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.core.numbers import finite
from app.core.reasoning import reasoning_format
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "models"
log = logging.getLogger(__name__)


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
    reasoning_format: str = ""  # where the local API puts the reasoning (app.core.reasoning); "": separate


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 24


# Each field's check on a value read from the file, and what the value should be.
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "backend": (lambda v: v is None or isinstance(v, str), "a backend name"),
    "ctx_size": (lambda v: v is None or _count(v), "a number of tokens"),
    "args": (lambda v: isinstance(v, str), "a string of engine arguments"),
    "temperature": (lambda v: v is None or finite(v) is not None, "a number"),
    "top_p": (lambda v: v is None or finite(v) is not None, "a number"),
    "max_tokens": (lambda v: v is None or _count(v), "a number of tokens"),
    "pinned": (lambda v: isinstance(v, bool), "true or false"),
    "rpc": (lambda v: isinstance(v, str), "a list of workers as text"),
    "reasoning_format": (lambda v: v == "" or reasoning_format(v) is not None, "a reasoning format"),
}


def _parse(name: str, raw: Any) -> ModelOptions | None:
    if not isinstance(raw, dict):
        log.warning("Ignored the saved options of %s: not an object (%s).", name, type(raw).__name__)
        return None
    kept = {}
    for key, value in raw.items():
        check = _CHECKS.get(key)
        if check is None:  # a field of another version of the app
            continue
        valid, what = check
        if valid(value):
            kept[key] = value
        else:
            log.warning("Ignored the saved %s of %s: not %s (%s).", key, name, what, type(value).__name__)
    return ModelOptions(**kept)


def model_options_path() -> Path:
    return home() / "model_options.json"


def load_model_options(path: Path | None = None) -> Loaded[ModelOptions]:
    return load_records(path or model_options_path(), KEY, _parse, "model options")


def save_model_options(options: dict[str, ModelOptions], path: Path | None = None) -> None:
    save_records(path or model_options_path(), KEY, {name: asdict(o) for name, o in options.items()})
