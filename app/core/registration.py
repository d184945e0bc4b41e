"""A user model defined by Lemonade's registration fields, as ``POST pull`` and ``POST models/register``
take them, checked where it enters: each refusal is a ConfigError that names the field.

    model_name    user.NAME: Lemonade's namespace and the name alphabet (``app.core.names``)
    recipe        llamacpp or lemon-mlx
    checkpoint    org/repo[:VARIANT] on the Hub (or ``checkpoints.main``)
    checkpoints   {"main": ..., "mmproj": "org/repo:FILE"}; a model's files come from one repo
    mmproj        llamacpp: the vision projector's FILE in the checkpoint's repo
    reasoning, vision, embedding, reranking   true adds the label (``embeddings`` for ``embedding``)
    labels        more labels
    source        huggingface (the one registry the app downloads from)

Labels follow Lemonade's deployment rule: a model is served in one mode (``chat``, ``embeddings``,
``reranking``, ...), one its recipe serves; naming a mode the recipe does not serve, or two modes, is
refused. No mode named means chat.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from app.core.backends import RECIPES
from app.core.errors import ConfigError, ModelError
from app.core.models import Model
from app.core.names import USER_PREFIX, model_name_problem, path_problem
from app.core.refs import GGUF_RECIPE, parse_ref

# The fields whose presence makes a pull define a model rather than name one (as in Lemonade).
DEFINING_FIELDS = ("recipe", "checkpoint", "checkpoints")
FLAG_LABELS = {
    "reasoning": "reasoning",
    "vision": "vision",
    "embedding": "embeddings",
    "reranking": "reranking",
}
LABEL = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
MAX_LABELS = 32
# Lemonade's deployment modes (the endpoint a model answers), with the spellings it also accepts.
MODES = frozenset(
    {
        "chat",
        "embeddings",
        "reranking",
        "transcription",
        "image",
        "tts",
        "audio-generation",
        "classification",
        "3d",
    }
)
MODE_SPELLINGS = {"embedding": "embeddings", "classifier": "classification"}
SERVED_MODES = {"llamacpp": ("chat", "embeddings", "reranking"), "lemon-mlx": ("chat",)}
SOURCES = ("huggingface", "hf")


def defines_model(body: Mapping[str, Any]) -> bool:
    """Whether a pull body defines a model (Lemonade registers it first) rather than naming one."""
    return any(body.get(field) is not None for field in DEFINING_FIELDS)


def _fail(field: str, what: str, hint: str = "") -> ConfigError:
    return ConfigError(f"'{field}' {what}.", hint)


def _string(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(field, "must be a non-empty string")
    return value


def _hub_ref(value: str, field: str) -> str:
    try:
        ref = parse_ref(value)
    except ModelError as err:
        raise _fail(field, f"is not a Hugging Face reference ({value!r})", err.hint) from None
    if ref.variant is not None and path_problem(ref.variant) is not None:
        raise _fail(field, f"has a variant that is not a file name or quant ({ref.variant!r})")
    return str(ref)


def _checkpoints(body: Mapping[str, Any]) -> tuple[str, str | None]:
    """The main checkpoint and the projector's file, from ``checkpoint``/``mmproj`` or ``checkpoints``."""
    main, mmproj = _string(body, "checkpoint"), _string(body, "mmproj")
    roles = body.get("checkpoints")
    if roles is not None:
        if not isinstance(roles, dict) or not all(isinstance(v, str) and v for v in roles.values()):
            raise _fail("checkpoints", "must be an object of role: checkpoint strings")
        other = sorted(set(roles) - {"main", "mmproj"})
        if other:
            raise _fail(
                "checkpoints",
                f"names {', '.join(map(repr, other))}, which Lemon Desk's recipes do not use",
                "Give 'main' and, for a vision model, 'mmproj'.",
            )
        if main is not None and roles.get("main", main) != main:
            raise _fail("checkpoints.main", "differs from 'checkpoint'", "Give the main checkpoint once.")
        main = main or roles.get("main")
        if "mmproj" in roles:
            if mmproj is not None:
                raise _fail("checkpoints.mmproj", "and 'mmproj' are both given", "Give the projector once.")
            repo, _, mmproj = _hub_ref(roles["mmproj"], "checkpoints.mmproj").partition(":")
            if main is not None and repo != main.partition(":")[0]:
                raise _fail(
                    "checkpoints.mmproj",
                    f"is in {repo}, not in the main checkpoint's repo",
                    "A model's files come from one repo here: pick a projector from that repo.",
                )
            if not mmproj:
                raise _fail("checkpoints.mmproj", "names no file", "Write it as org/repo:FILE.gguf.")
    if main is None:
        raise ConfigError(
            "'checkpoint' is required to register a model.",
            "Give the Hugging Face checkpoint, for example org/repo:Q4_K_M.",
        )
    main = _hub_ref(main, "checkpoint")
    if mmproj is not None and (path_problem(mmproj) is not None or not mmproj.lower().endswith(".gguf")):
        raise _fail("mmproj", f"is not a GGUF file in the checkpoint's repo ({mmproj!r})")
    return main, mmproj


def _labels(body: Mapping[str, Any], recipe: str, name: str) -> tuple[str, ...]:
    given = body.get("labels", [])
    if given is None:
        given = []
    if not isinstance(given, list) or len(given) > MAX_LABELS:
        raise _fail("labels", f"must be a list of at most {MAX_LABELS} labels")
    for label in given:
        if not isinstance(label, str) or not LABEL.fullmatch(label):
            raise _fail(
                "labels", f"holds {label!r}, which is not a label (lowercase letters, digits, '-', '_')"
            )
    labels: list[str] = [MODE_SPELLINGS.get(label, label) for label in map(str, given)]
    for flag, label in FLAG_LABELS.items():
        value = body.get(flag)
        if value is not None and not isinstance(value, bool):
            raise _fail(flag, "must be true or false")
        if value:
            labels.append(label)
    labels = list(dict.fromkeys(labels))  # once each, in the order given
    modes = [label for label in labels if label in MODES]
    served = SERVED_MODES[recipe]
    if len(modes) > 1:
        raise ConfigError(
            f"Model '{name}' would be served in two modes: {' and '.join(map(repr, modes))}.",
            "A model is served in one mode: register one model per mode.",
        )
    if modes and modes[0] not in served:
        raise ConfigError(
            f"Model '{name}': recipe '{recipe}' cannot serve '{modes[0]}'.",
            f"It serves {', '.join(map(repr, served))}; leave the label out to serve it as 'chat'.",
        )
    return tuple(labels)


def user_model_from_request(body: Mapping[str, Any], *, known: bool = False) -> Model:
    """The user model Lemonade's registration fields define; ConfigError naming the field otherwise.
    ``known``: the name is a model here already, which may be named with its own definition outside the
    user namespace (as Lemonade's export of a built-in model writes it)."""
    name = body.get("model_name")
    if name is None:
        raise ConfigError("'model_name' is required.")
    if why := model_name_problem(name):
        raise ConfigError(f"'model_name': {why}.")
    assert isinstance(name, str)
    if not name.startswith(USER_PREFIX) and not known:
        raise ConfigError(
            f"A model you register is named in the user namespace: '{name}' is not.",
            f"Name it {USER_PREFIX}{name}.",
        )
    recipe = _string(body, "recipe")
    if recipe is None:
        raise ConfigError("'recipe' is required to register a model.", f"One of: {', '.join(RECIPES)}.")
    if recipe not in RECIPES:
        raise _fail(
            "recipe", f"is {recipe!r}, a recipe Lemon Desk does not run", f"One of: {', '.join(RECIPES)}."
        )
    source = _string(body, "source")
    if source is not None and source.lower() not in SOURCES:
        raise _fail("source", f"is {source!r}", "Lemon Desk downloads from Hugging Face only.")
    checkpoint, mmproj = _checkpoints(body)
    if mmproj is not None and recipe != GGUF_RECIPE:
        raise _fail("mmproj", f"applies to {GGUF_RECIPE} models, not {recipe}")
    if recipe != GGUF_RECIPE and ":" in checkpoint:
        raise _fail(
            "checkpoint", f"names a variant, which {recipe} models do not have", "Give org/repo alone."
        )
    labels = _labels(body, recipe, name)
    return Model(name, recipe, checkpoint, labels, user=True, mmproj=mmproj)
