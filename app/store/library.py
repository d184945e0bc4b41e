"""The model library: catalog and user models, what the cache holds of them, and the operations on them
(resolve a name or reference, import a local model, remove a model's files). The router owns one, which
front ends reach through ``router.catalog`` (the CLI's model commands that start no engine make their
own); the downloads themselves are ``app.supervisor.downloads``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core.downloads import DownloadRecord
from app.core.errors import ModelError
from app.core.models import Model, catalog_from_json
from app.core.names import USER_PREFIX, in_user_namespace, model_name_from, model_name_problem
from app.core.refs import (
    GGUF_RECIPE,
    MLX_RECIPE,
    FileSet,
    HubRef,
    missing_shards,
    parse_ref,
    select,
    shard_set,
)
from app.core.units import GB
from app.store.catalog import load_catalog_json
from app.store.downloads import download_in_progress, load_downloads, recovered, save_downloads
from app.store.files import read_json
from app.store.hfcache import RepoCache, hub_cache_dir
from app.store.model_paths import local_gguf_metadata, model_for_path
from app.store.saving import saving
from app.store.settings import Settings
from app.store.usermodels import load_user_models, save_user_models

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model")


@dataclass(frozen=True)
class LocalFiles:
    """Where a model's files are on this machine."""

    main: Path  # the GGUF to load (first shard), or the MLX folder
    mmproj: Path | None = None
    size: int = 0


@dataclass(frozen=True)
class ModelFiles:
    """What this machine holds of a model: its files, when all are here, and its last download. Its
    status is ``app.core.status``'s to derive."""

    model: Model
    local: LocalFiles | None
    download: DownloadRecord | None = None


def user_model_name(ref: HubRef) -> str:
    name = ref.repo_id.split("/", 1)[1]
    return f"{USER_PREFIX}{name}-{ref.variant}" if ref.variant else f"{USER_PREFIX}{name}"


def location_on_demand(settings: Settings) -> Callable[[Model], Path]:
    """``Library(settings).location`` that reads the library only when a model is located: install and
    info commands, which never load one, do not read (or set aside) the user models file."""
    return lambda model: Library(settings).location(model)


class Library:
    def __init__(self, settings: Settings) -> None:
        self.cache_root = hub_cache_dir(settings.models_dir)
        self.catalog = catalog_from_json(load_catalog_json())
        loaded = load_user_models()
        self.user = loaded.items
        self.warnings = [loaded.warning] if loaded.warning else []

    def models(self) -> dict[str, Model]:
        return {**self.catalog, **self.user}

    def resolve(self, name_or_ref: str) -> Model:
        """A model by name, or by reference (a known model with that checkpoint, else a new user model)."""
        models = self.models()
        if name_or_ref in models:
            return models[name_or_ref]
        if "/" not in name_or_ref:
            raise ModelError(
                f"There is no model named '{name_or_ref}'.",
                "See `lemon-desk models`, or give a Hugging Face reference such as org/repo:VARIANT.",
            )
        ref = parse_ref(name_or_ref)
        for model in models.values():
            if model.checkpoint.lower() == str(ref).lower():
                return model
        recipe = GGUF_RECIPE if ref.variant else ""  # a bare repo's format is known once its files are
        return Model(user_model_name(ref), recipe, str(ref), user=True)

    def find(self, name: str) -> Model:
        """A model by local path (a .gguf file or MLX folder), name, or Hugging Face reference."""
        if not name.strip():
            raise ModelError(
                "A model name is needed.", "See `lemon-desk models`, or give a .gguf file or MLX folder."
            )
        if name.endswith(".gguf") or name.startswith(("/", "~", ".")) or Path(name).exists():
            return model_for_path(Path(name))
        return self.resolve(name)

    def location(self, model: Model) -> Path:
        """The GGUF to load or the MLX folder; ModelError, saying what to do, when it is not here."""
        local = self.local_files(model)
        if local is not None:
            return local.main
        if model.repo_id is None:
            raise ModelError(f"The files of {model.name} are missing: {model.checkpoint}.")
        raise ModelError(
            f"{model.name} ({model.checkpoint}) is not downloaded.",
            f"Download it first: lemon-desk pull {model.name}",
        )

    def define(self, model: Model) -> Model:
        """The model to register for a definition from outside (a Lemonade ``pull``): ``model`` itself
        when its name is new or names a user model with the same files (its labels then change); the
        catalog's entry when it repeats one. A name already defined with other files is refused:
        replacing it would orphan the files downloaded for it."""
        existing = self.models().get(model.name)
        if existing is None:
            return model
        differs = [
            f"{what} (here {ours!r}, asked {theirs!r})"
            for what, ours, theirs in (
                ("checkpoint", existing.checkpoint, model.checkpoint),
                ("recipe", existing.recipe, model.recipe),
                ("mmproj", existing.mmproj, model.mmproj),
            )
            # A recipe "" is known once downloaded; a projector not asked for keeps the one here.
            if ours != theirs and theirs is not None and not (what == "recipe" and not ours)
        ]
        if differs:
            raise ModelError(
                f"{model.name} is already registered with other files: {'; '.join(differs)}.",
                "Choose another name for this checkpoint, or delete the model first.",
            )
        if not existing.user:
            return existing
        return dataclasses.replace(existing, recipe=model.recipe or existing.recipe, labels=model.labels)

    def register(self, model: Model) -> None:
        if model.name in self.catalog:
            return
        self.user[model.name] = dataclasses.replace(model, user=True)
        with saving("the user models"):
            save_user_models(self.user)

    def unregister(self, name: str) -> None:
        if self.user.pop(name, None) is not None:
            with saving("the user models"):
                save_user_models(self.user)

    # -- what is on disk

    def repo_cache(self, model: Model) -> RepoCache | None:
        return RepoCache(self.cache_root, model.repo_id) if model.repo_id else None

    def cached_files(self, model: Model) -> FileSet | None:
        """The model's files as the cache holds them, when all of them are there."""
        cache = self.repo_cache(model)
        listing = cache.local_listing() if cache else None
        if cache is None or listing is None:
            return None
        try:
            files = select(listing, parse_ref(model.checkpoint), model.recipe or None, model.mmproj)
        except ModelError:
            return None
        if files.recipe == GGUF_RECIPE and missing_shards(files.files):
            return None
        if files.recipe == MLX_RECIPE and not _mlx_weights_complete(
            {f.path for f in files.files}, cache.find("model.safetensors.index.json")
        ):
            return None
        return files

    def local_files(self, model: Model) -> LocalFiles | None:
        if model.repo_id is None:
            path = Path(model.checkpoint).expanduser()
            return LocalFiles(path, size=int(model.size_gb * GB)) if path.exists() else None
        files = self.cached_files(model)
        cache = self.repo_cache(model)
        if files is None or cache is None:
            return None
        if files.recipe == MLX_RECIPE:
            config = cache.find("config.json")
            return LocalFiles(config.parent, size=files.size) if config else None
        main = cache.find(files.main or "")
        mmproj = cache.find(files.mmproj) if files.mmproj else None
        return LocalFiles(main, mmproj, files.size) if main else None

    def files(self, model: Model, downloads: dict[str, DownloadRecord] | None = None) -> ModelFiles:
        """Where the model's files are and its last download (``downloads``: this process's records,
        else the ones on disk; one left active by a process that is gone comes back paused)."""
        if downloads is None:
            downloads = self._downloads()
        record = downloads.get(model.checkpoint)
        if record is not None and model.repo_id is not None:
            record = recovered(record, self.cache_root)
        return ModelFiles(model, self.local_files(model), record)

    def all_files(self, downloads: dict[str, DownloadRecord] | None = None) -> list[ModelFiles]:
        records = self._downloads() if downloads is None else downloads
        return [self.files(m, records) for m in self.models().values()]

    def _downloads(self) -> dict[str, DownloadRecord]:
        loaded = load_downloads()
        if loaded.warning:
            self.warnings.append(loaded.warning)
        return loaded.items

    # -- remove and import

    def remove(self, name_or_ref: str) -> str:
        """Delete a model's files (never those another model uses); returns what was done, for people."""
        model = self.resolve(name_or_ref)
        if model.repo_id is None:
            self.unregister(model.name)
            return f"Removed {model.name} from the list; its files at {model.checkpoint} were left alone."
        if model.name not in self.models():
            raise ModelError(
                f"There is no model with the reference {name_or_ref}.", "See `lemon-desk models`."
            )
        cache = RepoCache(self.cache_root, model.repo_id)
        downloads = load_downloads().items
        record = downloads.pop(model.checkpoint, None)
        if record is not None:
            if download_in_progress(record.id):
                raise ModelError(
                    f"{model.name} is being downloaded.",
                    "Pause or cancel the download first, then remove it.",
                )
            cache.remove_partials(record.files.files)
            with saving("the downloads"):
                save_downloads(downloads)
        paths = self._paths(model) | ({f.path for f in record.files.files} if record else set())
        keep = {
            path
            for other in self.models().values()
            if other.name != model.name and other.repo_id == model.repo_id
            for path in self._paths(other)
        }
        if not paths and not model.user:
            raise ModelError(f"{model.name} is not downloaded: there is nothing to remove.")
        freed = cache.remove(paths, keep) if paths else 0
        if model.user:
            self.unregister(model.name)
        shared = len(paths & keep)
        note = f" ({shared} file(s) kept: other models use them)" if shared else ""
        return f"Removed {model.name}: freed {freed / GB:.2f} GB{note}."

    def _paths(self, model: Model) -> set[str]:
        files = self.cached_files(model)
        return {f.path for f in files.files} if files else set()

    def import_path(self, path: Path, name: str | None = None) -> Model:
        """Register a local GGUF file or MLX folder as a user model named ``name`` (default: its file or
        folder name, made a model name), in the ``user.`` namespace as the local API names them."""
        if name is not None and (why := model_name_problem(name)):
            raise ModelError(f"{why}.", "Choose another name with --name.")
        path = path.expanduser().resolve()
        if not path.exists():
            raise ModelError(f"{path} does not exist.")
        if path.is_dir():
            recipe, size = MLX_RECIPE, _check_mlx_folder(path)
        else:
            recipe, (path, size) = GGUF_RECIPE, _check_gguf_file(path)
        name = in_user_namespace(name or model_name_from(path.stem if path.is_file() else path.name))
        if name in self.models():
            raise ModelError(f"A model named {name} exists already.", "Choose another name with --name.")
        model = Model(name, recipe, str(path), size_gb=round(size / GB, 3), user=True)
        self.register(model)
        return model


def _mlx_weights_complete(paths: set[str], index: Path | None) -> bool:
    """Every shard the weight index names is present (or there is no index and some weights are)."""
    if index is None or "model.safetensors.index.json" not in paths:
        return any(p.endswith(".safetensors") for p in paths)
    try:
        weight_map = read_json(index)["weight_map"]  # too deep a nesting is a ValueError too
        return bool(weight_map) and set(weight_map.values()) <= paths
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _check_gguf_file(path: Path) -> tuple[Path, int]:
    """The file to load (the first shard of a set) and the set's size; raises if it is no usable GGUF."""
    if path.suffix.lower() != ".gguf":
        raise ModelError(
            f"{path} is neither a .gguf file nor an MLX folder.", "Import a GGUF file or an MLX folder."
        )
    local_gguf_metadata(path)  # the magic, the version and the metadata must all read
    shards = shard_set(path.name, [p.name for p in path.parent.glob("*.gguf")])
    missing = missing_shards(shards)
    if missing:
        raise ModelError(f"{path.name} is one shard of a set that lacks {', '.join(missing)}.")
    return path.parent / shards[0], sum((path.parent / name).stat().st_size for name in shards)


def _check_mlx_folder(path: Path) -> int:
    try:
        config = read_json(path / "config.json")  # too deep a nesting is a ValueError too
    except OSError:
        raise ModelError(f"{path} has no config.json: it is not an MLX model folder.") from None
    except ValueError as err:
        raise ModelError(f"{path / 'config.json'} is not valid JSON ({err}).") from None
    if not isinstance(config, dict):
        raise ModelError(f"{path / 'config.json'} is not a JSON object.")
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise ModelError(f"{path} has no .safetensors weights: it is not an MLX model folder.")
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ModelError(f"{path} has no tokenizer (tokenizer.json or tokenizer.model).")
    names = {p.name for p in path.iterdir()}
    if not _mlx_weights_complete(names, path / "model.safetensors.index.json"):
        raise ModelError(f"{path} lacks weight shards that its model.safetensors.index.json names.")
    return sum(p.stat().st_size for p in weights)
