"""The loading policy: how many models may be loaded at once, and which one makes room for another.

``max_loaded_models`` is a whole number (a total) or per-device caps such as
``{"gpu": 1, "cpu": 2, "total": 3}``; an engine counts against the cap of the device its launch plan
computes on. To make room the least recently used unpinned model goes first, where "used" is its last
load or request. A load that only pinned models block is refused, naming them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import ConfigError, PolicyError
from app.core.lemon_mlx import DeviceType

DEVICE_KEYS = {d.value: d for d in DeviceType}
# How a user raises the limit, in the window's words (``lemon-desk serve`` names its flag instead).
RAISE_LIMIT = "raise the limit in Settings"

# Recovery of a process that dies (an engine, an RPC worker): started again after these delays, until
# it dies CRASH_LIMIT times within CRASH_WINDOW_S; a run this long restarts the backoff at its first step.
RESTART_BACKOFF_S = (1.0, 5.0, 30.0)  # before the 1st, 2nd, 3rd+ restart in a row
CRASH_WINDOW_S = 300.0
CRASH_LIMIT = 3
STABLE_S = 300.0


def restart_delay(streak: int, steps: Sequence[float] = RESTART_BACKOFF_S) -> float:
    """The wait before a restart, after ``streak`` restarts in a row."""
    return steps[min(streak, len(steps) - 1)]


@dataclass(frozen=True)
class Caps:
    """How many engines may run: in all, and per device (None: no cap of its own)."""

    total: int | None = 1
    per_device: tuple[tuple[DeviceType, int], ...] = ()

    def cap(self, device: DeviceType) -> int | None:
        return dict(self.per_device).get(device)

    def describe(self) -> str:
        parts = [f"{d.value} {n}" for d, n in self.per_device]
        if self.total is not None:
            parts.append(f"total {self.total}")
        return ", ".join(parts)

    def to_json(self) -> int | dict[str, int]:
        if not self.per_device and self.total is not None:
            return self.total
        data = {d.value: n for d, n in self.per_device}
        if self.total is not None:
            data["total"] = self.total
        return data


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"max_loaded_models: {what} must be a whole number of at least 1, not {value!r}.")
    return value


def parse_caps(value: Any) -> Caps:
    """A whole number, a mapping of caps, or either as JSON text (the command line's form)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise ConfigError(
                f"max_loaded_models: {value[:80]!r} is neither a number nor JSON.",
                'Write a number such as 2, or caps such as {"gpu": 1, "cpu": 2, "total": 3}.',
            ) from None
    if isinstance(value, dict):
        unknown = sorted(set(value) - {*DEVICE_KEYS, "total"})
        if unknown or not value:
            raise ConfigError(
                f"max_loaded_models: unknown key(s) {', '.join(map(repr, unknown)) or '(none given)'}.",
                'The keys are "gpu", "cpu" and "total".',
            )
        per_device = tuple((DEVICE_KEYS[k], _count(v, k)) for k, v in value.items() if k in DEVICE_KEYS)
        total = _count(value["total"], "total") if "total" in value else None
        return Caps(total, per_device)
    return Caps(_count(value, "the total"))


@dataclass(frozen=True)
class LoadedModel:
    name: str
    device: DeviceType
    pinned: bool
    last_used: float  # monotonic time of its last load or request


def _breach(
    models: Sequence[LoadedModel], caps: Caps, incoming: DeviceType | None = None
) -> list[LoadedModel] | None:
    """The models counted against the first cap that ``models`` (plus one on ``incoming``) break."""
    extra = 0 if incoming is None else 1
    devices = [incoming] if incoming is not None else [d for d, _ in caps.per_device]
    for device in devices:
        cap = caps.cap(device)
        on_device = [m for m in models if m.device is device]
        if cap is not None and len(on_device) + extra > cap:
            return on_device
    if caps.total is not None and len(models) + extra > caps.total:
        return list(models)
    return None


def plan_evictions(
    loaded: Sequence[LoadedModel], name: str, device: DeviceType, caps: Caps, raise_limit: str = RAISE_LIMIT
) -> list[str]:
    """The models to unload, least recently used first, so that ``name`` may load on ``device``.

    ``name`` itself is not counted (it is reloaded in place). Raises PolicyError when pinned models
    alone stand in the way, its hint ending with ``raise_limit``.
    """
    staying = sorted((m for m in loaded if m.name != name), key=lambda m: m.last_used)
    evict: list[str] = []
    while (counted := _breach(staying, caps, device)) is not None:
        victim = next((m for m in counted if not m.pinned), None)
        if victim is None:
            pinned = ", ".join(m.name for m in counted)
            raise PolicyError(
                f"{name} cannot load: the limit of loaded models ({caps.describe()}) is reached and the "
                f"models in the way are pinned: {pinned}.",
                f"Unpin or unload one of them, or {raise_limit}.",
                pinned=tuple(m.name for m in counted),
            )
        staying.remove(victim)
        evict.append(victim.name)
    return evict


def over_caps(loaded: Sequence[LoadedModel], caps: Caps) -> list[str]:
    """After the caps were lowered: the unpinned models to unload, least recently used first, until the
    rest is within them (pinned models stay, even over a cap)."""
    staying = sorted(loaded, key=lambda m: m.last_used)
    evict: list[str] = []
    while (counted := _breach(staying, caps)) is not None:
        victim = next((m for m in counted if not m.pinned), None)
        if victim is None:
            break
        staying.remove(victim)
        evict.append(victim.name)
    return evict
