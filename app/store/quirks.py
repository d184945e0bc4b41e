"""The model quirk table shipped in ``resources/quirks.json`` (rules: ``app.core.quirks``)."""

from __future__ import annotations

import functools
import json

from app.core.errors import ConfigError
from app.core.quirks import Quirk, parse_quirks
from app.store.paths import resource


@functools.cache
def load_quirks() -> tuple[Quirk, ...]:
    path = resource("quirks.json")
    try:
        return parse_quirks(json.loads(path.read_text()))
    except OSError as err:
        raise ConfigError(f"Cannot read the quirks file {path}: {err.strerror}.") from None
    except ValueError as err:
        raise ConfigError(f"The quirks file {path} is not valid JSON ({err}).") from None
