"""Recipe options in Lemonade's names, per recipe: ``ctx_size`` for both, ``llamacpp_backend`` /
``llamacpp_args`` for llamacpp and ``lemon_mlx_backend`` / ``lemon_mlx_args`` for lemon-mlx, mapped
to ``ModelOptions``. A ``ctx_size`` of -1 is Lemonade's "automatic" (our None); a backend of "" is Auto.

A request names an option with a value (use it), with null (its default: for a load, this load only,
the saved value stays; for ``POST models/{id}/options``, the saved value goes), or not at all (the saved
value). An option of the other recipe is refused, naming the one that applies.

``reasoning_format`` is an option of every model, the local API's own: where its answers put the
reasoning (``app.core.reasoning``), unless a request names it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from app.core.backends import OPTION_PREFIX
from app.core.launch import AUTO_CTX_SIZE, DEFAULT_CTX_SIZE, check_user_args, ctx_size_problem, split_args
from app.core.reasoning import ReasoningFormat, reasoning_format
from app.store.model_options import ModelOptions
from app.supervisor.api.bodies import optional
from app.supervisor.api.errors import bad_request

MAX_ARGS_CHARS = 4096
API_OPTIONS = {"reasoning_format": "reasoning_format"}  # every recipe's: name -> ModelOptions field


def option_keys(recipe: str) -> dict[str, str]:
    """The recipe's option names in Lemonade's API, each with its ``ModelOptions`` field."""
    prefix = OPTION_PREFIX.get(recipe, "llamacpp")
    return {"ctx_size": "ctx_size", f"{prefix}_backend": "backend", f"{prefix}_args": "args"}


def _other_recipes(recipe: str) -> dict[str, str]:
    """Option names of the recipes the model does not have, each with its recipe."""
    return {
        key: other
        for other in OPTION_PREFIX
        if other != recipe
        for key in option_keys(other)
        if key not in option_keys(recipe)
    }


def options_json(recipe: str, options: ModelOptions) -> dict[str, Any]:
    keys = {field: key for key, field in option_keys(recipe).items()}
    return {
        keys["ctx_size"]: options.ctx_size if options.ctx_size is not None else -1,
        keys["backend"]: options.backend or "",
        keys["args"]: options.args,
    }


def saved_json(recipe: str, options: ModelOptions) -> dict[str, Any]:
    """Only the options that differ from their defaults (what the user saved)."""
    defaults = options_json(recipe, ModelOptions())
    saved = {k: v for k, v in options_json(recipe, options).items() if v != defaults[k]}
    if options.reasoning_format:
        saved["reasoning_format"] = options.reasoning_format
    return saved


def resolved_ctx_size(recipe: str, options: ModelOptions) -> int | None:
    """The context a load would use now: the option, else llama-server's default here; lemon-mlx's
    automatic size is the engine's own (None)."""
    if options.ctx_size is not None:
        return options.ctx_size
    return DEFAULT_CTX_SIZE if recipe == "llamacpp" else None


def _value(body: dict[str, Any], key: str, field: str) -> Any:
    if field == "ctx_size":
        size = optional(body, key, "int")
        if why := ctx_size_problem(size):
            raise bad_request(f"'{key}' {why}.")
        return None if size == AUTO_CTX_SIZE else size
    value = optional(body, key, "str")
    if field == "reasoning_format":
        fmt = reasoning_format(value)
        if fmt is None:
            raise bad_request(f"'{key}' must be one of {', '.join(f.value for f in ReasoningFormat)}.")
        return "" if fmt is ReasoningFormat.SEPARATE else fmt.value
    if field == "backend":
        return value or None
    if len(value) > MAX_ARGS_CHARS:
        raise bad_request(f"'{key}' is longer than {MAX_ARGS_CHARS} characters.")
    return value


@dataclass(frozen=True)
class Requested:
    """The options a request names: with a value, and with null."""

    values: dict[str, Any]  # ModelOptions field -> value
    nulls: frozenset[str]  # ModelOptions fields named with null

    def apply(self, options: ModelOptions) -> ModelOptions:
        """``options`` with the values and with the nulls back at their defaults."""
        defaults = {f: getattr(ModelOptions(), f) for f in self.nulls}
        return dataclasses.replace(options, **defaults, **self.values)

    def keep(self, options: ModelOptions) -> ModelOptions:
        """``options`` with the values only: a null leaves what is there (a load's ``save_options``)."""
        return dataclasses.replace(options, **self.values)


def requested(
    recipe: str, body: dict[str, Any], saved: ModelOptions, allowed: frozenset[str] | None = None
) -> Requested:
    """The recipe options ``body`` names, checked (extra engine arguments against the backend they
    would run with). ``allowed``: the other keys the route takes; when given, any other key is refused
    (a load passes None: it ignores the options of recipes Lemon Desk does not run)."""
    keys = option_keys(recipe) | API_OPTIONS
    foreign = {key: other for key, other in _other_recipes(recipe).items() if key in body}
    if foreign:
        key, other = next(iter(foreign.items()))
        names = ", ".join(keys)
        raise bad_request(
            f"'{key}' is an option of {other} models; this one is a {recipe} model (its options: {names}).",
            "wrong_recipe_option",
        )
    if allowed is not None:
        unknown = sorted(set(body) - set(keys) - allowed)
        if unknown:
            raise bad_request(
                f"Unknown option(s) for a {recipe} model: {', '.join(unknown)} (known: {', '.join(keys)}).",
                "unknown_option",
            )
    values, nulls = {}, set()
    for key, field in keys.items():
        if key not in body:
            continue
        if body[key] is None:
            nulls.add(field)
        else:
            values[field] = _value(body, key, field)
    if "args" in values:  # a ConfigError naming the flag the app sets itself: a 400
        backend = values.get("backend", saved.backend)
        check_user_args(recipe, backend or "", split_args(values["args"]))
    return Requested(values, frozenset(nulls))
