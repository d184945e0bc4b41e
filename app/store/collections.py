"""Collections: named sets of models with their recipe options, in ``<home>/collections.json``, and the
collection file that export and import exchange, in Lemonade's format.

Lemonade's collection file is an import-ready registration body: ``model_name`` (``user.NAME``),
``recipe`` (``collection.omni``), ``components`` (the members' names) and a ``models`` array that embeds
each member's own definition (``model_name``, ``recipe``, ``checkpoints.main``, ``labels``,
``recipe_options``, ``size`` in GB), so the file is self-contained. Recipe options use Lemonade's keys:
``ctx_size`` and ``<recipe>_backend`` / ``<recipe>_args`` (``llamacpp_*``, ``lemon_mlx_*``). What
Lemonade has no key for (sampling defaults, the pin) travels in a ``lemon_desk`` object beside them.

Stored collections are kept in that same format (one codec, one validator). A file read from outside
is validated field by field before anything from it is used: names in a small alphabet, known recipes,
checkpoints that are a Hub reference or an absolute local path, options of the right types, engine
arguments the app allows; anything else is refused with the field that is wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.core.backends import OPTION_PREFIX, RECIPES
from app.core.errors import ConfigError
from app.core.launch import check_user_args, split_args
from app.core.models import Model
from app.core.names import MODEL_NAME_RULE, USER_PREFIX, bare_model_name, model_name_problem, repo_id_problem
from app.store.files import atomic_write_json
from app.store.model_options import ModelOptions
from app.store.paths import home
from app.store.records import Loaded, load_records, save_records

KEY = "collections"
COLLECTION_RECIPE = "collection.omni"  # Lemonade's one collection recipe that its import takes
LABEL = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
BACKEND = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
VARIANT = re.compile(r"[A-Za-z0-9._/-]{1,200}")
MAX_MEMBERS = 64
MAX_FILE_BYTES = 1 << 20
EXTRA_KEYS = ("temperature", "top_p", "max_tokens", "pinned")  # ours, in the ``lemon_desk`` object


@dataclass(frozen=True)
class Member:
    model: Model
    options: ModelOptions


@dataclass(frozen=True)
class Collection:
    name: str  # without Lemonade's "user." prefix
    members: tuple[Member, ...]

    @property
    def model_names(self) -> list[str]:
        return [m.model.name for m in self.members]


# -- the Lemonade collection file ---------------------------------------------------------------------


def _recipe_options(recipe: str, options: ModelOptions) -> dict[str, Any]:
    prefix = OPTION_PREFIX[recipe]
    out: dict[str, Any] = {}
    if options.ctx_size is not None:
        out["ctx_size"] = options.ctx_size
    if options.backend is not None:
        out[f"{prefix}_backend"] = options.backend
    if options.args:
        out[f"{prefix}_args"] = options.args
    return out


def _extras(options: ModelOptions) -> dict[str, Any]:
    defaults = ModelOptions()
    return {k: getattr(options, k) for k in EXTRA_KEYS if getattr(options, k) != getattr(defaults, k)}


def collection_to_json(collection: Collection) -> dict[str, Any]:
    models = []
    for member in collection.members:
        model = member.model
        entry: dict[str, Any] = {
            "model_name": model.name,
            "recipe": model.recipe,
            "checkpoints": {"main": model.checkpoint},
            "labels": list(model.labels),
            "recipe_options": _recipe_options(model.recipe, member.options),
            "size": model.size_gb,
        }
        if extras := _extras(member.options):
            entry["lemon_desk"] = extras
        models.append(entry)
    return {
        "model_name": USER_PREFIX + collection.name,
        "recipe": COLLECTION_RECIPE,
        "checkpoints": {"main": ""},
        "components": collection.model_names,
        "models": models,
        "labels": [],
        "recipe_options": {},
    }


def _fail(where: str, what: str) -> ConfigError:
    return ConfigError(
        f"The collection is not valid: {where} {what}.",
        "Check the file (export it again from the app that made it); nothing was imported.",
    )


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "is not an object")
    return value


def _name(value: Any, where: str, *, strip_user: bool = False) -> str:
    if why := model_name_problem(value):
        raise _fail(where, why)
    assert isinstance(value, str)
    return bare_model_name(value) if strip_user else value


def _checkpoint(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(where, "is not a checkpoint")
    if value.startswith("/"):
        parts = Path(value).parts
        if ".." in parts or "\0" in value or len(value) > 4096:
            raise _fail(where, f"{value!r} is not a plain absolute path")
        return value
    repo, _, variant = value.partition(":")
    if why := repo_id_problem(repo):
        raise _fail(where, f"{value!r}: the repo {why}")
    if variant and (not VARIANT.fullmatch(variant) or ".." in variant.split("/")):
        raise _fail(where, f"{value!r} has an unusable variant")
    return value


def _int(value: Any, where: str) -> int | None:
    if value is None or value == -1:  # Lemonade's -1: automatic context size
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 1 << 24:
        raise _fail(where, "is not a whole number of tokens")
    return value


def _float(value: Any, where: str, high: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
        raise _fail(where, f"is not a number from 0 to {high:g}")
    if not math.isfinite(value):
        raise _fail(where, "is not a finite number")
    return float(value)


def _options(recipe: str, raw: Any, extras: Any, where: str) -> ModelOptions:
    options = _obj(raw, f"{where}.recipe_options")
    prefix = OPTION_PREFIX[recipe]
    backend = options.get(f"{prefix}_backend")
    if backend is not None and (not isinstance(backend, str) or not BACKEND.fullmatch(backend)):
        raise _fail(f"{where}.recipe_options.{prefix}_backend", f"{backend!r} is not a backend name")
    args = options.get(f"{prefix}_args", "")
    if not isinstance(args, str) or len(args) > 4096:
        raise _fail(f"{where}.recipe_options.{prefix}_args", "is not a string of engine arguments")
    check_user_args(recipe, backend or "", split_args(args))
    more = _obj(extras if extras is not None else {}, f"{where}.lemon_desk")
    unknown = sorted(set(more) - set(EXTRA_KEYS))
    if unknown:
        raise _fail(f"{where}.lemon_desk", f"has unknown keys {', '.join(map(repr, unknown))}")
    pinned = more.get("pinned", False)
    if not isinstance(pinned, bool):
        raise _fail(f"{where}.lemon_desk.pinned", "is not true or false")
    max_tokens = _int(more.get("max_tokens"), f"{where}.lemon_desk.max_tokens")
    return ModelOptions(
        backend=backend,
        ctx_size=_int(options.get("ctx_size"), f"{where}.recipe_options.ctx_size"),
        args=args,
        temperature=_float(more.get("temperature"), f"{where}.lemon_desk.temperature", 5.0),
        top_p=_float(more.get("top_p"), f"{where}.lemon_desk.top_p", 1.0),
        max_tokens=max_tokens,
        pinned=pinned,
    )


def _member(raw: Any, where: str) -> Member:
    entry = _obj(raw, where)
    name = _name(entry.get("model_name"), f"{where}.model_name")
    recipe = entry.get("recipe")
    if recipe not in RECIPES:
        raise _fail(f"{where}.recipe", f"{recipe!r} is not a recipe Lemon Desk runs ({', '.join(RECIPES)})")
    checkpoints = _obj(entry.get("checkpoints"), f"{where}.checkpoints")
    checkpoint = _checkpoint(checkpoints.get("main"), f"{where}.checkpoints.main")
    labels = entry.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) and LABEL.fullmatch(x) for x in labels):
        raise _fail(f"{where}.labels", "is not a list of labels")
    size = _float(entry.get("size", 0.0), f"{where}.size", 10_000.0) or 0.0
    options = _options(recipe, entry.get("recipe_options", {}), entry.get("lemon_desk"), where)
    model = Model(name, recipe, checkpoint, tuple(labels), size, user=True)
    return Member(model, options)


def collection_from_json(data: Any) -> Collection:
    """A collection from Lemonade's collection JSON, checked strictly; ConfigError names what is wrong."""
    top = _obj(data, "the file")
    name = _name(top.get("model_name"), "model_name", strip_user=True)
    recipe = top.get("recipe")
    if not isinstance(recipe, str) or not recipe.startswith("collection."):
        raise _fail("recipe", f"{recipe!r} is not a collection recipe (expected {COLLECTION_RECIPE!r})")
    components = top.get("components")
    if not isinstance(components, list) or not components or len(components) > MAX_MEMBERS:
        raise _fail("components", f"is not a list of 1 to {MAX_MEMBERS} model names")
    names = [_name(c, f"components[{i}]") for i, c in enumerate(components)]
    if len(set(names)) != len(names):
        raise _fail("components", "names a model twice")
    raw_models = top.get("models")
    if not isinstance(raw_models, list) or len(raw_models) > MAX_MEMBERS:
        raise _fail("models", "is not a list of model definitions")
    defined = {}
    for i, raw in enumerate(raw_models):
        member = _member(raw, f"models[{i}]")
        defined[member.model.name] = member
    missing = [n for n in names if n not in defined]
    if missing:
        raise _fail("models", f"has no definition of {', '.join(missing)}")
    return Collection(name, tuple(defined[n] for n in names))


def read_collection_file(path: Path) -> Collection:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path} is larger than {MAX_FILE_BYTES >> 20} MB: not a collection file.")
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"Cannot read {path}: {err.strerror}.") from None
    except (ValueError, RecursionError) as err:
        raise ConfigError(f"{path} is not a JSON file ({err}).") from None
    return collection_from_json(data)


def write_collection_file(collection: Collection, path: Path) -> None:
    """Write Lemonade's collection file at ``path``, in a folder that exists (none is made for it)."""
    if not path.parent.is_dir():
        raise ConfigError(
            f"Cannot write {path}: the folder {path.parent} does not exist.", "Choose a folder that exists."
        )
    try:
        atomic_write_json(path, collection_to_json(collection))
    except OSError as err:
        raise ConfigError(
            f"Cannot write {path}: {err.strerror}.", "Choose a folder you can write to."
        ) from None


# -- <home>/collections.json --------------------------------------------------------------------------


def collections_path() -> Path:
    return home() / "collections.json"


def _parse(name: str, raw: Any) -> Collection:
    collection = collection_from_json(raw)
    if collection.name != name:
        raise ConfigError(f"the collection stored as {name!r} calls itself {collection.name!r}")
    return collection


def load_collections(path: Path | None = None) -> Loaded[Collection]:
    return load_records(path or collections_path(), KEY, _parse, "collections")


def save_collections(collections: dict[str, Collection], path: Path | None = None) -> None:
    save_records(path or collections_path(), KEY, {n: collection_to_json(c) for n, c in collections.items()})


def check_collection_name(name: str) -> str:
    """A name the user typed for a collection (``user.`` is dropped, as Lemonade adds it)."""
    if model_name_problem(name):
        raise ConfigError(f"{name!r} cannot name a collection.", f"Use {MODEL_NAME_RULE}.")
    return bare_model_name(name)
