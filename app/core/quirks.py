"""Model quirks as data (``resources/quirks.json``): labels to strip and engine arguments to refuse for
models whose GGUF architecture matches, e.g. GLM-4 GGUFs cannot run llama.cpp's MTP speculative
decoding (the seed's rule). Pure: the store reads the file, launch and the labels apply it.

    {"schema": 1, "quirks": [{"id", "recipe", "architecture_contains", "strip_labels": [...],
                              "refuse_args": {"--flag": ["value", ...]}, "why"}]}

``refuse_args`` maps a flag to the values refused (an empty list refuses the flag with any value).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.core.errors import ConfigError


@dataclass(frozen=True)
class Quirk:
    id: str
    recipe: str
    architecture_contains: str
    strip_labels: tuple[str, ...] = ()
    refuse_args: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (flag, refused values; () = any)
    why: str = ""

    def applies(self, recipe: str, architecture: str) -> bool:
        return (
            recipe == self.recipe
            and bool(architecture)
            and self.architecture_contains in architecture.lower()
        )


def parse_quirks(data: Any) -> tuple[Quirk, ...]:
    if not isinstance(data, dict) or not isinstance(data.get("quirks"), list):
        raise ConfigError("The quirks file must be an object with a 'quirks' list.")
    out = []
    for i, raw in enumerate(data["quirks"]):
        try:
            refuse = raw.get("refuse_args", {})
            quirk = Quirk(
                id=str(raw["id"]),
                recipe=str(raw["recipe"]),
                architecture_contains=str(raw["architecture_contains"]).lower(),
                strip_labels=tuple(str(x) for x in raw.get("strip_labels", [])),
                refuse_args=tuple((str(k), tuple(str(v) for v in vs)) for k, vs in refuse.items()),
                why=str(raw.get("why", "")),
            )
        except (KeyError, TypeError, AttributeError) as err:
            raise ConfigError(f"Quirk {i} in the quirks file is malformed ({err}).") from None
        if not quirk.architecture_contains:
            raise ConfigError(f"Quirk {quirk.id} matches every architecture: give architecture_contains.")
        out.append(quirk)
    return tuple(out)


def applicable(quirks: Sequence[Quirk], recipe: str, architecture: str) -> list[Quirk]:
    return [q for q in quirks if q.applies(recipe, architecture)]


def effective_labels(
    labels: Sequence[str], quirks: Sequence[Quirk], recipe: str, architecture: str
) -> tuple[str, ...]:
    """A model's labels less those its quirks strip (GLM-4 GGUF: no ``mtp``)."""
    strip = {label for q in applicable(quirks, recipe, architecture) for label in q.strip_labels}
    return tuple(label for label in labels if label not in strip)


def check_quirk_args(args: Sequence[str], quirks: Sequence[Quirk], recipe: str, architecture: str) -> None:
    """Refuse engine arguments a quirk of this model forbids, saying which model rule and why."""
    for quirk in applicable(quirks, recipe, architecture):
        for flag, values in quirk.refuse_args:
            for i, arg in enumerate(args):
                name, eq, inline = arg.partition("=")
                if name != flag:
                    continue
                value = inline if eq else (args[i + 1] if i + 1 < len(args) else "")
                if not values or value in values:
                    shown = f"{flag} {value}".strip()
                    raise ConfigError(
                        f"{shown} cannot be used with this {architecture} model: {quirk.why or quirk.id}.",
                        f"Remove {shown} from the extra engine arguments.",
                    )
